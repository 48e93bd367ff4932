"""Role gpu_process_exporter applied for real on an isolated test host (one L4 host of its own, an INI inventory with
the test hosts' group_vars), then scraped over the host's network namespace: a GPU job in a kubelet pod's cgroup
(systemd driver) and a host process on a time-sliced GPU, a pod-resources server on the kubelet's socket. End to
end (issue 41): two tenants' pods on a time-sliced GPU, the scrapes backfilled into a real Prometheus and read by
`gpushare showback --basis use` and `gpushare capacity`."""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.ops.prometheus import Prometheus
from gpushare.ops.showback import run_showback
from tests.ansible.conftest import TESTBED_ENV, infra
from tests.ansible.controller import Controller
from tests.ansible.testbed import HostSpec, Testbed
from tests.prometheus.scenarios import create_blocks
from tests.prometheus.server import prometheus_server
from tests.showback.scenarios import L4, STEP, History, gpu, node, shared_gpu
from tests.showback.scenarios import pod as ksm_pod

pytestmark = [pytest.mark.ansible, pytest.mark.slow]

HOST = "tb-l4-01"
UID = "5d0e8c1a-7b9f-4d4e-9a51-0c3f2e6a9b17"
CID = "c0ffee" + "0" * 58
PORT = 9835
# A stand-in kubelet: pod-resources v1 List over the socket, answering the pods of a JSON file
# ([pod, namespace, container, resource, [device ids]]), with the exporter's own message classes.
FAKE_KUBELET = r'''
import importlib.util, json, os, sys
from concurrent import futures
import grpc
spec = importlib.util.spec_from_file_location("gpe", "/opt/gpushare/process-exporter/gpushare_process_exporter.py")
gpe = importlib.util.module_from_spec(spec); spec.loader.exec_module(gpe)
request, response = gpe.podresources_messages()
answer = response()
for name, namespace, container_name, resource, devices in json.load(open(sys.argv[2])):
    pod = answer.pod_resources.add(name=name, namespace=namespace)
    container = pod.containers.add(name=container_name)
    container.devices.add(resource_name=resource, device_ids=devices)
server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
    "List": grpc.unary_unary_rpc_method_handler(lambda req, ctx: answer, request_deserializer=request.FromString,
                                                response_serializer=lambda m: m.SerializeToString())})])
if os.path.exists(sys.argv[1]):
    os.unlink(sys.argv[1])
server.add_insecure_port("unix://" + sys.argv[1])
server.start()
server.wait_for_termination()
'''


def start_kubelet(host: Any, unit: str, pods: list[list[Any]]) -> None:
    """The stand-in kubelet as a transient systemd service `unit` on the test host, answering `pods`."""
    host.ssh("cat > /root/fake_kubelet.py <<'EOF'\n" + FAKE_KUBELET + "\nEOF")
    host.ssh(f"cat > /root/{unit}.json <<'EOF'\n" + json.dumps(pods) + "\nEOF")
    host.ssh(f"systemd-run --unit={unit} /opt/gpushare/process-exporter/venv/bin/python "
             f"/root/fake_kubelet.py /var/lib/kubelet/pod-resources/kubelet.sock /root/{unit}.json")



@pytest.fixture(scope="module")
def bed():
    import os

    if os.geteuid() != 0:
        pytest.skip("the Ansible tests boot test hosts with systemd-nspawn in network namespaces: run as root")
    with Testbed([HostSpec(HOST, "NVIDIA L4", 4)], tag="gpe") as testbed:
        yield testbed


def inventory(bed: Testbed, tmp_path: Path) -> Path:
    shutil.copytree(TESTBED_ENV.parent / "group_vars", tmp_path / "group_vars")
    path = tmp_path / "hosts.ini"
    path.write_text(f"[gpu]\n{HOST} ansible_host={bed.host(HOST).address}\n")
    return path


def metrics(address: str) -> list[tuple[str, dict, float]]:
    text = urllib.request.urlopen(f"http://{address}:{PORT}/metrics", timeout=10).read().decode()
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            head, value = line.rsplit(" ", 1)
            name, _, labels = head.partition("{")
            pairs = dict(p.split("=", 1) for p in labels.rstrip("}").split('",') if p) if labels else {}
            out.append((name, {k: v.strip('"') for k, v in pairs.items()}, float(value)))
    return out


