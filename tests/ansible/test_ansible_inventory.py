"""The inventory plugin: environment files are inventories, recognised by path, with the resolved fleet as vars."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.resolve import resolve, resolve_env
from gpushare.ops.inventory import IGNORED_NODE_LABELS, build_inventory, group_name, is_environment_file
from gpushare.render.fleet import parse_mig_parted, render_fleet
from tests.ansible.controller import ENVIRONMENTS
from tests.ansible.testbed import ROOT

ANSIBLE_BIN = Path(sys.executable).parent


def ansible_inventory(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([str(ANSIBLE_BIN / "ansible-inventory"), *args], cwd=cwd, capture_output=True, text=True,
                          env={"PATH": f"{ANSIBLE_BIN}:/usr/bin:/bin", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
                               "HOME": str(Path.home())})


def plain(value):
    """ansible-inventory marks values from inventory sources as unsafe (not templated); the tests compare data."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def test_graph_shows_pools_of_bare_metal_hosts_only() -> None:
    result = ansible_inventory("-i", "environments/pilot.yaml", "--graph")
    assert result.returncode == 0, result.stderr
    graph = result.stdout
    for pool in ("a100_inference", "h100_llm_serving", "h100_training", "l40s_notebooks"):
        assert f"@pool_{pool}:" in graph
    assert "@env_pilot:" in graph and "@cluster_pilot_metal:" in graph
    assert "gke" not in graph  # the GKE pool belongs to Pulumi


def test_hostvars_come_from_the_resolved_fleet_and_the_rendered_files() -> None:
    result = ansible_inventory("-i", "environments/pilot.yaml", "--list")
    assert result.returncode == 0, result.stderr
    data = plain(json.loads(result.stdout))
    hostvars = data["_meta"]["hostvars"]
    fleet = resolve_env("pilot")
    files = render_fleet(fleet).files
    ansible_nodes = [n for n in fleet.nodes if n.managed_by == "ansible"]
    assert sorted(hostvars) == sorted(n.name for n in ansible_nodes)
    for node in ansible_nodes:
        hv = hostvars[node.name]
        assert hv["ansible_host"] == node.address
        assert hv["gpushare_gpu_model"] == node.gpu_model.name
        assert hv["gpushare_driver_branch"] == node.driver_branch
        assert hv["gpushare_toolkit_version"] == node.toolkit_version
        assert hv["gpushare_mig_config"] == node.mig_config
        assert hv["gpushare_device_plugin_config"] == node.device_plugin_config
        assert hv["gpushare_device_plugin_config_content"] == files[f"device-plugin/{node.device_plugin_config}.yaml"]
        assert hv["gpushare_node_labels"] == node.labels_owned_by("ansible")
        assert set(hv["gpushare_node_labels"]) <= {"nvidia.com/device-plugin.config", "gpushare.io/mig-config",
                                                   "gpushare.io/mig-config.state", "gpushare.io/toolkit-version"}
        assert hv["gpushare_node_labels"]["gpushare.io/toolkit-version"] == node.toolkit_version
        # The host's mig-parted file holds its own config (and all-disabled), as `gpushare render` writes it.
        if node.mig_config is None:  # a GPU without MIG
            assert hv["gpushare_mig_parted_config"] is None
            continue
        parsed = parse_mig_parted(hv["gpushare_mig_parted_config"])
        assert set(parsed) == {"all-disabled", node.mig_config}
        assert parsed[node.mig_config] == ({} if node.mig_config == "all-disabled"
                                           else fleet.mig_configs[node.mig_config])
    for hv in hostvars.values():  # environment-wide values, set on the env_pilot group
        assert hv["gpushare_environment"] == "pilot"
        assert hv["gpushare_toolkit_config"] == files["nvidia-container-toolkit/config.toml"]
        assert hv["gpushare_ignored_node_labels"] == list(IGNORED_NODE_LABELS)


def test_every_string_the_plugin_sets_reaches_ansible_untrusted() -> None:
    """ansible-core 2.19 keeps untrusted strings as data (never templated); the plugin leaves all of its so."""
    result = ansible_inventory("-i", "environments/pilot.yaml", "--list")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)

    def trusted_strings(value, where: str):
        if isinstance(value, str):
            yield where
        elif isinstance(value, dict) and set(value) != {"__ansible_unsafe"}:
            for key, item in value.items():
                yield from trusted_strings(item, f"{where}.{key}")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                yield from trusted_strings(item, f"{where}[{i}]")

    hostvars = data["_meta"]["hostvars"]
    assert hostvars and not list(trusted_strings(hostvars, "hostvars"))
    assert hostvars["pilot-a100-01"]["ansible_host"] == {"__ansible_unsafe": "10.50.1.11"}


