"""What does one scrape of the per-process GPU exporter (role gpu_process_exporter) cost, and how does it grow with
the GPU processes on a host?

Run: python benchmarks/process_exporter.py [--gpus 8] [--procs 1,8,32] [--scrapes 200]. Builds a host in a temporary
folder: `--gpus` GPUs, each shared by P pod processes (P from --procs), every process with its /proc/<pid>/cgroup in
the kubelet's systemd form and its pod's and container's kubelet log names; a pod-resources server answering over
gRPC on a unix socket, as the kubelet does, with each pod's time-slicing replica; an NVML stand-in that answers from
prepared lists (so the figures are the exporter's own work: NVML's real cost is the driver's, which only a GPU shows).
Each scrape is what the HTTP handler does: collect() and render(). Prints the mean and 95th percentile per scrape,
the exposition size, and two ratios: the cost of P processes per GPU against one (how it grows), and the cost of a
scrape against the pod-resources call alone (what the mapping adds to the one call the exporter cannot avoid).
Target: a scrape of 8 GPUs x 32 processes under 50 ms here, growing at most linearly with the processes.
Not a timed test: figures go to benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
import uuid
from concurrent import futures
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parent.parent
EXPORTER = ROOT / ("gpushare/ansible_collections/gpushare/fleet/roles/gpu_process_exporter/files/"
                   "gpushare_process_exporter.py")
TARGET_MS = 50.0


def load_exporter() -> Any:
    spec = importlib.util.spec_from_file_location("gpushare_process_exporter", EXPORTER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class NVMLError(Exception):
    value = 999


class NVMLError_NotFound(NVMLError):  # noqa: N801 - nvidia-ml-py's name
    value = 6


class PreparedNVML:
    """nvidia-ml-py's calls the exporter makes, answered from lists built once; a new utilization sample per
    process per scrape, as a busy GPU gives."""

    NVMLError, NVMLError_NotFound = NVMLError, NVMLError_NotFound

    def __init__(self, gpus: dict[str, list[int]]) -> None:
        self.gpus = gpus  # uuid -> pids
        self.handles = list(gpus)
        self.clock = 0
        self.procs = {u: [SimpleNamespace(pid=p, usedGpuMemory=2**30, gpuInstanceId=0xFFFFFFFF,
                                          computeInstanceId=0xFFFFFFFF) for p in pids] for u, pids in gpus.items()}

    def nvmlInit(self) -> None:  # noqa: N802
        pass

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.handles)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:  # noqa: N802
        return self.handles[index]

    def nvmlDeviceGetUUID(self, handle: str) -> str:  # noqa: N802
        return handle

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: str) -> int:  # noqa: N802
        return 0

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Any]:  # noqa: N802
        return self.procs[handle]

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: str) -> list[Any]:  # noqa: N802
        return []

    def nvmlDeviceGetProcessUtilization(self, handle: str, timeStamp: int) -> list[Any]:  # noqa: N802, N803
        self.clock += 1
        return [SimpleNamespace(pid=p, timeStamp=timeStamp + self.clock, smUtil=40, memUtil=10, encUtil=0, decUtil=0)
                for p in self.gpus[handle]]


def build_host(folder: Path, gpus: int, per_gpu: int) -> tuple[dict[str, list[int]], list[dict[str, Any]]]:
    """The /proc cgroups, kubelet log names and pod-resources answer of `gpus` GPUs x `per_gpu` pod processes."""
    layout: dict[str, list[int]] = {}
    pods: list[dict[str, Any]] = []
    (folder / "log" / "containers").mkdir(parents=True)
    (folder / "log" / "pods").mkdir()
    pid = 1000
    for g in range(gpus):
        gpu = f"GPU-{uuid.UUID(int=g + 1)}"
        layout[gpu] = []
        for r in range(per_gpu):
            pid += 1
            pod_uid, container_id = str(uuid.uuid4()), uuid.uuid4().hex * 2
            name, namespace = f"work-{g}-{r}", f"team-{r % 4}"
            cgroup = folder / "proc" / str(pid)
            cgroup.mkdir(parents=True)
            (cgroup / "cgroup").write_text(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                f"{pod_uid.replace('-', '_')}.slice/cri-containerd-{container_id}.scope\n")
            (folder / "log" / "containers" / f"{name}_{namespace}_main-{container_id}.log").touch()
            (folder / "log" / "pods" / f"{namespace}_{name}_{pod_uid}").mkdir()
            pods.append({"name": name, "namespace": namespace, "containers": [{"name": "main", "devices": [
                {"resource_name": "nvidia.com/gpu", "device_ids": [f"{gpu}::{r}"]}]}]})
            layout[gpu].append(pid)
    return layout, pods


def serve_pod_resources(gpe: Any, path: Path, pods: list[dict[str, Any]]) -> grpc.Server:
    request, response = gpe.podresources_messages()
    answer = response(pod_resources=pods)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
        "List": grpc.unary_unary_rpc_method_handler(lambda req, ctx: answer, request_deserializer=request.FromString,
                                                    response_serializer=lambda m: m.SerializeToString())})])
    server.add_insecure_port(f"unix://{path}")
    server.start()
    return server


def timed(fn: Any, repeat: int) -> list[float]:
    fn()  # warm: channel set-up, first directory reads
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def run(gpus: int, per_gpu: int, scrapes: int) -> dict[str, float]:
    gpe = load_exporter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        layout, pods = build_host(folder, gpus, per_gpu)
        sock = folder / "kubelet.sock"
        server = serve_pod_resources(gpe, sock, pods)
        try:
            exporter = gpe.Exporter(PreparedNVML(layout), "node-1", str(sock), proc_root=str(folder / "proc"),
                                    log_root=str(folder / "log"))
            size = 0

            def scrape() -> None:
                nonlocal size
                samples, up = exporter.collect()
                assert up == {"nvml": 1, "podresources": 1}, up
                size = len(gpe.render(samples, up))

            scrape_ms = timed(scrape, scrapes)
            call_ms = timed(lambda: gpe.list_pod_resources(str(sock), 2.0), scrapes)
        finally:
            server.stop(None)
    return {"mean": statistics.mean(scrape_ms), "p95": sorted(scrape_ms)[int(0.95 * len(scrape_ms)) - 1],
            "call": statistics.mean(call_ms), "bytes": size}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--procs", default="1,8,32", help="processes per GPU, comma-separated")
    parser.add_argument("--scrapes", type=int, default=200)
    args = parser.parse_args()
    counts = [int(p) for p in args.procs.split(",")]
    results = {p: run(args.gpus, p, args.scrapes) for p in counts}
    base = results[counts[0]]["mean"]
    print(f"{'procs/GPU':>9} {'processes':>9} {'mean ms':>8} {'p95 ms':>7} {'x first':>8} {'per proc ms':>11} "
          f"{'pod-res ms':>10} {'x pod-res':>9} {'bytes':>8}")
    for p in counts:
        r = results[p]
        total = p * args.gpus
        print(f"{p:>9} {total:>9} {r['mean']:>8.2f} {r['p95']:>7.2f} {r['mean'] / base:>8.2f} "
              f"{r['mean'] / total:>11.3f} {r['call']:>10.2f} {r['mean'] / r['call']:>9.2f} {r['bytes']:>8}")
    last = results[counts[-1]]
    growth = (last["mean"] / base) / (counts[-1] / counts[0])
    print(f"growth against the processes (1.0 = linear): {growth:.2f}; "
          f"{args.gpus}x{counts[-1]} mean {last['mean']:.1f} ms against the {TARGET_MS:.0f} ms target")
    return 0 if last["mean"] <= TARGET_MS and growth <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
