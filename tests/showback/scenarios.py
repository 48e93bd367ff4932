"""Showback histories for a real Prometheus: DCGM and kube-state-metrics series over six-hour slots, one scenario a
slot, all written to one OpenMetrics file and backfilled once (tests/prometheus/scenarios.create_blocks).

Labels follow the exporters (see tests/prometheus/scenarios.py): dcgm-exporter's hostname (Hostname on
OLD_EXPORTER_NODES, whose exporters predate 4.6.0-4.8.3)/UUID/modelName, MIG's
GPU_I_ID/GPU_I_PROFILE, `vgpu` with pod/namespace per replica on shared GPUs (the device's GR_ENGINE_ACTIVE
copied to every replica's pod); kube-state-metrics' sanitised resources and `label_*` node labels; gpushare's
per-process exporter's gpushare_pod_gpu_* series per pod container (scenario shared-use)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from gpushare.render.monitoring.promql import HOST_LABEL, LEGACY_HOST_LABEL
from tests.prometheus.scenarios import create_blocks

STEP = 60
SLOT = 6 * 3600  # the window of every scenario
H100, A100, L4 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L4"
MIG_LAYOUT = (("3g.40gb", 1), ("2g.20gb", 2), ("1g.10gb", 3), ("1g.10gb", 4))  # profile, GPU_I_ID (mig-balanced)

Value = float | Callable[[int], float]
# Nodes whose dcgm-exporter still writes `Hostname`: each scenario mixes both spellings, as a fleet mid-upgrade does.
OLD_EXPORTER_NODES = frozenset({"ts-node", "mig-node"})


def host_label(node: str) -> str:
    return LEGACY_HOST_LABEL if node in OLD_EXPORTER_NODES else HOST_LABEL


@dataclass
class History:
    samples: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    def add(self, name: str, labels: dict[str, str], start: int, end: int, value: Value) -> None:
        """One sample a minute in [start, end)."""
        key = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
        points = self.samples.setdefault(key, [])
        for t in range(start, end, STEP):
            points.append((t, value(t) if callable(value) else value))

    def write(self, out: TextIO) -> int:
        count = 0
        for key in sorted(self.samples):
            points = sorted(dict(self.samples[key]).items())  # one value per timestamp, in time order
            out.writelines(f"{key} {v:.6g} {t}\n" for t, v in points)
            count += len(points)
        out.write("# EOF\n")
        return count


def node(h: History, name: str, pool: str, start: int, end: int) -> None:
    h.add("kube_node_labels", {"node": name, "label_gpushare_io_pool": pool}, start, end, 1)


def pod(h: History, namespace: str, name: str, on: str, resource: str, start: int, end: int, count: int = 1) -> None:
    h.add("kube_pod_container_resource_requests", {"namespace": namespace, "pod": name, "container": "main",
                                                   "node": on, "resource": resource, "unit": "integer"},
          start, end, count)
    h.add("kube_pod_status_phase", {"namespace": namespace, "pod": name, "phase": "Running"}, start, end, 1)


def gpu(h: History, on: str, index: int, model: str, start: int, end: int, busy: Value,
        holder: tuple[str, str] | None = None, mig: tuple[str, int] | None = None, instance: str = "exporter-a"
        ) -> None:
    """One whole GPU or MIG instance's profiling series; `holder` (namespace, pod) where a pod holds it."""
    labels = {host_label(on): on, "UUID": f"GPU-{on}-{index}", "gpu": str(index), "modelName": model,
              "instance": instance}
    if mig:
        labels |= {"GPU_I_PROFILE": mig[0], "GPU_I_ID": str(mig[1])}
    if holder:
        labels |= {"namespace": holder[0], "pod": holder[1]}
    h.add("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, start, end, busy)


def shared_gpu(h: History, on: str, model: str, start: int, end: int, busy: float,
               holders: list[tuple[str, str]]) -> None:
    """A time-sliced or MPS GPU with --kubernetes-virtual-gpus: the device's busy share copied to every replica's
    pod series, GPU_UTIL per pod."""
    base = {host_label(on): on, "UUID": f"GPU-{on}-0", "gpu": "0", "modelName": model, "instance": "exporter-a"}
    for v, (namespace, name) in enumerate(holders):
        labels = {**base, "vgpu": str(v), "namespace": namespace, "pod": name}
        h.add("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, start, end, busy)
        h.add("DCGM_FI_DEV_GPU_UTIL", labels, start, end, 100 * busy / len(holders))


# ---------------------------------------------------------------- the scenarios: (environment file, end)


def mixed(h: History, start: int, end: int) -> None:
    """Every sharing kind at once. Whole pool: research holds 1 of 2 GPUs at 60% busy. MIG: search holds the
    3g.40gb (50% busy), research a 1g.10gb (20% busy). Time-slicing: nb holds 3 of 4 replicas. MPS: inference 2 of
    4 clients."""
    for name, pool in (("whole-node", "whole-pool"), ("mig-node", "mig-pool"), ("ts-node", "ts-pool"),
                       ("mps-node", "mps-pool")):
        node(h, name, pool, start, end)
    pod(h, "research", "train-0", "whole-node", "nvidia_com_gpu", start, end)
    gpu(h, "whole-node", 0, H100, start, end, 0.6, ("research", "train-0"))
    gpu(h, "whole-node", 1, H100, start, end, 0.0)
    pod(h, "search", "serve-0", "mig-node", "nvidia_com_mig_3g_40gb", start, end)
    pod(h, "research", "small-0", "mig-node", "nvidia_com_mig_1g_10gb", start, end)
    busy = {2: 0.0, 3: 0.2, 4: 0.0, 1: 0.5}
    holders = {1: ("search", "serve-0"), 3: ("research", "small-0")}
    for profile, instance in MIG_LAYOUT:
        gpu(h, "mig-node", 0, A100, start, end, busy[instance], holders.get(instance), (profile, instance))
    nb = [("nb", f"notebook-{i}") for i in range(3)]
    for _, name in nb:
        pod(h, "nb", name, "ts-node", "nvidia_com_gpu_shared", start, end)
    shared_gpu(h, "ts-node", L4, start, end, 0.9, nb)
    inference = [("inference", f"mps-{i}") for i in range(2)]
    for _, name in inference:
        pod(h, "inference", name, "mps-node", "nvidia_com_gpu_shared", start, end)
    shared_gpu(h, "mps-node", L4, start, end, 0.4, inference)


def mig_only(h: History, start: int, end: int) -> None:
    """One A100 in instances: search holds the 3g.40gb and the 2g.20gb, research both 1g.10gb; all 30% busy."""
    node(h, "mig-only-node", "mig-only-pool", start, end)
    resources = {"3g.40gb": "nvidia_com_mig_3g_40gb", "2g.20gb": "nvidia_com_mig_2g_20gb",
                 "1g.10gb": "nvidia_com_mig_1g_10gb"}
    for profile, instance in MIG_LAYOUT:
        namespace = "research" if profile == "1g.10gb" else "search"
        name = f"{namespace}-{instance}"
        pod(h, namespace, name, "mig-only-node", resources[profile], start, end)
        gpu(h, "mig-only-node", 0, A100, start, end, 0.3, (namespace, name), (profile, instance))


def pod_moves(h: History, start: int, end: int) -> None:
    """research's pod runs on a time-sliced replica for the first half, then on a whole GPU."""
    mid = start + (end - start) // 2
    for name, pool in (("whole-node", "whole-pool"), ("ts-node", "ts-pool")):
        node(h, name, pool, start, end)
    pod(h, "research", "mover", "ts-node", "nvidia_com_gpu_shared", start, mid)
    shared_gpu(h, "ts-node", L4, start, mid, 0.5, [("research", "mover")])
    h.add("DCGM_FI_PROF_GR_ENGINE_ACTIVE", {host_label("ts-node"): "ts-node", "UUID": "GPU-ts-node-0", "gpu": "0",
                                            "modelName": L4, "instance": "exporter-a"}, mid, end, 0.0)
    pod(h, "research", "mover", "whole-node", "nvidia_com_gpu", mid, end)
    gpu(h, "whole-node", 0, H100, start, mid, 0.0)
    gpu(h, "whole-node", 0, H100, mid, end, 0.8, ("research", "mover"))
    gpu(h, "whole-node", 1, H100, start, end, 0.0)


def no_usage(h: History, start: int, end: int) -> None:
    """research holds both whole GPUs and never uses them."""
    node(h, "whole-node", "whole-pool", start, end)
    for i in range(2):
        pod(h, "research", f"idle-{i}", "whole-node", "nvidia_com_gpu", start, end)
        gpu(h, "whole-node", i, H100, start, end, 0.0, ("research", f"idle-{i}"))


def exporter_restart(h: History, start: int, end: int) -> None:
    """The exporter restarts at the middle: its series change `instance`, the old and new overlap by a minute, and
    two minutes go unscraped around it. research holds one GPU at 50% busy throughout."""
    mid = start + (end - start) // 2
    node(h, "whole-node", "whole-pool", start, end)
    pod(h, "research", "train-0", "whole-node", "nvidia_com_gpu", start, end)
    for instance, (a, b) in (("exporter-a", (start, mid + STEP)), ("exporter-b", (mid, end))):
        gpu(h, "whole-node", 0, H100, a, b, 0.5, ("research", "train-0"), instance=instance)
        gpu(h, "whole-node", 1, H100, a, b, 0.0, instance=instance)
    for key in list(h.samples):
        if "whole-node" in key:
            h.samples[key] = [(t, v) for t, v in h.samples[key] if not mid + 2 * STEP <= t < mid + 4 * STEP]


def gap(h: History, start: int, end: int) -> None:
    """Two hours without any data in the middle of the window (Prometheus down): research holds one whole GPU."""
    cut_from, cut_to = start + 2 * 3600, start + 4 * 3600
    for a, b in ((start, cut_from), (cut_to, end)):
        node(h, "whole-node", "whole-pool", a, b)
        pod(h, "research", "train-0", "whole-node", "nvidia_com_gpu", a, b)
        gpu(h, "whole-node", 0, H100, a, b, 0.5, ("research", "train-0"))
        gpu(h, "whole-node", 1, H100, a, b, 0.0)


def shared_use(h: History, start: int, end: int) -> None:
    """ts-pool's L4, time-sliced in 4 replicas: notebooks (nb) and research hold one each. gpushare's per-process
    exporter measures notebooks' pod at 70% of the SM time (two containers, 50% + 20%), research's at 5%, and a host
    process at 10% (pod="": nobody's). DCGM copies the device's busy share to both replicas' pods."""
    node(h, "ts-node", "ts-pool", start, end)
    holders = [("nb", "notebook-0"), ("research", "dev-0")]
    for namespace, name in holders:
        pod(h, namespace, name, "ts-node", "nvidia_com_gpu_shared", start, end)
    shared_gpu(h, "ts-node", L4, start, end, 0.85, holders)
    base = {host_label("ts-node"): "ts-node", "UUID": "GPU-ts-node-0", "gpu": "0", "share": "time-slicing",
            "instance": "process-exporter-a"}  # GPU_I_ID="" and the host process' empty labels: left out
    for namespace, name, container, tenant, sm, shares in (
            ("nb", "notebook-0", "main", "notebooks", 0.5, 1), ("nb", "notebook-0", "sidecar", "notebooks", 0.2, 0),
            ("research", "dev-0", "main", "", 0.05, 1), ("", "", "", "", 0.1, 0)):
        named = {"namespace": namespace, "pod": name, "pod_uid": f"uid-{name}" if name else "",
                 "container": container, "tenant": tenant}
        labels = base | {k: v for k, v in named.items() if v}
        h.add("gpushare_pod_gpu_sm_utilization_ratio", labels, start, end, sm)
        h.add("gpushare_pod_gpu_memory_used_bytes", labels, start, end, 1e9)
        h.add("gpushare_pod_gpu_allocated_shares", labels, start, end, shares)
    for source in ("nvml", "podresources"):
        h.add("gpushare_process_exporter_up", {"instance": "process-exporter-a", "source": source}, start, end, 1)


SHOWBACK_ENV = Path(__file__).resolve().parent / "showback-test.yaml"
MIG_ONLY_ENV = Path(__file__).resolve().parent / "mig-only.yaml"
SCENARIOS: dict[str, tuple[Callable[[History, int, int], None], Path]] = {
    "mixed": (mixed, SHOWBACK_ENV),
    "mig-only": (mig_only, MIG_ONLY_ENV),
    "pod-moves": (pod_moves, SHOWBACK_ENV),
    "no-usage": (no_usage, SHOWBACK_ENV),
    "exporter-restart": (exporter_restart, SHOWBACK_ENV),
    "gap": (gap, SHOWBACK_ENV),
    "shared-use": (shared_use, SHOWBACK_ENV),
}


def backfill_all(first_end: int, work: Path, data_dir: Path) -> dict[str, int]:
    """Every scenario in its own slot (an hour apart, so no lookback reaches the previous one), one backfill;
    returns scenario -> the end of its window. Samples start one step after the window's start, so the window
    holds exactly SLOT / step evaluation steps."""
    h = History()
    ends = {}
    for i, (name, (build, _env)) in enumerate(SCENARIOS.items()):
        end = first_end + i * (SLOT + 3600)
        build(h, end - SLOT + STEP, end + STEP)
        ends[name] = end
    source = work / "showback.om"
    with source.open("w") as out:
        h.write(out)
    create_blocks(source, data_dir, max(ends.values()) - first_end + SLOT)
    return ends