def test_role_runs_the_exporter_and_it_attributes_gpu_use(bed: Testbed, tmp_path: Path) -> None:
    host = bed.host(HOST)
    ctl = Controller(tmp_path / "controller", host.key)
    playbook = tmp_path / "exporter.yml"
    playbook.write_text("- hosts: gpu\n  become: true\n  gather_facts: false\n  roles:\n"
                        "    - gpushare.fleet.gpu_process_exporter\n")
    hosts = inventory(bed, tmp_path)
    extravars = {"gpu_process_exporter_tenants": {"team-a": "alpha"}}
    first = ctl.run(str(playbook), hosts, extravars=extravars, label="exporter-first")
    assert first.rc == 0 and not first.failed(HOST), f"{first.failures(HOST)}\n{first.summary()}"

    target = infra(host)
    assert target.service("gpushare-process-exporter").is_running
    main_pid = target.check_output("systemctl show -p MainPID --value gpushare-process-exporter")
    assert target.check_output(f"ps -o user= -p {main_pid}") == "gpushare-exporter"
    assert json.loads(target.file("/etc/gpushare/process-exporter/tenants.json").content_string) == {"team-a": "alpha"}

    # A kubelet answering on the socket created after the role ran (the directory's default ACL lets the service
    # user in), the pod's container log name, a GPU job in the pod's cgroup and a host process on GPU 0.
    gpu0 = json.loads(host.ssh("gpusim show").stdout)["gpus"][0]["uuid"]
    before = sum(v for name, lab, v in metrics(host.address)  # the site's own host processes (an MPS client)
                 if name == "gpushare_pod_gpu_memory_used_bytes" and lab["UUID"] == gpu0 and lab["pod"] == "")
    start_kubelet(host, "fake-podresources",
                  [["train-0", "team-a", "trainer", "nvidia.com/gpu", [f"{gpu0}::0", f"{gpu0}::1"]]])
    host.ssh(f"mkdir -p /var/log/containers && touch /var/log/containers/train-0_team-a_trainer-{CID}.log")
    slice_ = "kubepods-besteffort-pod" + UID.replace("-", "_") + ".slice"
    # A scope, as containerd's systemd cgroup driver makes: kubepods-besteffort-pod<uid>.slice/cri-containerd-<id>.scope
    host.ssh(f"nohup systemd-run --scope --unit=cri-containerd-{CID} --slice={slice_} gpusim job --gpus 0 "
             "--sm-util 70 --used-mib 2048 --name trainer >/dev/null 2>&1 </dev/null &")
    host.ssh("systemd-run --unit=host-job gpusim job --gpus 0 --sm-util 5 --used-mib 256 --name host")
    # The path unit grants the new socket to the service user (the kubelet's umask leaves it read-only otherwise).
    host.ssh("for i in $(seq 50); do getfacl -cp /var/lib/kubelet/pod-resources/kubelet.sock 2>/dev/null | "
             "grep -qx user:gpushare-exporter:rw- && [ $(ls /run/gpusim/procs | wc -l) -ge 2 ] && exit 0; "
             "sleep 0.2; done; exit 1")

    rows = metrics(host.address)
    up = {labels["source"]: value for name, labels, value in rows if name == "gpushare_process_exporter_up"}
    diagnosis = host.ssh("journalctl -u gpushare-process-exporter -u fake-podresources --no-pager | tail -40; "
                         "getfacl -p /var/lib/kubelet /var/lib/kubelet/pod-resources "
                         "/var/lib/kubelet/pod-resources/kubelet.sock", check=False)
    assert up == {"nvml": 1.0, "podresources": 1.0}, diagnosis.stdout + diagnosis.stderr
    sm = {(lab["namespace"], lab["pod"], lab["container"], lab["UUID"]): (lab, v) for name, lab, v in rows
          if name == "gpushare_pod_gpu_sm_utilization_ratio"}
    labels, value = sm[("team-a", "train-0", "trainer", gpu0)]
    assert value == pytest.approx(0.70), rows
    assert labels == {"Hostname": HOST, "UUID": gpu0, "gpu": "0", "GPU_I_ID": "", "namespace": "team-a",
                      "pod": "train-0", "pod_uid": UID, "container": "trainer", "tenant": "alpha",
                      "share": "time-slicing"}
    assert sm[("", "", "", gpu0)][1] == pytest.approx(0.05)
    memory = {(lab["pod"], lab["UUID"]): v for name, lab, v in rows if name == "gpushare_pod_gpu_memory_used_bytes"}
    assert memory[("train-0", gpu0)] == 2048 * 2**20 and memory[("", gpu0)] == before + 256 * 2**20
    shares = {lab["pod"]: v for name, lab, v in rows if name == "gpushare_pod_gpu_allocated_shares"}
    assert shares["train-0"] == 2

    again = ctl.run(str(playbook), hosts, extravars=extravars, label="exporter-rerun")
    assert again.rc == 0 and again.changed(HOST) == 0, again.changed_tasks(HOST)

    # The kubelet goes away: the scrape still answers, podresources down, the pod still named from its log.
    host.ssh("systemctl stop fake-podresources; rm -f /var/lib/kubelet/pod-resources/kubelet.sock")
    rows = metrics(host.address)
    up = {labels["source"]: value for name, labels, value in rows if name == "gpushare_process_exporter_up"}
    assert up == {"nvml": 1.0, "podresources": 0.0}
    assert any(n == "gpushare_pod_gpu_memory_used_bytes" and lab["pod"] == "train-0" for n, lab, _ in rows)


