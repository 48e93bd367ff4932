"""gpushare's Ansible modules and the test-host fixtures, run on this machine: the pure logic of each module, and
the fixture tools (nvidia-mig-parted, nvidia-ctk, dcgmi, the gpu_facts module) over the NVML simulator."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

from gpushare.core.resolve import resolve
from gpushare.ops.inventory import build_inventory
from tests.ansible import packages
from tests.ansible.controller import ENVIRONMENTS
from tests.ansible.testbed import ROOT

LIBRARY = ROOT / "gpushare" / "ansible_collections" / "gpushare" / "fleet" / "plugins" / "modules"
FIXTURES = Path(__file__).resolve().parent / "fixture_packages"


def module(name: str) -> ModuleType:
    """A module's file imported here as Ansible would run it, its collection's module_utils importable by their
    fully qualified names (Ansible puts them in the module's payload)."""
    utils = LIBRARY.parent / "module_utils"
    for path in sorted(utils.glob("*.py")):  # files before state, which imports it
        qualified = f"ansible_collections.gpushare.fleet.plugins.module_utils.{path.stem}"
        if qualified not in sys.modules:
            util_spec = importlib.util.spec_from_file_location(qualified, path)
            assert util_spec and util_spec.loader
            util = importlib.util.module_from_spec(util_spec)
            util_spec.loader.exec_module(util)
            sys.modules[qualified] = util
    spec = importlib.util.spec_from_file_location(f"gpushare_test_{name}", LIBRARY / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------- containerd_runtime


SITE = """
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.9"
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = true
[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "/etc/containerd/certs.d"
[[proxy_plugins_list]]
  name = "a"
"""


def rendered_dropin(version: str) -> str:
    from gpushare.render.fleet import containerd_runtime
    from gpushare.render.templating import environment

    return environment().get_template("containerd-nvidia-runtime.toml.j2").render(r=containerd_runtime(version))


def test_toml_writer_round_trips_what_containerd_dumps() -> None:
    cr = module("containerd_runtime")
    data = tomllib.loads(SITE)
    data["odd key"] = {"list": [1, 2], "inline": [{"a": "b"}], "float": 1.5, "quote": 'say "hi"'}
    assert tomllib.loads(cr.dumps(data)) == data


def test_dropin_for_containerd_1x_carries_the_site_table_and_2x_is_rendered_as_is() -> None:
    cr = module("containerd_runtime")
    baseline = tomllib.loads(SITE)
    text = cr.desired_dropin(rendered_dropin("1.6"), baseline, major=1)
    table = tomllib.loads(text)["plugins"]["io.containerd.grpc.v1.cri"]
    assert table["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    assert table["registry"]["config_path"] == "/etc/containerd/certs.d"
    assert table["containerd"]["default_runtime_name"] == "nvidia"
    assert table["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert cr.desired_dropin(rendered_dropin("2.1"), baseline, major=2) == rendered_dropin("2.1")


def test_config_dump_differences_allow_only_the_nvidia_runtime() -> None:
    cr = module("containerd_runtime")
    cri = {"io.containerd.grpc.v1.cri"}
    before = tomllib.loads(SITE)
    after = cr.merge(before, tomllib.loads(rendered_dropin("1.6")))
    diffs = cr.differences(before, after)
    assert diffs and not cr.disallowed(diffs, cri, "nvidia", allow_default_runtime=True)
    assert [d[0][-1] for d in cr.disallowed(diffs, cri, "nvidia", allow_default_runtime=False)] == [
        "default_runtime_name"]
    # What a naive 1.x import does: the runc table loses SystemdCgroup, which must be refused.
    naive = dict(before, plugins={"io.containerd.grpc.v1.cri": tomllib.loads(rendered_dropin("1.6"))["plugins"][
        "io.containerd.grpc.v1.cri"]})
    bad = cr.disallowed(cr.differences(before, naive), cri, "nvidia", allow_default_runtime=True)
    assert ("plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes", "runc", "options",
            "SystemdCgroup") in [b[0] for b in bad]


@pytest.mark.parametrize(("text", "expected"), [
    ('version = 2\nimports = ["/etc/a.toml"]\n[x]\n', 'version = 2\nimports = ["/etc/a.toml", "/d.toml"]\n[x]\n'),
    ("# site\nversion = 2\n[x]\n", '# site\nversion = 2\nimports = ["/d.toml"]\n[x]\n'),
    ("", 'version = 2\nimports = ["/d.toml"]\n'),
])
def test_the_dropin_is_added_to_imports_keeping_the_rest(text: str, expected: str) -> None:
    cr = module("containerd_runtime")
    assert cr.add_import(text, "/d.toml", 2) == expected
    tomllib.loads(expected)


# ---------------------------------------------------------------- kube_node, dcgm_diag


def test_gpu_pods_are_running_or_pending_pods_requesting_gpu_resources() -> None:
    kn = module("kube_node")

    def pod(name, phase, limits):
        return {"metadata": {"name": name, "namespace": "ml"}, "status": {"phase": phase},
                "spec": {"containers": [{"resources": {"limits": limits}}]}}

    pods = {"items": [pod("train", "Running", {"nvidia.com/mig-3g.40gb": 1}), pod("web", "Running", {"cpu": 1}),
                      pod("done", "Succeeded", {"nvidia.com/gpu": 1}), pod("next", "Pending", {"nvidia.com/gpu": 1})]}
    assert kn.gpu_pods(pods, "nvidia.com/") == ["ml/train", "ml/next"]
    assert kn.label_changes({"a": "1", "b": "2"}, {"a": "1", "b": "3", "c": "4"}) == {"b": "3", "c": "4"}


def test_dcgm_diag_reports_failing_tests_per_gpu() -> None:
    dd = module("dcgm_diag")
    ok = {"DCGM Diagnostic": {"test_categories": [{"category": "Deployment", "tests": [
        {"name": "software", "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Pass"}],
         "test_summary": {"status": "Pass"}}]}]}}
    assert dd.parse(json.dumps(ok))[:2] == (True, [])
    bad = json.loads(json.dumps(ok))
    bad["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["results"].append(
        {"entity_group": "GPU", "entity_id": 3, "status": "Fail", "warnings": [{"warning": "XID 79"}]})
    passed, failures, _ = dd.parse("noise before\n" + json.dumps(bad))
    assert not passed and failures == [{"category": "Deployment", "test": "software", "entity": "GPU 3",
                                        "warning": "XID 79"}]
    with pytest.raises(ValueError, match="runtime error"):
        dd.parse(json.dumps({"DCGM Diagnostic": {"runtime_error": "no plugins"}}))
    with pytest.raises(ValueError):
        dd.parse("Error: unable to establish a connection")


# ---------------------------------------------------------------- gpu_facts on this machine (no GPU, no driver)


def ansible_module(name: str, args: str, extra_vars: str | None = None) -> subprocess.CompletedProcess:
    bin_dir = Path(sys.executable).parent
    extra = ["-e", extra_vars] if extra_vars else []
    return subprocess.run([str(bin_dir / "ansible"), "localhost", "-m", name, "-a", args, *extra],
                          cwd=ROOT, capture_output=True, text=True,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
                               "HOME": str(Path.home()), "ANSIBLE_LOCALHOST_WARNING": "False"})


def test_gpu_facts_without_nvml_reports_no_gpus_and_fails_only_when_gpus_are_expected() -> None:
    quiet = ansible_module("gpushare.fleet.gpu_facts", "expected_gpus=0")
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert '"nvml": false' in quiet.stdout and '"gpus": []' in quiet.stdout
    assert "NVML" in quiet.stdout  # the reason
    expected = ansible_module("gpushare.fleet.gpu_facts", "expected_gpus=8")
    assert expected.returncode != 0
    assert "the environment says this host has 8 GPUs, but NVML reports none" in expected.stdout


def test_gpu_facts_waits_for_missing_bindings_and_refuses_an_unsupported_platform() -> None:
    # Debian's own python3 has no NVML bindings here: with wait_for_bindings the role installs them and reads again,
    # so a host that has GPUs is not failed yet; without it, it is.
    no_bindings = "ansible_python_interpreter=/usr/bin/python3"
    if subprocess.run(["/usr/bin/python3", "-c", "import pynvml"], capture_output=True).returncode == 0:
        pytest.skip("/usr/bin/python3 has the NVML bindings here")
    waiting = ansible_module("gpushare.fleet.gpu_facts", "expected_gpus=8 wait_for_bindings=true", no_bindings)
    assert waiting.returncode == 0, waiting.stdout
    assert '"bindings": false' in waiting.stdout
    failing = ansible_module("gpushare.fleet.gpu_facts", "expected_gpus=8", no_bindings)
    assert failing.returncode != 0 and "cannot be imported" in failing.stdout
    platform = ansible_module("gpushare.fleet.gpu_facts", "supported_platforms=rhel,fedora")
    assert platform.returncode != 0
    assert "gpushare's roles support rhel and fedora-like hosts (this is debian" in platform.stdout, platform.stdout
    assert ansible_module("gpushare.fleet.gpu_facts", "supported_platforms=debian").returncode == 0


def test_mig_layout_check_filter_gives_gpushare_s_verdict_without_raising() -> None:
    spec = importlib.util.spec_from_file_location(
        "gpushare_test_mig_layout_check", LIBRARY.parent / "filter" / "mig_layout_check.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    check = mod.FilterModule().filters()["mig_layout_check"]
    assert check("NVIDIA A100-SXM4-80GB", "3g.40gb=2", 580) == {"ok": True, "errors": [], "warnings": []}
    too_many = check("NVIDIA A100-SXM4-80GB", "3g.40gb=3", "580")
    assert too_many["ok"] is False and too_many["errors"]
    unknown = check("NVIDIA Z9000", "1g.10gb=1", 580)
    assert unknown["ok"] is False and unknown["errors"]
    bad_branch = check("NVIDIA A100-SXM4-80GB", "3g.40gb=1", "R580")
    assert bad_branch["ok"] is False and "driver branch 'R580'" in bad_branch["errors"][0]


# ---------------------------------------------------------------- the fixtures over the NVML simulator


@pytest.fixture
def sim(tmp_path: Path):
    """Run fixture tools on this machine against a simulated host (state in tmp_path)."""
    tables = tmp_path / "tables.json"
    tables.write_text(json.dumps(packages.simulator_tables()))
    driver = tmp_path / "driver.json"
    driver.write_text(json.dumps({"version": packages.DRIVER_VERSION, "cuda": packages.DRIVER_CUDA}))
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    env = dict(os.environ, GPUSIM_HARDWARE=str(tmp_path / "hardware.json"), GPUSIM_DRIVER=str(driver),
               GPUSIM_TABLES=str(tables), GPUSIM_STATE_DIR=str(tmp_path / "state"),
               GPUSIM_PROCS_DIR=str(tmp_path / "procs"), GPUSIM_EVENTS=str(tmp_path / "events.jsonl"),
               GPUSIM_BOOT_ID=str(boot), GPUSIM_HOSTENGINE_PID=str(tmp_path / "hostengine.pid"),
               GPUSIM_DCGM_PLUGINS=str(tmp_path / "dcgm-plugins"),
               # The simulator's pynvml, and the collection's module_utils the modules import (as Ansible ships them).
               PYTHONPATH=os.pathsep.join([str(FIXTURES / "sim"), str(ROOT / "gpushare")]))

    class Sim:
        path = tmp_path

        def hardware(self, model: str, count: int, reset: bool = True) -> None:
            (tmp_path / "hardware.json").write_text(json.dumps({"host": "h", "model": model, "count": count,
                                                                "reset": reset}))

        def run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
            path = FIXTURES / "bin" / tool if (FIXTURES / "bin" / tool).exists() else LIBRARY / tool
            result = subprocess.run([sys.executable, str(path), *args], env=env, capture_output=True, text=True)
            if check:
                assert result.returncode == 0, result.stderr
            return result

        def show(self) -> dict:
            return json.loads(self.run("gpusim", "show").stdout)

        def reboot(self) -> None:
            boot.write_text(boot.read_text() + "x")

        def start(self, tool: str, *args: str) -> subprocess.Popen:
            proc = subprocess.Popen([sys.executable, str(FIXTURES / "bin" / tool), *args], env=env)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not any((tmp_path / "procs").glob(f"{proc.pid}.json")):
                time.sleep(0.05)
            return proc

    return Sim()


def test_the_bindings_load_the_driver_s_nvml_and_fail_like_nvml_without_it(tmp_path: Path) -> None:
    probe = ("import pynvml\ntry:\n    pynvml.nvmlInit()\n    print('initialised', pynvml.nvmlDeviceGetCount())\n"
             "except pynvml.NVMLError as err:\n    print(type(err).__name__, err)\n")
    shim_dir = tmp_path / "bindings"
    shim_dir.mkdir()
    (shim_dir / "pynvml.py").write_text((FIXTURES / "sim" / "pynvml_bindings.py").read_text())

    def run(lib: Path) -> str:
        env = dict(os.environ, PYTHONPATH=str(shim_dir), GPUSIM_LIB=str(lib),
                   GPUSIM_DRIVER=str(FIXTURES / "sim" / "absent.json"))
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()

    assert run(tmp_path / "no-driver") == "NVMLError_LibraryNotFound NVML Shared Library Not Found"
    # With the driver's NVML present, the bindings are the simulator (here without driver.json: not initialised).
    assert run(FIXTURES / "sim") == "NVMLError_LibraryNotFound NVML Shared Library Not Found"
    driver = tmp_path / "driver.json"
    driver.write_text(json.dumps({"version": packages.DRIVER_VERSION, "cuda": packages.DRIVER_CUDA}))
    env = dict(os.environ, PYTHONPATH=str(shim_dir), GPUSIM_LIB=str(FIXTURES / "sim"), GPUSIM_DRIVER=str(driver),
               GPUSIM_HARDWARE=str(tmp_path / "none.json"), GPUSIM_STATE_DIR=str(tmp_path / "state"))
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "initialised 0"


def host_config(tmp_path: Path, host: str) -> tuple[Path, str, dict[str, int]]:
    fleet = resolve(ENVIRONMENTS / "testbed.yaml")
    hv = build_inventory(fleet).hostvars[host]
    path = tmp_path / f"{host}.yaml"
    path.write_text(hv["gpushare_mig_parted_config"])
    return path, hv["gpushare_mig_config"], hv["gpushare_mig_layout"]


def test_mig_parted_fixture_applies_asserts_and_loses_instances_at_reboot(sim, tmp_path: Path) -> None:
    from gpushare.core.catalog import load_catalog

    sim.hardware("NVIDIA A100-SXM4-80GB", 2)
    config, name, layout = host_config(tmp_path, "tb-a100-01")
    assert sim.run("nvidia-mig-parted", "assert", "-f", str(config), "-c", name, check=False).returncode == 1
    sim.run("nvidia-mig-parted", "apply", "-f", str(config), "-c", name)
    sim.run("nvidia-mig-parted", "assert", "-f", str(config), "-c", name)
    shown = sim.show()["gpus"]
    assert [g["layout"] for g in shown] == [layout, layout]
    # Instances sit at allowed starts of the real geometry and do not overlap.
    model = load_catalog().models["NVIDIA A100-SXM4-80GB"]
    for gpu in shown:
        used: set[int] = set()
        for gi in gpu["instances"]:
            assert gi["start"] in model.profiles[gi["profile"]].placements
            span = set(range(gi["start"], gi["start"] + gi["size"]))
            assert not span & used
            used |= span
    sim.reboot()  # MIG mode survives a reboot, instances do not
    after = sim.show()["gpus"]
    assert [g["mig_current"] for g in after] == [1, 1] and [g["layout"] for g in after] == [{}, {}]
    assert sim.run("nvidia-mig-parted", "assert", "-f", str(config), "-c", name, check=False).returncode == 1
    sim.run("nvidia-mig-parted", "assert", "--mode-only", "-f", str(config), "-c", name)


def test_a_gpu_process_blocks_mig_changes_and_shows_in_gpu_facts(sim, tmp_path: Path) -> None:
    sim.hardware("NVIDIA H100 80GB HBM3", 2)
    config, name, _ = host_config(tmp_path, "tb-h100-01")
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"expected_gpus": 2}}))
    job = sim.start("gpusim", "job", "--gpus", "1")
    try:
        blocked = sim.run("nvidia-mig-parted", "apply", "-f", str(config), "-c", name, check=False)
        assert blocked.returncode == 1 and "In use" in blocked.stderr
        facts = json.loads(sim.run("gpu_facts.py", str(args)).stdout)["gpu_facts"]
        assert facts["driver_branch"] == 580 and facts["cuda_driver_version"] == "13.0"
        assert [[p["pid"] for p in g["processes"]] for g in facts["gpus"]] == [[], [job.pid]]
        # mig-parted works GPU by GPU: the busy one is refused (the role never gets this far with a process left).
        assert facts["gpus"][1]["mig"] == {"capable": True, "current": "disabled", "pending": "disabled"}
    finally:
        job.terminate()
        job.wait()
    sim.run("nvidia-mig-parted", "apply", "-f", str(config), "-c", name)
    facts = json.loads(sim.run("gpu_facts.py", str(args)).stdout)["gpu_facts"]
    assert [Counter(i["profile"] for i in g["gpu_instances"]) for g in facts["gpus"]] == [
        Counter({"4g.40gb": 1, "3g.40gb": 1})] * 2


