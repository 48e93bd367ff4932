"""site.yml, verify.yml and their safety rules, run for real with ansible-runner against the isolated test hosts.

The tests run in file order and share the hosts: the first converges them, the later ones change one thing each
(a GPU process, a pool's layout, a toolkit below the CVE floor, a driver branch, a reboot) and check what the
playbooks did and did not do. Each names the state it starts from and checks it.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from gpushare.core.guardrails import load_guardrails
from gpushare.core.resolve import resolve
from tests.ansible.conftest import environment_copy, infra
from tests.ansible.controller import Controller, PlaybookRun
from tests.ansible.testbed import Host, Testbed

pytestmark = [pytest.mark.ansible, pytest.mark.slow]

A100, H100, L4 = "tb-a100-01", "tb-h100-01", "tb-l4-01"
ALL = (A100, H100, L4)


def gpus(host: Host) -> list[dict[str, Any]]:
    return json.loads(host.ssh("gpusim show").stdout)["gpus"]


def events(host: Host, since: float = 0.0) -> list[dict[str, Any]]:
    lines = host.ssh("cat /var/log/gpusim/events.jsonl").stdout.splitlines()
    return [e for e in map(json.loads, lines) if e["t"] >= since]


def host_state(host: Host) -> dict[str, Any]:
    return json.loads(host.ssh("cat /var/lib/gpushare/state.json").stdout)


def expected_layouts(env_file: Path) -> dict[str, dict[str, int]]:
    """Per host the layout each GPU must hold ({} with MIG off), from gpushare's own resolution."""
    fleet = resolve(env_file)
    return {n.name: dict(n.mig_layout or {}) for n in fleet.nodes}


def assert_layouts(testbed: Testbed, env_file: Path, names=ALL) -> None:
    layouts = expected_layouts(env_file)
    for name in names:
        for gpu in gpus(testbed.host(name)):
            if gpu["mig_current"] is None:  # no MIG on this model
                assert not layouts[name], name
                continue
            assert gpu["layout"] == layouts[name], f"{name} GPU {gpu['index']}"
            assert gpu["mig_current"] == gpu["mig_pending"] == (1 if layouts[name] else 0)


def assert_ok(run: PlaybookRun, hosts=ALL) -> None:
    for host in hosts:
        assert not run.failed(host), f"{host}: {run.failures(host)}\n{run.summary()}"
    assert run.rc == 0, run.summary()


def with_h100_profile(profile: str):
    def edit(data: dict[str, Any]) -> None:
        next(p for p in data["pools"] if p["name"] == "h100-llm-serving")["profile"] = profile
    return edit


@pytest.fixture(scope="module")
def converged(testbed: Testbed, controller: Controller, testbed_env: Path) -> PlaybookRun:
    return controller.run("site.yml", testbed_env, label="site-first")


def test_site_converges_to_the_environment(
        testbed: Testbed, testbed_env: Path, controller: Controller, converged: PlaybookRun) -> None:
    assert_ok(converged)
    for host in (A100, H100):
        assert converged.changed(host) > 0
    assert_layouts(testbed, testbed_env)
    # The H100 host cannot reset its GPUs: the MIG mode change took exactly one reboot, and the unit applied the
    # layout at boot; the A100 host was reset in place.
    assert (testbed.host(A100).boots, testbed.host(H100).boots) == (1, 2)
    assert [e["unit"] for e in events(testbed.host(H100)) if e["event"] == "boot-apply"] == [
        converged_mig_config(testbed_env, H100)]
    assert infra(testbed.host(H100)).file("/var/lib/nvidia-mig-manager/reboot_attempted").exists is False

    fleet = {n.name: n for n in resolve(testbed_env).nodes}
    for name in ALL:
        node = controller.node(name)
        owned = fleet[name].labels_owned_by("ansible")
        assert {k: node["labels"][k] for k in owned} == owned
        assert node["labels"]["nvidia.com/mig.config"] == "all-disabled"  # the operator's label, left alone
        assert node["unschedulable"] is False
        target = infra(testbed.host(name))
        assert target.package("nvidia-container-toolkit").version == "1.18.2-1"
        assert target.package(f"datacenter-gpu-manager-4-cuda{13}").is_installed
        assert target.service("nvidia-dcgm").is_running
        toolkit = tomllib.loads(target.file("/etc/nvidia-container-runtime/config.toml").content_string)
        assert toolkit["accept-nvidia-visible-devices-envvar-when-unprivileged"] is False
        assert toolkit["accept-nvidia-visible-devices-as-volume-mounts"] is True
        assert target.file("/var/run/cdi/nvidia.yaml").exists

    for name in (A100, H100):
        host = testbed.host(name)
        state = host_state(host)
        assert state["state"] == "success" and state["mig_config"] == fleet[name].mig_config
        target = infra(host)
        assert target.service("nvidia-mig-manager").is_enabled
        env = target.check_output("systemctl show -p Environment nvidia-mig-manager")
        assert f"MIG_PARTED_SELECTED_CONFIG={fleet[name].mig_config}" in env
        # Every MIG device is in the CDI spec the runtime reads, regenerated after the change.
        cdi = target.file("/var/run/cdi/nvidia.yaml").content_string
        assert cdi.count("name: MIG-") == sum(fleet[name].mig_layout.values()) * 8
        # Labels were set only after the layout was asserted on the host, and the node was cordoned meanwhile
        # (`kubectl drain` cordons first; kube_node sends no cordon of its own before an evicting drain).
        calls = controller.mutating_calls(name)
        verbs = [c["verb"] for c in calls]
        assert verbs == ["drain", "label", "uncordon"], verbs
        assert_ok_assert = [e for e in events(host) if e["event"] == "mig-parted-assert" and e["ok"]]
        assert assert_ok_assert and assert_ok_assert[0]["t"] < calls[2]["t"]
        assert all(c["kubeconfig"] == str(controller.kubeconfig) and c["context"] == "testbed-admin" for c in calls)
    # A host without MIG gets its device-plugin label and is never cordoned.
    assert [c["verb"] for c in controller.mutating_calls(L4)] == ["label"]