# ---------------------------------------------------------------- issue 41: the exporter's answers, end to end
# A time-sliced GPU shared by two tenants, measured by the real exporter on the test host, backfilled into a real
# Prometheus beside the series the shared-use showback scenario writes (tests/showback/scenarios.py), then read by
# `gpushare showback --basis use` and `gpushare capacity`.

WORKSPACE = Path(__file__).resolve().parents[1] / "fixtures"  # GPUSHARE_ROOT: the frozen profiles and guardrails
POOL = "l4-notebooks"  # dev's time-sliced pool (notebooks-ts4: 4 replicas a GPU) of one host with 4 L4s
TENANTS = {"ds-notebooks": "notebooks", "research-training": "research"}  # dev's tenants, by namespace
# namespace, pod, pod UID, container ID, SM %, framebuffer MiB, the replica of GPU 0 it holds
PODS = [("ds-notebooks", "notebook-0", "3f2a9c4e-1b7d-4e8a-9c6f-2d5b8a7e1c30", "feed01" + "0" * 58, 70, 2048, 0),
        ("research-training", "dev-0", "7c1e5b2d-9a4f-4c3e-8b6d-1f0a2e9d4b57", "feed02" + "0" * 58, 5, 256, 1)]
SM = "gpushare_pod_gpu_sm_utilization_ratio"
SCRAPES = 15  # one a minute: a 15-minute window, three of the capacity policy's 5-minute steps
WINDOW = f"{SCRAPES * STEP // 60}m"
END = 1_767_225_600  # 2026-01-01 00:00 UTC, as the showback tests' FIRST_END: a multiple of the 5m step
TOLERANCE = 0.001  # the showback tests' 0.1%



def close(a: float | None, b: float, tolerance: float = TOLERANCE) -> bool:
    return a is not None and abs(a - b) <= tolerance * max(abs(b), 1e-9)