def test_a_mode_change_without_gpu_reset_waits_for_a_reboot(sim, tmp_path: Path) -> None:
    sim.hardware("NVIDIA A100-SXM4-80GB", 1, reset=False)
    config, name, layout = host_config(tmp_path, "tb-a100-01")
    failed = sim.run("nvidia-mig-parted", "apply", "-f", str(config), "-c", name, check=False)
    assert failed.returncode == 1 and "reset is not available" in failed.stderr
    gpu = sim.show()["gpus"][0]
    assert (gpu["mig_current"], gpu["mig_pending"]) == (0, 1)
    sim.reboot()
    sim.run("nvidia-mig-parted", "apply", "-f", str(config), "-c", name)
    assert sim.show()["gpus"][0]["layout"] == layout


def test_cdi_spec_and_dcgm_diagnostic_follow_the_simulated_gpus(sim, tmp_path: Path) -> None:
    import yaml

    sim.hardware("NVIDIA A100-SXM4-80GB", 2)
    config, name, layout = host_config(tmp_path, "tb-a100-01")
    sim.run("nvidia-mig-parted", "apply", "-f", str(config), "-c", name)
    spec = yaml.safe_load(sim.run("nvidia-ctk", "cdi", "generate").stdout)
    names = [d["name"] for d in spec["devices"]]
    assert sum(n.startswith("MIG-") for n in names) == 2 * sum(layout.values())
    assert "0:0" in names and "all" in names

    dd = module("dcgm_diag")
    refused = sim.run("dcgmi", "diag", "-r", "1", "--json", check=False)
    assert refused.returncode != 0 and "unable to establish a connection" in refused.stderr
    engine = sim.start("nv-hostengine")
    try:
        # Without the diagnostic plugins of the driver's CUDA major (datacenter-gpu-manager-4-cuda13): no verdict.
        with pytest.raises(ValueError, match="datacenter-gpu-manager-4-cuda13"):
            dd.parse(sim.run("dcgmi", "diag", "-r", "1", "--json", check=False).stdout)
        (tmp_path / "dcgm-plugins" / "cuda13").mkdir(parents=True)
        assert dd.parse(sim.run("dcgmi", "diag", "-r", "1", "--json").stdout)[:2] == (True, [])
        sim.run("gpusim", "diag", "--gpu", "1")
        passed, failures, _ = dd.parse(sim.run("dcgmi", "diag", "-r", "1", "--json", check=False).stdout)
        assert not passed and [f["entity"] for f in failures] == ["GPU 1"] and "XID 79" in failures[0]["warning"]
    finally:
        engine.terminate()
        engine.wait()


