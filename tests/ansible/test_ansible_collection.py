"""The Ansible content as the collection gpushare.fleet: built with `ansible-galaxy collection build` from the
package's own files, installed with `ansible-galaxy collection install` into a clean path, and its playbook run from
there (and only from there) against two fresh test hosts: they converge, and the rerun reports changed=0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from gpushare.core.paths import package_collection
from tests.ansible.controller import ENVIRONMENTS, Controller
from tests.ansible.testbed import HostSpec, Testbed

BIN = Path(sys.executable).parent
SOURCE = package_collection()


def galaxy(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "ansible-galaxy"), "collection", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(cwd / "none")})


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The collection built from the package's files and installed into an empty directory."""
    work = tmp_path_factory.mktemp("collection")
    built = galaxy("build", str(SOURCE), "--output-path", str(work / "dist"), cwd=work)
    assert built.returncode == 0, built.stdout + built.stderr
    (tarball,) = (work / "dist").glob("gpushare-fleet-*.tar.gz")
    assert tarball.name == f"gpushare-fleet-{version('gpushare')}.tar.gz"  # released with the package
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
    assert not [n for n in names if "__pycache__" in n]
    done = galaxy("install", str(tarball), "-p", str(work / "collections"), cwd=work)
    assert done.returncode == 0, done.stdout + done.stderr
    return work / "collections"


def test_the_built_collection_holds_the_package_s_files_as_they_are(installed: Path) -> None:
    root = installed / "ansible_collections" / "gpushare" / "fleet"
    manifest = json.loads((root / "MANIFEST.json").read_text())
    assert manifest["collection_info"]["namespace"] == "gpushare" and manifest["collection_info"]["name"] == "fleet"
    assert yaml.safe_load((SOURCE / "galaxy.yml").read_text())["version"] == version("gpushare")
    source = {p.relative_to(SOURCE) for p in SOURCE.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    copied = {p.relative_to(root) for p in root.rglob("*") if p.is_file()} - {Path("MANIFEST.json"),
                                                                              Path("FILES.json")}
    assert copied == source - {Path("galaxy.yml")}
    for rel in source - {Path("galaxy.yml")}:
        assert (root / rel).read_bytes() == (SOURCE / rel).read_bytes(), rel
    for part in ("plugins/modules/kube_node.py", "plugins/inventory/gpushare_fleet.py", "roles/mig/tasks/main.yml",
                 "playbooks/site.yml", "meta/runtime.yml"):
        assert (root / part).is_file(), part


def test_ansible_doc_finds_the_modules_and_the_inventory_plugin_by_their_names(installed: Path) -> None:
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(installed), "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "False"}
    listed = subprocess.run([str(BIN / "ansible-doc"), "-l", "gpushare.fleet", "--json"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0, listed.stderr
    assert set(json.loads(listed.stdout)) == {f"gpushare.fleet.{m}" for m in (
        "apt_source", "cdi_spec", "containerd_runtime", "dcgm_diag", "gpu_facts", "gpushare_state", "host_read",
        "kube_node", "role_arguments")}
    plugin = subprocess.run([str(BIN / "ansible-doc"), "-t", "inventory", "gpushare.fleet.gpushare_fleet"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert plugin.returncode == 0 and str(installed) in plugin.stdout, plugin.stdout + plugin.stderr


HOSTS = {"a100-inference": HostSpec("co-a100-01", "NVIDIA A100-SXM4-80GB", 8, nvswitch=True),
         "l4-notebooks": HostSpec("co-l4-01", "NVIDIA L4", 4)}


@pytest.fixture(scope="module")
def bed() -> Iterator[Testbed]:
    if os.geteuid() != 0:
        pytest.skip("the Ansible tests boot test hosts with systemd-nspawn in network namespaces: run as root")
    with Testbed(list(HOSTS.values()), tag="collection") as testbed:
        yield testbed


def two_host_environment(bed: Testbed, directory: Path, hosts: dict[str, HostSpec] = HOSTS) -> Path:
    """The testbed environment's A100 and L4 pools, one host each (`hosts`, by pool) at the address it got."""
    data = yaml.safe_load((ENVIRONMENTS / "testbed.yaml").read_text())
    data["pools"] = [p for p in data["pools"] if p["name"] in hosts]
    for pool in data["pools"]:
        spec = hosts[pool["name"]]
        pool["hosts"] = [{"name": spec.name, "address": bed.host(spec.name).address, "gpu_count": spec.gpu_count,
                          "nvswitch": spec.nvswitch}]
    data["tenants"] = [t for t in data["tenants"]
                       if set(t["quota"]) <= {"nvidia.com/mig-3g.40gb", "nvidia.com/gpu.shared"}]
    env_dir = directory / "environments"
    (env_dir / "group_vars").mkdir(parents=True)
    (env_dir / "group_vars" / "all.yml").write_text((ENVIRONMENTS / "group_vars" / "all.yml").read_text())
    path = env_dir / "testbed.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.ansible
@pytest.mark.slow
def test_the_installed_collection_converges_hosts_and_reruns_with_no_change(
        installed: Path, bed: Testbed, tmp_path: Path) -> None:
    env_file = two_host_environment(bed, tmp_path)
    ctl = Controller(tmp_path / "controller", bed.hosts[0].key)
    ctl.seed_nodes({h.name: {"kubernetes.io/hostname": h.name} for h in bed.hosts})
    # Only the installed copy: the checkout's own collection (ansible.cfg's collections_path) is overridden.
    only_installed = {"ANSIBLE_COLLECTIONS_PATH": str(installed), "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "False"}
    site = str(installed / "ansible_collections" / "gpushare" / "fleet" / "playbooks" / "site.yml")
    first = ctl.run(site, env_file, label="collection-first", env=only_installed)
    again = ctl.run(site, env_file, label="collection-rerun", env=only_installed)
    for run in (first, again):
        assert run.rc == 0, run.summary()
        paths = {ev["event_data"].get("task_path", "") for ev in run.events if ev.get("event") == "runner_on_ok"}
        assert paths - {""} and all(p.startswith(str(installed)) for p in paths - {""}), paths
    assert all(first.changed(h.name) > 0 for h in bed.hosts), first.summary()
    for host in bed.hosts:
        assert again.changed(host.name) == 0, (host.name, again.changed_tasks(host.name))
