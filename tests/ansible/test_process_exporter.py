"""The per-process GPU exporter (role gpu_process_exporter, files/gpushare_process_exporter.py) in-process: a fake
NVML module, a fake /proc and kubelet log directories in tmp_path, and a fake kubelet pod-resources server (gRPC on a
unix socket in tmp_path)."""

from __future__ import annotations

import importlib.util
import logging
import socket
import threading
import time
import urllib.request
from concurrent import futures
from pathlib import Path
from types import SimpleNamespace

import pytest

grpc = pytest.importorskip("grpc")

EXPORTER = (Path(__file__).resolve().parents[2] / "gpushare/ansible_collections/gpushare/fleet/roles"
            / "gpu_process_exporter/files/gpushare_process_exporter.py")
_spec = importlib.util.spec_from_file_location("gpushare_process_exporter", EXPORTER)
gpe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpe)

GPU0, GPU1 = "GPU-11111111-1111-1111-1111-111111111111", "GPU-22222222-2222-2222-2222-222222222222"
UID_A, UID_B = "aaaaaaaa-0000-4000-8000-000000000001", "bbbbbbbb-0000-4000-8000-000000000002"
CID_A, CID_B = "a" * 64, "b" * 64


# ---------------------------------------------------------------- fakes


class NVMLError(Exception):
    value = 999


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - nvidia-ml-py's names
    value = 3


class NVMLError_NotFound(NVMLError):  # noqa: N801
    value = 6


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801
    value = 12


class FakeNVML:
    """The calls the exporter makes, with nvidia-ml-py's signatures and error classes."""

    NVMLError, NVMLError_NotSupported, NVMLError_NotFound = NVMLError, NVMLError_NotSupported, NVMLError_NotFound

    def __init__(self, gpus: dict, init_error: Exception | None = None, util_error: Exception | None = None):
        self.gpus, self.init_error, self.util_error = gpus, init_error, util_error  # uuid -> {procs, samples}
        self.timestamps: list[int] = []

    def nvmlInit(self):  # noqa: N802
        if self.init_error:
            raise self.init_error

    def nvmlDeviceGetCount(self):  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):  # noqa: N802
        return list(self.gpus)[index]

    def nvmlDeviceGetUUID(self, handle):  # noqa: N802
        return handle

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):  # noqa: N802
        raise NVMLError_NotSupported()

    def nvmlDeviceGetComputeRunningProcesses(self, handle):  # noqa: N802
        return [SimpleNamespace(pid=pid, usedGpuMemory=mem, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
                for pid, mem in self.gpus[handle]["procs"].items()]

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle):  # noqa: N802
        return []

    def nvmlDeviceGetProcessUtilization(self, handle, timeStamp):  # noqa: N802, N803
        self.timestamps.append(timeStamp)
        if self.util_error:
            raise self.util_error
        samples = [SimpleNamespace(pid=pid, timeStamp=ts, smUtil=sm, memUtil=mem, encUtil=0, decUtil=0)
                   for pid, ts, sm, mem in self.gpus[handle]["samples"] if ts > timeStamp]
        if not samples:
            raise NVMLError_NotFound()
        return samples


def write_proc(root: Path, pid: int, cgroup: str) -> None:
    (root / "proc" / str(pid)).mkdir(parents=True)
    (root / "proc" / str(pid) / "cgroup").write_text(cgroup)


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """Two tenants' pods on time-sliced GPU0 (systemd driver, cgroup v2; cgroupfs driver, cgroup v1), a host
    process on GPU0 and GPU1, and a pod whose container log is missing (container found through pod-resources)."""
    write_proc(tmp_path, 100, "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
               f"{UID_A.replace('-', '_')}.slice/cri-containerd-{CID_A}.scope\n")
    write_proc(tmp_path, 200, f"12:memory:/kubepods/besteffort/pod{UID_B}/{CID_B}\n"
               f"11:cpu,cpuacct:/kubepods/besteffort/pod{UID_B}/{CID_B}\n")
    write_proc(tmp_path, 300, "0::/system.slice/ollama.service\n")
    logs = tmp_path / "log"
    (logs / "containers").mkdir(parents=True)
    (logs / "pods").mkdir()
    (logs / "containers" / f"train-0_team-a_trainer-{CID_A}.log").touch()
    (logs / "pods" / f"team-a_train-0_{UID_A}").mkdir()
    (logs / "pods" / f"team-b_infer-7f9_{UID_B}").mkdir()
    (tmp_path / "tenants.json").write_text('{"team-a": "alpha", "team-b": "beta"}')
    return tmp_path