# ---------------------------------------------------------------- host_read, apt_source, role_arguments on this machine


def module_json(run: subprocess.CompletedProcess) -> dict:
    """The result `ansible localhost -m MODULE` printed after `localhost | STATUS =>`."""
    return json.loads(run.stdout[run.stdout.index("{"):])


def test_host_read_reports_packages_commands_paths_and_state_without_failing_on_what_is_missing(
        tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"state": "success", "mig_config": "gpushare-a"}))
    args = json.dumps({"packages": ["dpkg", "gpushare-no-such-package"],
                       "commands": {"ok": ["true"], "missing": ["gpushare-no-such-command", "--version"]},
                       "paths": [str(state), str(tmp_path / "absent")], "state_path": str(state)})
    run = ansible_module("gpushare.fleet.host_read", args)
    assert run.returncode == 0, run.stdout + run.stderr
    got = module_json(run)
    assert got["changed"] is False
    assert got["packages"]["dpkg"]["status"] == "installed" and got["packages"]["dpkg"]["version"]
    assert got["packages"]["gpushare-no-such-package"] == {"version": None, "want": None, "status": None}
    assert got["commands"]["ok"]["rc"] == 0
    assert got["commands"]["missing"]["rc"] == 127 and "not installed" in got["commands"]["missing"]["stderr"]
    assert got["paths"] == {str(state): True, str(tmp_path / "absent"): False}
    assert got["state"] == {"state": "success", "mig_config": "gpushare-a"}
    bad = ansible_module("gpushare.fleet.host_read", json.dumps({"commands": {"x": "containerd --version"}}))
    assert bad.returncode != 0 and "each command is a non-empty list of arguments" in bad.stdout