def test_converged_rerun_changes_nothing(
        testbed: Testbed, testbed_env: Path, controller: Controller, converged: PlaybookRun) -> None:
    assert_ok(converged)
    rerun = controller.run("site.yml", testbed_env, label="site-rerun")
    assert_ok(rerun)
    for host in ALL:
        assert rerun.changed(host) == 0, f"{host} changed: {rerun.changed_tasks(host)}"


def test_verify_passes(testbed: Testbed, testbed_env: Path, controller: Controller, converged: PlaybookRun) -> None:
    assert_ok(converged)
    before = len(controller.kubectl_calls())
    verify = controller.run("verify.yml", testbed_env, label="verify")
    assert_ok(verify)
    for host in ALL:
        assert verify.changed(host) == 0, verify.changed_tasks(host)
    assert all(c["verb"] == "get" for c in controller.kubectl_calls()[before:])


def flatten(data: dict[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    out: dict[tuple[str, ...], Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, (*prefix, key)))
        else:
            out[(*prefix, key)] = value
    return out


def test_containerd_config_dump_differs_only_by_the_nvidia_runtime(
        testbed: Testbed, testbed_env: Path, converged: PlaybookRun) -> None:
    assert_ok(converged)
    cri = "io.containerd.grpc.v1.cri"
    host = testbed.host(L4)
    site = "/root/site-containerd-config.toml"  # what the site's bootstrap wrote, kept by the fixture
    before = flatten(tomllib.loads(host.ssh(f"containerd --config {site} config dump").stdout))
    after = flatten(tomllib.loads(host.ssh("containerd config dump").stdout))
    changed = {k for k in set(before) | set(after) if k != ("imports",) and before.get(k) != after.get(k)}
    runtime = ("plugins", cri, "containerd", "runtimes", "nvidia")
    assert changed, "the nvidia runtime is missing"
    # containerd 1.6 has no CDI: nvidia must also be the default runtime; nothing else may change.
    others = changed - {k for k in changed if k[:5] == runtime}
    assert others == {("plugins", cri, "containerd", "default_runtime_name")}
    assert after[("plugins", cri, "containerd", "default_runtime_name")] == "nvidia"
    assert after[(*runtime, "options", "BinaryName")] == "/usr/bin/nvidia-container-runtime"
    assert after[("plugins", cri, "containerd", "runtimes", "runc", "options", "SystemdCgroup")] is True
    assert after[("plugins", cri, "registry", "config_path")] == "/etc/containerd/certs.d"

    # Why the role carries the table: containerd 1.6 replaces a whole plugin table from an imported file, so the
    # rendered drop-in imported as it is would silently drop the site's settings.
    rendered = next(n for n in resolve(testbed_env).nodes if n.name == L4)
    from gpushare.ops.inventory import build_inventory

    dropin = build_inventory(resolve(testbed_env)).hostvars[rendered.name]["gpushare_containerd_dropin"]
    host.ssh("mkdir -p /tmp/naive && cat > /tmp/naive/dropin.toml <<'EOF'\n" + dropin + "EOF\n"
             "sed '/^imports/d' /root/site-containerd-config.toml > /tmp/naive/config.toml && "
             "sed -i '2a imports = [\"/tmp/naive/dropin.toml\"]' /tmp/naive/config.toml")
    naive = flatten(tomllib.loads(host.ssh("containerd --config /tmp/naive/config.toml config dump").stdout))
    assert naive.get(("plugins", cri, "containerd", "runtimes", "runc", "options", "SystemdCgroup")) is not True
    assert naive.get(("plugins", cri, "registry", "config_path")) != "/etc/containerd/certs.d"


def test_gpu_process_blocks_the_change_and_leaves_only_that_node_cordoned(
        testbed: Testbed, testbed_env: Path, controller: Controller, converged: PlaybookRun, tmp_path: Path) -> None:
    assert_ok(converged)
    h100 = testbed.host(H100)
    layout_before = [g["layout"] for g in gpus(h100)]
    h100.ssh("systemd-run --unit=gpu-training --collect /usr/bin/gpusim job --gpus 3 --name train")
    pid = int(h100.ssh("systemctl show -p MainPID --value gpu-training").stdout)
    assert [p for g in gpus(h100) for p in g["processes"]] == [pid]
    env = environment_copy(testbed_env, tmp_path, with_h100_profile("mig-small"))
    start = h100.ssh("date +%s.%N").stdout
    run = controller.run("site.yml", env, label="site-gpu-process")

    assert run.failed(H100)
    assert any(str(pid) in message for message in run.failures(H100)), run.failures(H100)
    # GPUs untouched, clients back, node cordoned with state failed and the PID recorded.
    assert [g["layout"] for g in gpus(h100)] == layout_before
    assert not [e for e in events(h100, float(start)) if e["event"] == "mig-parted-apply-start"]
    target = infra(h100)
    for unit in ("kubelet", "dcgm-exporter", "nvidia-dcgm"):
        assert target.service(unit).is_running, unit
    state = host_state(h100)
    assert state["state"] == "failed" and state["pids"] == [pid] and state["cordoned"] is True
    node = controller.node(H100)
    assert node["unschedulable"] is True
    assert node["labels"]["gpushare.io/mig-config.state"] == "failed"
    assert node["labels"]["gpushare.io/mig-config"] == converged_mig_config(testbed_env, H100)  # not switched
    # The other hosts are not affected.
    for name in (A100, L4):
        assert not run.failed(name), run.failures(name)
        assert run.changed(name) == 0, run.changed_tasks(name)
        assert controller.node(name)["unschedulable"] is False
    assert_layouts(testbed, testbed_env, names=(A100, L4))


def converged_mig_config(env: Path, name: str) -> str | None:
    return next(n.mig_config for n in resolve(env).nodes if n.name == name)


def test_changed_layout_is_applied_with_clients_restarted_in_order_and_relabelled_after_the_assert(
        testbed: Testbed, testbed_env: Path, controller: Controller, converged: PlaybookRun, tmp_path: Path) -> None:
    assert_ok(converged)
    h100 = testbed.host(H100)
    h100.ssh("systemctl stop gpu-training", check=False)  # the job of the previous test, if it ran, is done
    env = environment_copy(testbed_env, tmp_path, with_h100_profile("mig-small"))
    start = float(h100.ssh("date +%s.%N").stdout)
    run = controller.run("site.yml", env, limit="pool_h100_llm_serving", label="site-layout-change")
    assert_ok(run, hosts=(H100,))
    assert_layouts(testbed, env, names=(H100,))
    assert expected_layouts(env)[H100] == {"1g.10gb": 7}

    seen = [(e["event"], e.get("unit") or e.get("config") or e.get("output")) for e in events(h100, start)
            if e["event"] in ("start", "stop", "mig-parted-apply", "cdi-generate")]
    new_config = next(n.mig_config for n in resolve(env).nodes if n.name == H100)
    assert seen[:7] == [("stop", "kubelet"), ("stop", "dcgm-exporter"), ("stop", "nvidia-dcgm"),
                        ("mig-parted-apply", new_config), ("cdi-generate", "/var/run/cdi/nvidia.yaml"),
                        ("start", "nvidia-dcgm"), ("start", "dcgm-exporter")], seen
    assert seen[7] == ("start", "kubelet"), seen

    calls = controller.mutating_calls(H100, since=start)
    assert [c["verb"] for c in calls] == ["drain", "label", "uncordon"] or \
        [c["verb"] for c in calls] == ["cordon", "drain", "label", "uncordon"], calls
    label = next(c for c in calls if c["verb"] == "label")
    assert f"gpushare.io/mig-config={new_config}" in label["argv"]
    assert "gpushare.io/mig-config.state=success" in label["argv"]
    asserted = [e["t"] for e in events(h100, start) if e["event"] == "mig-parted-assert" and e["ok"]
                and e["config"] == new_config and not e["mode_only"]]
    assert asserted and min(asserted) < label["t"]
    assert controller.node(H100)["unschedulable"] is False
    assert host_state(h100)["state"] == "success"


def test_toolkit_below_the_cve_floor_is_refused(
        testbed: Testbed, testbed_env: Path, controller: Controller, converged: PlaybookRun, tmp_path: Path) -> None:
    assert_ok(converged)

    def old_toolkit(data: dict[str, Any]) -> None:
        data["defaults"]["toolkit_version"] = "1.17.8"

    env = environment_copy(testbed_env, tmp_path, old_toolkit)
    run = controller.run("site.yml", env, limit=L4, label="site-old-toolkit")
    assert run.failed(L4)
    message = " ".join(run.failures(L4))
    unfixed = [f.cve for f in load_guardrails().toolkit.unfixed("1.17.8")]
    assert unfixed and all(cve in message for cve in unfixed), message
    assert "CVE floor" in message
    assert run.changed(L4) == 0
    assert infra(testbed.host(L4)).package("nvidia-container-toolkit").version == "1.18.2-1"


def test_driver_branch_mismatch_is_refused(
        testbed: Testbed, testbed_env: Path, controller: Controller, converged: PlaybookRun, tmp_path: Path) -> None:
    assert_ok(converged)

    def other_branch(data: dict[str, Any]) -> None:
        pool = next(p for p in data["pools"] if p["name"] == "a100-inference")
        pool["hosts"][0]["driver_branch"] = 570

    env = environment_copy(testbed_env, tmp_path, other_branch)
    run = controller.run("site.yml", env, limit=A100, label="site-driver-mismatch")
    assert run.failed(A100)
    message = " ".join(run.failures(A100))
    assert "R580" in message and "R570" in message, message
    assert run.changed(A100) == 0
    assert [t for t in run.changed_tasks(A100)] == []


def test_rollout_preflight_stops_every_host_before_any_change(
        testbed: Testbed, testbed_env: Path, controller: Controller, converged: PlaybookRun, tmp_path: Path) -> None:
    assert_ok(converged)

    def mismatch_and_new_layout(data: dict[str, Any]) -> None:
        other_branch = next(p for p in data["pools"] if p["name"] == "l4-notebooks")
        other_branch["hosts"][0]["driver_branch"] = 570
        with_h100_profile("mig-balanced")(data)  # a change that must not start on any host

    env = environment_copy(testbed_env, tmp_path, mismatch_and_new_layout)
    before = {name: [g["layout"] for g in gpus(testbed.host(name))] for name in ALL}
    calls = len(controller.kubectl_calls())
    run = controller.run("rollout.yml", env, label="rollout-preflight")
    assert run.rc != 0 and run.failed(L4)
    for name in ALL:
        assert run.changed(name) == 0, (name, run.changed_tasks(name))
        assert [g["layout"] for g in gpus(testbed.host(name))] == before[name]
    assert [c for c in controller.kubectl_calls()[calls:] if c["verb"] != "get"] == []


def test_failing_dcgm_diagnostic_keeps_the_node_cordoned_until_it_passes(
        testbed: Testbed, testbed_env: Path, controller: Controller, converged: PlaybookRun) -> None:
    assert_ok(converged)
    host = testbed.host(L4)
    host.ssh("gpusim diag --gpu 2 --message 'simulated XID 79: GPU has fallen off the bus'")
    try:
        run = controller.run("site.yml", testbed_env, limit=L4, label="site-dcgm-failing")
        assert run.failed(L4)
        assert any("GPU 2" in m and "XID 79" in m for m in run.failures(L4)), run.failures(L4)
        assert controller.node(L4)["unschedulable"] is True
        assert host_state(host)["dcgm_diag"] == "failed" and host_state(host)["cordoned"] is True
    finally:
        host.ssh("gpusim diag --clear")
    healthy = controller.run("site.yml", testbed_env, limit=L4, label="site-dcgm-passing")
    assert_ok(healthy, hosts=(L4,))
    assert controller.node(L4)["unschedulable"] is False
    assert host_state(host)["dcgm_diag"] == "passed" and host_state(host)["cordoned"] is False


def test_reboot_reapplies_the_layout_through_the_unit(
        testbed: Testbed, testbed_env: Path, controller: Controller, converged: PlaybookRun) -> None:
    assert_ok(converged)
    host = testbed.host(A100)
    boots = host.boots
    host.reboot()
    assert host.boots == boots + 1
    boot_events = [e for e in events(host) if e["event"] == "boot-apply"]
    assert boot_events and boot_events[-1]["unit"] == converged_mig_config(testbed_env, A100)
    assert_layouts(testbed, testbed_env, names=(A100,))
    target = infra(host)
    assert target.check_output("systemctl show -p Result --value nvidia-mig-manager") == "success"
    verify = controller.run("verify.yml", testbed_env, limit=A100, label="verify-after-reboot")
    assert_ok(verify, hosts=(A100,))