def shared_nvml(**kwargs) -> FakeNVML:
    return FakeNVML({
        GPU0: {"procs": {100: 30 * 2**30, 200: 2 * 2**30, 300: 2**28},
               "samples": [(100, 10, 60, 20), (100, 20, 80, 30), (200, 15, 5, 1), (300, 18, 1, 0)]},
        GPU1: {"procs": {300: 2**28}, "samples": []},
    }, **kwargs)


ALLOCATIONS = {"pod_resources": [
    {"name": "train-0", "namespace": "team-a", "containers": [
        {"name": "trainer",
         "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": [f"{GPU0}::0", f"{GPU0}::1"]}]},
        {"name": "sidecar", "devices": []}]},
    {"name": "infer-7f9", "namespace": "team-b", "containers": [
        {"name": "server", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": [f"{GPU0}::3"]}]}]},
    {"name": "idle", "namespace": "team-b", "containers": [
        {"name": "main", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": [GPU1]}]}]},
    {"name": "nic", "namespace": "net", "containers": [
        {"name": "main", "devices": [{"resource_name": "example.com/nic", "device_ids": ["eth9"]}]}]},
]}


@pytest.fixture
def kubelet(host: Path):
    """A pod-resources server: `mode` 'ok', 'garbage' (bytes that are no ListPodResourcesResponse) or 'slow'."""
    request, response = gpe.podresources_messages()
    state = {"mode": "ok"}

    def list_(req, context):
        if state["mode"] == "slow":
            time.sleep(1.5)
        return ALLOCATIONS

    def serialize(answer):
        if state["mode"] == "garbage":
            return b"\xff\xff\xff\xff garbage"
        return response(**answer).SerializeToString() if isinstance(answer, dict) else answer.SerializeToString()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
        "List": grpc.unary_unary_rpc_method_handler(list_, request_deserializer=request.FromString,
                                                    response_serializer=serialize)})])
    path = host / "kubelet.sock"
    server.add_insecure_port(f"unix://{path}")
    server.start()
    yield SimpleNamespace(path=path, state=state)
    server.stop(None)


def exporter(host: Path, nvml, socket_path: Path, timeout: float = 1.0) -> gpe.Exporter:
    return gpe.Exporter(nvml, "node-1", str(socket_path), str(host / "tenants.json"), proc_root=str(host / "proc"),
                        log_root=str(host / "log"), timeout=timeout)


def table(samples) -> dict:
    """metric -> {(namespace, pod, container, UUID): (labels, value)}"""
    out: dict = {}
    for name, labels, value in samples:
        if labels:
            out.setdefault(name, {})[(labels["namespace"], labels["pod"], labels["container"], labels["UUID"])] = \
                (labels, value)
    return out


# ---------------------------------------------------------------- the shared GPU