def test_environment_files_are_recognised_by_path(tmp_path: Path) -> None:
    assert is_environment_file(ROOT / "environments" / "dev.yaml")
    assert is_environment_file(ENVIRONMENTS / "testbed.yaml")
    assert not is_environment_file(ENVIRONMENTS / "group_vars" / "all.yml")
    assert not is_environment_file(ROOT / "profiles" / "mig-balanced.yaml")
    # An ordinary (INI) inventory elsewhere still works through Ansible's own plugin.
    plain = tmp_path / "hosts.ini"
    plain.write_text("plain-host ansible_host=192.0.2.1\n")
    result = ansible_inventory("-i", str(plain), "--list")
    assert result.returncode == 0, result.stderr
    assert "plain-host" in json.loads(result.stdout)["_meta"]["hostvars"]


def test_a_broken_environment_stops_ansible_with_gpushare_s_error(tmp_path: Path) -> None:
    env_dir = tmp_path / "environments"
    env_dir.mkdir()
    data = yaml.safe_load((ROOT / "environments" / "dev.yaml").read_text())
    data["pools"][0]["profile"] = "no-such-profile"
    (env_dir / "broken.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    result = ansible_inventory("-i", str(env_dir / "broken.yaml"), "--graph")
    assert result.returncode != 0
    assert "no-such-profile" in result.stderr and "gpushare could not resolve" in result.stderr
    assert "broken.yaml:" in result.stderr  # the error names the file and line


@pytest.mark.parametrize("env", ["dev", "pilot", "prod"])
def test_every_shipped_environment_is_an_inventory(env: str) -> None:
    inv = build_inventory(resolve_env(env))
    assert inv.groups[group_name("env", env)].children
    for hv in inv.hostvars.values():
        assert hv["gpushare_containerd_dropin"].startswith("# containerd drop-in")


def test_testbed_environment_is_valid_and_matches_the_test_hosts() -> None:
    from tests.ansible.conftest import HOSTS

    fleet = resolve(ENVIRONMENTS / "testbed.yaml")
    nodes = {n.name: n for n in fleet.nodes}
    for spec in HOSTS:
        assert nodes[spec.name].gpu_model.name == spec.gpu_model
        assert nodes[spec.name].gpus_per_node == spec.gpu_count
        assert nodes[spec.name].nvswitch == spec.nvswitch


DRA_EXAMPLE = ROOT / "examples" / "environments" / "dra.yaml"


@pytest.mark.parametrize("where", ["the workspace", "a directory outside every workspace"])
def test_the_dra_example_is_an_inventory_from_any_directory(tmp_path: Path, where: str) -> None:
    """examples/environments/dra.yaml lists both clusters' bare-metal hosts; the DRA cluster's have no device-plugin
    config (NVIDIA's DRA driver serves their GPUs). Ansible may run from any directory (AWX, cron): the plugin reads
    the profiles and guardrails of the workspace the file lies in."""
    result = ansible_inventory("-i", str(DRA_EXAMPLE), "--list", cwd=ROOT if where == "the workspace" else tmp_path)
    assert result.returncode == 0, result.stderr
    hostvars = plain(json.loads(result.stdout))["_meta"]["hostvars"]
    fleet = resolve(DRA_EXAMPLE)
    nodes = {n.name: n for n in fleet.nodes if n.managed_by == "ansible"}
    assert sorted(hostvars) == sorted(nodes) and nodes
    on_dra = {n for n, node in nodes.items() if fleet.clusters[node.cluster].gpu_allocation == "dra"}
    assert on_dra and on_dra != set(nodes)
    for name, hv in hostvars.items():
        assert hv["gpushare_cluster"] == nodes[name].cluster
        assert (hv["gpushare_device_plugin_config"] is None) == (name in on_dra), name
        assert hv["gpushare_environment"] == "dra"


@pytest.mark.parametrize(("change", "at", "says"), [
    (lambda c: c.__setitem__("kubernetes_version", "1.33"), ("- name: lab-dra",), "gpu_allocation dra needs"),
    (lambda c: c["dra"].__setitem__("version", "v9.9.9"), ("- name: lab-dra", "version: v9.9.9"),
     "not a release gpushare knows"),
    (lambda c: c["dra"].__setitem__("feature_gates", ["NoSuchGate"]), ("- name: lab-dra", "- NoSuchGate"),
     "not a feature gate of NVIDIA's DRA driver"),
], ids=["kubernetes-version", "driver-version", "driver-gate"])
def test_a_bad_dra_environment_stops_ansible_naming_the_file_and_line(
        tmp_path: Path, change: Any, at: tuple[str, ...], says: str) -> None:
    env_dir = tmp_path / "environments"
    env_dir.mkdir()
    data = yaml.safe_load(DRA_EXAMPLE.read_text())
    change(next(c for c in data["clusters"] if c["name"] == "lab-dra"))
    text = yaml.safe_dump(data, sort_keys=False)
    env = env_dir / "dra.yaml"
    env.write_text(text)
    lines = text.splitlines()
    line = 0
    for marker in at:  # the line of the last marker, found after the ones before it
        line = next(i for i in range(line, len(lines)) if lines[i].strip() == marker) + 1
    result = ansible_inventory("-i", str(env), "--graph")
    assert result.returncode != 0
    assert "gpushare could not resolve" in result.stderr and says in result.stderr, result.stderr
    assert f"{env}:{line}: clusters[1]" in result.stderr, (line, result.stderr)
    assert "fix:" in result.stderr