def test_host_read_parses_one_systemctl_show_block_per_unit_in_the_order_asked() -> None:
    hr = module("host_read")
    text = ("Id=nvidia-fabricmanager.service\nActiveState=active\nUnitFileState=enabled\nEnvironment=\n\n"
            "Id=nvidia-mig-manager.service\nActiveState=inactive\nUnitFileState=enabled\n"
            "Environment=MIG_PARTED_CONFIG_FILE=/etc/gpushare/mig-parted/config.yaml MIG_PARTED_SELECTED_CONFIG=a\n\n"
            "Id=gone.service\nActiveState=inactive\nUnitFileState=\nEnvironment=\n")
    got = hr.parse_units(text, ["nvidia-fabricmanager.service", "nvidia-mig-manager.service", "gone.service"])
    assert got["nvidia-fabricmanager.service"] == {"active": "active", "enabled": "enabled", "environment": ""}
    assert got["nvidia-mig-manager.service"]["environment"].endswith("MIG_PARTED_SELECTED_CONFIG=a")
    assert got["gone.service"] == {"active": "inactive", "enabled": None, "environment": ""}
    assert hr.parse_units("", ["x.service"]) == {"x.service": {"active": None, "enabled": None, "environment": ""}}
    dpkg = hr.parse_dpkg("nvidia-container-toolkit\t1.18.2-1\thold\tinstalled\n", ["nvidia-container-toolkit", "x"])
    assert dpkg == {"nvidia-container-toolkit": {"version": "1.18.2-1", "want": "hold", "status": "installed"},
                    "x": {"version": None, "want": None, "status": None}}