def test_two_tenants_on_one_time_sliced_gpu(host, kubelet):
    samples, up = exporter(host, shared_nvml(), kubelet.path).collect()
    assert up == {"nvml": 1, "podresources": 1}
    t = table(samples)
    sm, mem, shares = (t[f"gpushare_pod_gpu_{m}"] for m in ("sm_utilization_ratio", "memory_used_bytes",
                                                             "allocated_shares"))
    a, b = ("team-a", "train-0", "trainer", GPU0), ("team-b", "infer-7f9", "server", GPU0)
    assert sm[a][1] == pytest.approx(0.70) and sm[b][1] == pytest.approx(0.05)
    assert sm[a][0] == {"Hostname": "node-1", "UUID": GPU0, "gpu": "0", "GPU_I_ID": "", "namespace": "team-a",
                        "pod": "train-0", "pod_uid": UID_A, "container": "trainer", "tenant": "alpha",
                        "share": "time-slicing"}
    # the cgroupfs pod without a container log: its one GPU container from pod-resources
    assert sm[b][0]["pod_uid"] == UID_B and sm[b][0]["tenant"] == "beta"
    assert mem[a][1] == 30 * 2**30 and mem[b][1] == 2 * 2**30
    assert shares[a][1] == 2 and shares[b][1] == 1
    # host processes: under pod="" container="", never dropped, on each GPU they use
    assert mem[("", "", "", GPU0)][1] == 2**28 and sm[("", "", "", GPU0)][1] == pytest.approx(0.01)
    assert mem[("", "", "", GPU1)][1] == 2**28 and shares[("", "", "", GPU0)][1] == 0
    assert mem[("", "", "", GPU0)][0]["tenant"] == "" and mem[("", "", "", GPU0)][0]["pod_uid"] == ""
    # an allocated GPU without processes: idle, exclusive; other plugins' devices ignored
    idle = ("team-b", "idle", "main", GPU1)
    assert sm[idle][1] == 0 and mem[idle][1] == 0 and shares[idle][1] == 1 and shares[idle][0]["share"] == "exclusive"
    assert not any(k[0] == "net" for k in shares)


def test_samples_window_moves_between_scrapes(host, kubelet):
    nvml = shared_nvml()
    exp = exporter(host, nvml, kubelet.path)
    exp.collect()
    samples, _ = exp.collect()  # nothing newer than the last sample: every process idle, not stale figures
    assert nvml.timestamps == [0, 0, 20, 0]
    sm = table(samples)["gpushare_pod_gpu_sm_utilization_ratio"]
    assert sm[("team-a", "train-0", "trainer", GPU0)][1] == 0