def dev_environment(tmp_path: Path) -> Path:
    """The frozen dev environment with its L4 host named as the test host is (the exporter's Hostname and
    kube-state-metrics' node); everything else as it is, guardrails included (they are dev's)."""
    text = (WORKSPACE / "environments" / "dev.yaml").read_text()
    assert text.count("{name: dev-l4-01,") == 1
    path = tmp_path / "environments" / "dev.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.replace("{name: dev-l4-01,", f"{{name: {HOST},"))
    return path


def backfill_scrapes(scrapes: list[list[tuple[str, dict, float]]], data: Path, work: Path) -> None:
    """The scrapes' samples, the last at END, and for the same minutes the series the shared-use scenario writes
    for a time-sliced node (kube-state-metrics' node and pods, DCGM), backfilled with promtool."""
    h = History()
    first = END - (len(scrapes) - 1) * STEP
    for i, rows in enumerate(scrapes):
        # The timestamps are spread one scrape interval (a minute) apart, ending at END; the values are the
        # exporter's real answers, scrape by scrape. Empty labels dropped and `instance` added, as a scrape does.
        t = first + i * STEP
        for name, labels, value in rows:
            if name.startswith("gpushare_"):
                h.add(name, {k: v for k, v in labels.items() if v} | {"instance": f"{HOST}:{PORT}"}, t, t + STEP,
                      value)
    end = END + STEP
    node(h, HOST, POOL, first, end)
    holders = [(namespace, name) for namespace, name, *_ in PODS]
    for namespace, name in holders:
        ksm_pod(h, namespace, name, HOST, "nvidia_com_gpu_shared", first, end)
    # DCGM: GPU 0 busy for the two jobs' SM time together, copied to both replicas' pods; the host's three other
    # L4s idle. Its UUIDs are the helpers' (GPU-<node>-<index>), not gpusim's: showback and capacity join the
    # exporter's series to DCGM's by node and pool only.
    shared_gpu(h, HOST, L4, first, end, sum(p[4] for p in PODS) / 100, holders)
    for index in range(1, 4):
        gpu(h, HOST, index, L4, first, end, 0.0)
    source = work / "scrapes.om"
    with source.open("w") as out:
        h.write(out)
    create_blocks(source, data, len(scrapes) * STEP)


def check_end_to_end(scrapes: list[list[tuple[str, dict, float]]], gpu0: str, tmp_path: Path) -> None:
    """Prometheus per pod and tenant, showback by use, capacity per workload, over the backfilled scrapes (needs
    GPUSHARE_ROOT=WORKSPACE)."""
    env = dev_environment(tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    backfill_scrapes(scrapes, data, tmp_path)
    with prometheus_server(data, tmp_path, retention="3650d") as url:
        # 1. Per pod: the SM share, the tenant and the exporter's other labels, at the window's end.
        samples = Prometheus(url).query("per-pod SM", f'{SM}{{pod!=""}}', float(END))
        by_pod = {(s["metric"]["namespace"], s["metric"]["pod"]): s for s in samples}
        assert set(by_pod) == {(p[0], p[1]) for p in PODS}, samples
        for namespace, name, uid, _, sm, _, _ in PODS:
            metric = by_pod[(namespace, name)]["metric"]
            assert float(by_pod[(namespace, name)]["value"][1]) == pytest.approx(sm / 100), metric
            assert {k: metric.get(k) for k in ("Hostname", "UUID", "gpu", "pod_uid", "container", "tenant", "share")} \
                == {"Hostname": HOST, "UUID": gpu0, "gpu": "0", "pod_uid": uid, "container": "main",
                    "tenant": TENANTS[namespace], "share": "time-slicing"}, metric
        per_tenant = Prometheus(url).query("per-tenant SM", f'sum by (tenant) ({SM}{{pod!=""}})', float(END))
        assert {s["metric"]["tenant"]: pytest.approx(float(s["value"][1])) for s in per_tenant} == \
            {"notebooks": 0.70, "research": 0.05}

        # 2. Showback by use. From the formula (gpushare/ops/showback.py, split_by_use): per pool with physical
        # GPU-hours P, a tenant's use U_t, the pool's use U, the rest R = P - U, a tenant is charged
        # U_t + R * A_t / P (A_t: the GPU-hours it held) and idle is R * (P - A) / P.
        hours = SCRAPES * STEP / 3600
        physical = 4 * hours  # the host's four L4s, all reported by DCGM
        held = {TENANTS[p[0]]: hours / 4 for p in PODS}  # one of GPU 0's four replicas each
        use = {TENANTS[p[0]]: p[4] / 100 * hours for p in PODS}
        rest = physical - sum(use.values())
        charged = {t: use[t] + rest * held[t] / physical for t in use}
        idle = rest * (physical - sum(held.values())) / physical
        report = run_showback(str(env), url, WINDOW, float(END), source="raw", basis="use")
        rows = {r.tenant: r for r in report.rows if r.pool == POOL}
        assert set(rows) == {"notebooks", "research"}, report.as_dict()
        for tenant, row in rows.items():
            assert close(row.allocated_gpu_hours, held[tenant]), row
            assert close(row.sm_gpu_hours, use[tenant]), row
            assert close(row.gpu_hours, charged[tenant]), (row, charged)
        assert close(rows["notebooks"].gpu_hours / rows["research"].gpu_hours,
                     charged["notebooks"] / charged["research"])
        assert close(next(i.gpu_hours for i in report.idle if i.pool == POOL), idle), report.idle
        assert close(report.physical_gpu_hours, physical)
        total = sum(r.gpu_hours for r in report.rows) + sum(i.gpu_hours for i in report.idle)
        assert close(total, report.physical_gpu_hours), report.as_dict()

        # 3. Capacity per workload: the 70% pod's workload (notebook-0 -> notebook) crowds its GPU.
        result = CliRunner().invoke(app, ["capacity", "--env", str(env), "--prometheus", url, "--window", WINDOW,
                                          "--end", str(END), "--json", "--patch", str(tmp_path / "capacity.patch")])
        assert result.exit_code == 0, result.output
        pool = next(p for p in json.loads(result.stdout)["pools"] if p["pool"] == POOL)
        section = pool["per_workload"]
        assert section["available"] and section["replicas_now"] == 4, section
        assert section["crowding"] == ["ds-notebooks/notebook"], section
        workloads = {(w["namespace"], w["workload"]): w for w in section["workloads"]}
        notebook, research = workloads[("ds-notebooks", "notebook")], workloads[("research-training", "dev")]
        assert notebook["tenant"] == "notebooks" and notebook["crowds"] and notebook["sm_p95"] == pytest.approx(0.70)
        assert notebook["gpus"] == {f"{HOST}/{gpu0}": 1}
        assert research["tenant"] == "research" and not research["crowds"]
        assert research["sm_p95"] == pytest.approx(0.05)


def test_shared_gpu_use_reaches_prometheus_showback_and_capacity(bed: Testbed, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41: on the test host's time-sliced L4, notebooks' pod at 70% of the SM and research's at 5%; the real
    exporter scraped SCRAPES times, its answers backfilled and read back per pod and tenant, charged by use, and the
    70% workload named by capacity."""
    host = bed.host(HOST)
    ctl = Controller(tmp_path / "controller", host.key)
    playbook = tmp_path / "exporter.yml"
    playbook.write_text("- hosts: gpu\n  become: true\n  gather_facts: false\n  roles:\n"
                        "    - gpushare.fleet.gpu_process_exporter\n")
    run = ctl.run(str(playbook), inventory(bed, tmp_path), extravars={"gpu_process_exporter_tenants": TENANTS},
                  label="exporter-two-tenants")
    assert run.rc == 0 and not run.failed(HOST), f"{run.failures(HOST)}\n{run.summary()}"
    # What the test before may have left on GPU 0 (its pod's job, its host job, its kubelet) goes first.
    host.ssh(f"systemctl stop host-job.service cri-containerd-{CID}.scope fake-podresources.service; "
             "rm -f /var/lib/kubelet/pod-resources/kubelet.sock /var/log/containers/*.log", check=False)
    gpu0 = json.loads(host.ssh("gpusim show").stdout)["gpus"][0]["uuid"]
    start_kubelet(host, "fake-podresources-pods", [[name, namespace, "main", "nvidia.com/gpu.shared",
                                                    [f"{gpu0}::{replica}"]] for namespace, name, *_, replica in PODS])
    host.ssh("mkdir -p /var/log/containers")
    units = ["fake-podresources-pods.service"]
    try:
        for namespace, name, uid, cid, sm, mib, _ in PODS:
            host.ssh(f"touch /var/log/containers/{name}_{namespace}_main-{cid}.log")
            slice_ = "kubepods-besteffort-pod" + uid.replace("-", "_") + ".slice"
            host.ssh(f"nohup systemd-run --scope --unit=cri-containerd-{cid} --slice={slice_} gpusim job --gpus 0 "
                     f"--sm-util {sm} --used-mib {mib} --name {name} >/dev/null 2>&1 </dev/null &")
            units.append(f"cri-containerd-{cid}.scope")
        wanted = {(p[0], p[1]): p[4] / 100 for p in PODS}

        def per_pod(rows: list[tuple[str, dict, float]]) -> dict[tuple[str, str], float]:
            """Pods named, with their tenant, on a time-sliced replica (the kubelet's allocation seen)."""
            return {(lab["namespace"], lab["pod"]): v for name, lab, v in rows if name == SM and lab["pod"]
                    and lab["tenant"] == TENANTS.get(lab["namespace"]) and lab["share"] == "time-slicing"}

        deadline = time.monotonic() + 60
        while per_pod(rows := metrics(host.address)) != pytest.approx(wanted):
            if time.monotonic() > deadline:
                diagnosis = host.ssh("journalctl -u gpushare-process-exporter -u fake-podresources-pods --no-pager "
                                     "| tail -40; ls /run/gpusim/procs", check=False)
                pytest.fail(f"{rows}\n{diagnosis.stdout}{diagnosis.stderr}")
            time.sleep(0.3)
        scrapes = []
        for _ in range(SCRAPES):
            time.sleep(0.5)  # the scripted jobs keep producing samples between scrapes
            scrapes.append(metrics(host.address))
            assert per_pod(scrapes[-1]) == pytest.approx(wanted), scrapes[-1]
        monkeypatch.setenv("GPUSHARE_ROOT", str(WORKSPACE))
        check_end_to_end(scrapes, gpu0, tmp_path)
    finally:
        host.ssh("systemctl stop " + " ".join(units), check=False)