def test_apt_source_writes_the_source_and_key_once_and_refuses_bad_settings(tmp_path: Path) -> None:
    key = tmp_path / "key.asc"
    key.write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINBF...\n-----END PGP PUBLIC KEY BLOCK-----\n")
    dirs = {"sources_dir": str(tmp_path / "sources"), "keyrings_dir": str(tmp_path / "keyrings")}
    signed = {"name": "nvidia-dcgm", "uri": "https://mirror.example/cuda", "key_url": key.as_uri(), **dirs}
    first = ansible_module("gpushare.fleet.apt_source", json.dumps(signed))
    assert first.returncode == 0, first.stdout + first.stderr
    assert module_json(first)["changed"] is True
    source = (tmp_path / "sources" / "nvidia-dcgm.sources").read_text()
    assert "URIs: https://mirror.example/cuda\nSuites: /\n" in source
    assert f"Signed-By: {tmp_path / 'keyrings' / 'nvidia-dcgm.asc'}" in source
    assert (tmp_path / "keyrings" / "nvidia-dcgm.asc").read_text() == key.read_text()
    again = ansible_module("gpushare.fleet.apt_source", json.dumps(signed))
    assert module_json(again)["changed"] is False  # a converged host refreshes no package index
    trusted = ansible_module("gpushare.fleet.apt_source", json.dumps(
        {"name": "nvidia-dcgm", "uri": "file:/srv/cuda", "trusted": True, **dirs}))
    assert module_json(trusted)["changed"] is True
    assert "Trusted: yes" in (tmp_path / "sources" / "nvidia-dcgm.sources").read_text()
    for args, message in (({"name": "NVIDIA dcgm", "uri": "file:/srv", "trusted": True}, "lower case letters"),
                          ({"name": "dcgm", "uri": "file:/srv"}, "give a signing key URL, or trusted=true"),
                          ({"name": "dcgm", "uri": "file:/srv", "key_url": (tmp_path / "absent.asc").as_uri()},
                           "could not fetch the signing key")):
        bad = ansible_module("gpushare.fleet.apt_source", json.dumps({**args, **dirs}))
        assert bad.returncode != 0 and message in bad.stdout, bad.stdout
    not_a_key = tmp_path / "page.html"
    not_a_key.write_text("<html>proxy login</html>")
    bad = ansible_module("gpushare.fleet.apt_source", json.dumps(
        {"name": "other", "uri": "file:/srv", "key_url": not_a_key.as_uri(), **dirs}))
    assert bad.returncode != 0 and "did not answer with an OpenPGP key" in bad.stdout, bad.stdout
    assert not (tmp_path / "keyrings" / "other.asc").exists()