def test_exposition_over_http(host, kubelet):
    exp = exporter(host, shared_nvml(), kubelet.path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = gpe.serve(exp, "127.0.0.1", port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        server.shutdown()
    assert "# TYPE gpushare_pod_gpu_sm_utilization_ratio gauge" in text
    assert ('gpushare_pod_gpu_sm_utilization_ratio{Hostname="node-1",UUID="' + GPU0 + '",gpu="0",GPU_I_ID="",'
            'namespace="team-a",pod="train-0",pod_uid="' + UID_A + '",container="trainer",tenant="alpha",'
            'share="time-slicing"} 0.7') in text
    assert 'gpushare_process_exporter_up{source="nvml"} 1.0' in text
    assert 'gpushare_process_exporter_up{source="podresources"} 1.0' in text
    assert "gpushare_process_exporter_scrape_duration_seconds " in text


# ---------------------------------------------------------------- bad answers: up metrics, no crash


def test_nvml_init_fails(host, kubelet, caplog):
    exp = exporter(host, shared_nvml(init_error=NVMLError_LibraryNotFound()), kubelet.path)
    with caplog.at_level(logging.INFO, logger="gpushare-process-exporter"):
        for _ in range(3):
            samples, up = exp.collect()
    assert up == {"nvml": 0, "podresources": 1}
    assert len([r for r in caplog.records if r.getMessage().startswith("nvml down")]) == 1  # per state change
    assert table(samples) == {}  # without NVML no device ID can be placed on a GPU of this host: no pod series
    text = gpe.render(samples, up)
    assert 'gpushare_process_exporter_up{source="nvml"} 0.0' in text


def test_process_utilization_not_supported(host, kubelet):
    samples, up = exporter(host, shared_nvml(util_error=NVMLError_NotSupported()), kubelet.path).collect()
    t = table(samples)
    assert up["nvml"] == 1 and "gpushare_pod_gpu_sm_utilization_ratio" not in t  # absent, not a false 0
    assert t["gpushare_pod_gpu_memory_used_bytes"][("team-a", "train-0", "trainer", GPU0)][1] == 30 * 2**30


def test_vanished_pid_and_cgroup_without_pod(host, kubelet):
    nvml = shared_nvml()
    nvml.gpus[GPU0]["procs"][999] = 2**20  # NVML listed it; /proc has no such pid any more
    write_proc(host, 400, "0::/user.slice/user-1000.slice/session-3.scope\n")
    nvml.gpus[GPU0]["procs"][400] = 2**20
    samples, up = exporter(host, nvml, kubelet.path).collect()
    assert up == {"nvml": 1, "podresources": 1}
    mem = table(samples)["gpushare_pod_gpu_memory_used_bytes"]
    assert mem[("", "", "", GPU0)][1] == 2**28 + 2 * 2**20


def test_socket_missing(host):
    samples, up = exporter(host, shared_nvml(), host / "absent.sock").collect()
    assert up == {"nvml": 1, "podresources": 0}
    t = table(samples)
    labels, value = t["gpushare_pod_gpu_sm_utilization_ratio"][("team-a", "train-0", "trainer", GPU0)]
    assert value == pytest.approx(0.70) and labels["pod_uid"] == UID_A  # names from the kubelet's log directories
    # the cgroupfs pod without a container log: pod known, container not
    assert t["gpushare_pod_gpu_memory_used_bytes"][("team-b", "infer-7f9", "", GPU0)][0]["pod_uid"] == UID_B


@pytest.mark.parametrize("mode", ["garbage", "slow"])
def test_socket_answers_garbage_or_times_out(host, kubelet, mode):
    kubelet.state["mode"] = mode
    exp = exporter(host, shared_nvml(), kubelet.path, timeout=0.5)
    samples, up = exp.collect()
    assert up == {"nvml": 1, "podresources": 0}
    assert table(samples)["gpushare_pod_gpu_memory_used_bytes"]
    kubelet.state["mode"] = "ok"
    time.sleep(1.2 if mode == "slow" else 0)
    assert exp.collect()[1] == {"nvml": 1, "podresources": 1}


def test_socket_is_not_grpc(host):
    path = host / "plain.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(1)

    def answer():
        conn, _ = listener.accept()
        conn.sendall(b"HTTP/1.1 200 OK\r\n\r\nnot grpc")
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    try:
        _, up = exporter(host, shared_nvml(), path, timeout=0.5).collect()
    finally:
        listener.close()
    assert up == {"nvml": 1, "podresources": 0}


@pytest.mark.parametrize("text, expected", [
    ("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + UID_A.replace("-", "_")
     + ".slice/cri-containerd-" + CID_A + ".scope\n", (UID_A, CID_A)),
    ("0::/kubepods.slice/kubepods-pod" + UID_A.replace("-", "_") + ".slice/crio-" + CID_B + ".scope\n",
     (UID_A, CID_B)),
    ("4:pids:/kubepods/pod" + UID_B + "/" + CID_A + "\n", (UID_B, CID_A)),
    ("1:name=systemd:/kubepods/burstable/pod" + UID_B + "/" + CID_B + "\n0::/\n", (UID_B, CID_B)),
    ("0::/kubepods/besteffort/pod" + UID_B + "\n", (UID_B, "")),
    ("0::/system.slice/containerd.service\n", ("", "")),
    ("", ("", "")),
])
def test_pod_of_cgroup(text, expected):
    assert gpe.pod_of(text) == expected


# ---------------------------------------------------------------- the test hosts' NVML simulator


SIM = Path(__file__).resolve().parent / "fixture_packages" / "sim"


@pytest.fixture
def sim(tmp_path: Path, monkeypatch):
    """The simulator (fixture_packages/sim/pynvml.py) in-process over two L4 GPUs in tmp_path."""
    from tests.ansible.packages import simulator_tables

    (tmp_path / "tables.json").write_text(__import__("json").dumps(simulator_tables()))
    (tmp_path / "driver.json").write_text('{"version": "580.95.05", "cuda": 13000}')
    (tmp_path / "hardware.json").write_text('{"model": "NVIDIA L4", "count": 2, "host": "tb-l4-01"}')
    for name, value in (("HARDWARE", "hardware.json"), ("DRIVER", "driver.json"), ("TABLES", "tables.json"),
                        ("STATE_DIR", "state"), ("PROCS_DIR", "procs")):
        monkeypatch.setenv(f"GPUSIM_{name}", str(tmp_path / value))
    spec = importlib.util.spec_from_file_location("gpusim_nvml_under_test", SIM / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.nvmlInit()
    return module


def test_simulator_calls_have_nvidia_ml_py_signatures(sim):
    import inspect

    real = pytest.importorskip("pynvml")
    for name in ("nvmlDeviceGetProcessUtilization", "nvmlDeviceGetComputeRunningProcesses",
                 "nvmlDeviceGetMPSComputeRunningProcesses"):
        assert inspect.signature(getattr(sim, name)) == inspect.signature(getattr(real, name)), name
    assert [f[0] for f in sim.c_nvmlProcessUtilizationSample_t._fields_] == \
        [f[0] for f in real.c_nvmlProcessUtilizationSample_t._fields_]
    assert sim.NVMLError_NotFound.value == real.NVML_ERROR_NOT_FOUND
    assert sim.NVMLError_NotSupported.value == real.NVML_ERROR_NOT_SUPPORTED


def test_simulator_process_samples(sim):
    gpu0 = sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(sim.NVMLError_NotFound):  # no process, no sample
        sim.nvmlDeviceGetProcessUtilization(gpu0, 0)
    me = __import__("os").getpid()
    sim.gpusim_register(me, "compute", [0], used_memory=3 * 2**30, sm_util=70, mem_util=12, gi=None)
    sim.gpusim_register(1, "client", [0], sm_util=5)  # an MPS client (pid 1 is alive)
    # existing callers: a process without the new fields as before
    procs = sim.nvmlDeviceGetComputeRunningProcesses(gpu0)
    assert [(p.pid, p.usedGpuMemory, p.gpuInstanceId) for p in procs] == [(me, 3 * 2**30, 0xFFFFFFFF)]
    assert [p.pid for p in sim.nvmlDeviceGetMPSComputeRunningProcesses(gpu0)] == [1]
    samples = sim.nvmlDeviceGetProcessUtilization(gpu0, 0)
    assert sorted((s.pid, s.smUtil, s.memUtil) for s in samples) == [(1, 5, 0), (me, 70, 12)]
    with pytest.raises(sim.NVMLError_NotFound):  # nothing newer than the newest sample
        sim.nvmlDeviceGetProcessUtilization(gpu0, max(s.timeStamp for s in samples) + 10**9)
    with pytest.raises(sim.NVMLError_NotFound):  # GPU 1 has none
        sim.nvmlDeviceGetProcessUtilization(sim.nvmlDeviceGetHandleByIndex(1), 0)


def test_exporter_over_the_simulator(sim, tmp_path):
    import os

    me = os.getpid()
    sim.gpusim_register(me, "compute", [0], used_memory=2**30, sm_util=70)
    sim.gpusim_register(1, "client", [0], used_memory=2**29, sm_util=5)
    write_proc(tmp_path, me, f"0::/kubepods.slice/kubepods-pod{UID_A.replace('-', '_')}.slice/"
               f"cri-containerd-{CID_A}.scope\n")
    write_proc(tmp_path, 1, "0::/init.scope\n")
    (tmp_path / "log" / "containers").mkdir(parents=True)
    (tmp_path / "log" / "containers" / f"train-0_team-a_trainer-{CID_A}.log").touch()
    exp = gpe.Exporter(sim, "tb-l4-01", str(tmp_path / "absent.sock"), proc_root=str(tmp_path / "proc"),
                       log_root=str(tmp_path / "log"))
    samples, up = exp.collect()
    assert up == {"nvml": 1, "podresources": 0}
    t = table(samples)
    gpu0 = sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetHandleByIndex(0))
    sm = t["gpushare_pod_gpu_sm_utilization_ratio"]
    assert sm[("team-a", "train-0", "trainer", gpu0)][1] == pytest.approx(0.70)
    host = sm[("", "", "", gpu0)]
    assert host[1] == pytest.approx(0.05) and host[0]["share"] == "mps"  # the MPS client, a host process here
    assert t["gpushare_pod_gpu_memory_used_bytes"][("", "", "", gpu0)][1] == 2**29