ROLE_ARGUMENTS_PLAY = """
- hosts: all
  gather_facts: false
  tasks:
    - gpushare.fleet.role_arguments:
        roles: [gpu_facts, nvidia_driver_check, nvidia_container_toolkit, mig, dcgm, gpushare.fleet.gpu_sharing]
"""


def test_role_arguments_checks_every_role_s_spec_in_one_task_and_names_the_role_and_option(tmp_path: Path) -> None:
    play = tmp_path / "play.yml"
    play.write_text(ROLE_ARGUMENTS_PLAY)
    bin_dir = Path(sys.executable).parent

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(bin_dir / "ansible-playbook"), "-i", str(ENVIRONMENTS / "testbed.yaml"),
                               str(play), "--limit", "tb-a100-01", "-v", *extra], cwd=ROOT,
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin",
                                   "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")})

    good = run()
    assert good.returncode == 0, good.stdout + good.stderr
    assert "the arguments of 6 roles passed their argument specs" in good.stdout
    assert '"mig": 0' not in good.stdout  # each role had values to check
    bad = run("-e", "mig_drain_timeout=soon", "-e", "dcgm_diag_level=[1]")
    assert bad.returncode != 0
    assert "role mig:" in bad.stdout and "mig_drain_timeout" in bad.stdout, bad.stdout
    assert "role dcgm:" in bad.stdout and "dcgm_diag_level" in bad.stdout, bad.stdout
    unknown = tmp_path / "unknown.yml"
    unknown.write_text(ROLE_ARGUMENTS_PLAY.replace("gpu_facts,", "gpu_fact,"))
    play.write_text(unknown.read_text())
    wrong = run()
    assert wrong.returncode != 0 and "gpu_fact is not a role of gpushare.fleet" in wrong.stdout, wrong.stdout
