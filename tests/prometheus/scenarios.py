"""Scenario data for a real Prometheus: DCGM-format and kube-state-metrics-format series (and Kueue's), written as
OpenMetrics for `promtool tsdb create-blocks-from openmetrics`.

Labels follow the exporters: dcgm-exporter's hostname (Hostname before 4.6.0-4.8.3: PoolLoad.host_label)/UUID/gpu/
modelName (GPU_I_ID/GPU_I_PROFILE on MIG instances;
pod/namespace and `vgpu` per pod on time-sliced GPUs with --kubernetes-virtual-gpus, where only GPU_UTIL and
FB_USED are the pod's own), kube-state-metrics' sanitised resources and `label_*` node labels."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from gpushare.render.monitoring.promql import HOST_LABEL

WAIT_BUCKETS = (60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, math.inf)


@dataclass
class PoolLoad:
    """What one pool did over the window."""

    pool: str
    model: str
    memory_mib: int
    nodes: dict[str, int]  # node -> GPUs
    namespace: str
    util: float  # mean busy share of each unit
    swing: float = 0.05  # daily amplitude around the mean
    replicas: int | None = None  # pods per GPU on a time-sliced pool (per-pod series)
    pod_memory_mib: int = 1024  # framebuffer per pod (time-sliced) or per unit
    mig: dict[str, tuple[int, int]] | None = None  # profile -> (instances per GPU, MiB per instance)
    resource: str = "nvidia_com_gpu"  # kube-state-metrics spelling; MIG pools use nvidia_com_mig_<profile>
    queue: str | None = None  # Kueue ClusterQueue of the pool's tenant
    pending: float = 0.0
    wait_seconds: float = 30.0
    allocated_share: float = 1.0  # share of the advertised units that pods hold
    hostname: bool = True  # dcgm-exporter's node label (absent with --no-hostname / DCGM_EXPORTER_NO_HOSTNAME)
    hostname_suffix: str = ""  # appended to it, as when the exporter reports the host's FQDN, not the node name
    host_label: str = HOST_LABEL  # its spelling: LEGACY_HOST_LABEL (Hostname) for exporters before 4.6.0-4.8.3
    pool_label: bool = True  # kube_node_labels carries the pool label (kube-state-metrics' label allowlist)
    unschedulable: tuple[str, int] | None = None  # (resource, pods): unschedulable pods asking for one each
    gated: tuple[str, int] | None = None  # (resource, pods): pods Kueue's gate holds (Pending, no node), one each
    mig_util: dict[str, float] | None = None  # MIG profile -> mean busy share of its instances (else util)
    mig_memory_mib: dict[str, int] | None = None  # MIG profile -> framebuffer its instances use (else pod_memory_mib)
    dcgm_gap: tuple[int, int, str] | None = None  # (from, to, node): that node's dcgm-exporter sent nothing meanwhile
    # the queue's kueue_cluster_queue_resource_pending (Kueue metrics.enableClusterQueueResources): resource -> amount
    pending_resources: dict[str, float] | None = None


@dataclass
class Scenario:
    pools: list[PoolLoad]
    start: int  # Unix seconds
    end: int
    step: int = 60
    extra: list[str] = field(default_factory=list)


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _number(v: float) -> str:
    """Six digits keep the files small; timestamps as values (kube_pod_created) need every digit."""
    return f"{v:.6g}" if abs(v) < 1e6 else f"{v:.0f}"


def _util(load: PoolLoad, t: int, salt: int, mean: float | None = None) -> float:
    day = math.sin(2 * math.pi * (t % 86400) / 86400)
    jitter = math.sin(t / 997.0 + salt) * 0.02
    return min(1.0, max(0.0, (load.util if mean is None else mean) + load.swing * day + jitter))


def _units(load: PoolLoad) -> Iterator[tuple[str, str, int, dict[str, str], int, str]]:
    """(node, uuid, gpu index, MIG labels, memory MiB, resource) per hardware unit."""
    for node, gpus in load.nodes.items():
        for g in range(gpus):
            uuid = f"GPU-{node}-{g}"
            if load.mig is None:
                yield node, uuid, g, {}, load.memory_mib, load.resource
                continue
            instance = 0
            for profile, (count, mib) in load.mig.items():
                for _ in range(count):
                    instance += 1
                    yield (node, uuid, g, {"GPU_I_ID": str(instance), "GPU_I_PROFILE": profile}, mib,
                           "nvidia_com_mig_" + profile.replace(".", "_").replace("+", "_"))


def write_openmetrics(scenario: Scenario, out: TextIO) -> int:
    """Write every series, family by family; returns the number of samples."""
    times = range(scenario.start, scenario.end + 1, scenario.step)
    count = 0

    def series(name: str, labels: dict[str, str], values: Iterator[float] | list[float],
               gap: tuple[int, int] | None = None) -> None:
        nonlocal count
        head = name + _labels(labels) + " "
        kept = [(t, v) for t, v in zip(times, values, strict=True) if gap is None or not gap[0] <= t <= gap[1]]
        out.writelines(f"{head}{_number(v)} {t}\n" for t, v in kept)
        count += len(kept)

    def const(v: float) -> list[float]:
        return [v] * len(times)

    for load in scenario.pools:
        allocatable: dict[tuple[str, str], int] = {}
        pods: list[tuple[str, str, str]] = []  # (node, pod, resource)
        units = list(_units(load))
        for salt, (node, uuid, g, mig, mib, resource) in enumerate(units):
            base = {load.host_label: node + load.hostname_suffix, "UUID": uuid, "gpu": str(g), "modelName": load.model,
                    **mig}
            gap = load.dcgm_gap[:2] if load.dcgm_gap and load.dcgm_gap[2] == node else None
            if not load.hostname:
                del base[load.host_label]
            profile = mig.get("GPU_I_PROFILE", "")
            util = [_util(load, t, salt, (load.mig_util or {}).get(profile)) for t in times]
            per_gpu = load.replicas or 1
            allocatable[(node, resource)] = allocatable.get((node, resource), 0) + per_gpu
            holders = max(0, round(per_gpu * load.allocated_share))
            if load.replicas:
                used = holders * load.pod_memory_mib
                for v in range(load.replicas):
                    pod = f"{load.pool}-{node}-{g}-{v}"
                    labels = {**base, "vgpu": str(v), "namespace": load.namespace, "pod": pod}
                    series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, util, gap)  # the device value, repeated
                    series("DCGM_FI_DEV_FB_FREE", labels, const(mib - used), gap)
                    if v < holders:
                        series("DCGM_FI_DEV_FB_USED", labels, const(load.pod_memory_mib), gap)
                        series("DCGM_FI_DEV_GPU_UTIL", labels, [100 * u / holders for u in util], gap)
                        pods.append((node, pod, resource))
            else:
                labels = dict(base)
                if holders:
                    pod = f"{load.pool}-{node}-{g}-{mig.get('GPU_I_ID', '0')}"
                    labels |= {"namespace": load.namespace, "pod": pod}
                    pods.append((node, pod, resource))
                used_mib = (load.mig_memory_mib or {}).get(profile, load.pod_memory_mib)
                series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, util, gap)
                series("DCGM_FI_DEV_FB_USED", labels, const(used_mib), gap)
                series("DCGM_FI_DEV_FB_FREE", labels, const(mib - used_mib), gap)
        for node in load.nodes:
            pool = {"label_gpushare_io_pool": load.pool} if load.pool_label else {}
            series("kube_node_labels", {"node": node, **pool}, const(1))
        for (node, resource), n in allocatable.items():
            series("kube_node_status_allocatable", {"node": node, "resource": resource, "unit": "integer"}, const(n))
        for node, pod, resource in pods:
            series("kube_pod_container_resource_requests", {"namespace": load.namespace, "pod": pod,
                                                            "container": "main", "node": node, "resource": resource,
                                                            "unit": "integer"}, const(1))
            series("kube_pod_status_phase", {"namespace": load.namespace, "pod": pod, "phase": "Running"}, const(1))
        if load.unschedulable:
            resource, count = load.unschedulable
            for i in range(count):
                pod = {"namespace": load.namespace, "pod": f"{load.pool}-waiting-{i}"}
                series("kube_pod_container_resource_requests", {**pod, "container": "main", "node": "",
                                                                "resource": resource, "unit": "integer"}, const(1))
                series("kube_pod_status_phase", {**pod, "phase": "Pending"}, const(1))
                series("kube_pod_status_unschedulable", {**pod, "uid": pod["pod"]}, const(1))
                series("kube_pod_created", {**pod, "uid": pod["pod"]}, const(scenario.start))
        if load.gated:
            resource, count = load.gated
            for i in range(count):
                pod = {"namespace": load.namespace, "pod": f"{load.pool}-gated-{i}"}
                series("kube_pod_container_resource_requests", {**pod, "container": "main", "node": "",
                                                                "resource": resource, "unit": "integer"}, const(1))
                series("kube_pod_status_phase", {**pod, "phase": "Pending"}, const(1))
                series("kube_pod_created", {**pod, "uid": pod["pod"]}, const(scenario.start))
        if load.queue:
            series("kueue_pending_workloads", {"cluster_queue": load.queue, "status": "active"}, const(load.pending))
            for resource, amount in (load.pending_resources or {}).items():
                series("kueue_cluster_queue_resource_pending", {"cluster_queue": load.queue, "resource": resource},
                       const(amount))
            for le in WAIT_BUCKETS:
                admitted = [float(i) if load.wait_seconds <= le else 0.0 for i in range(len(times))]
                series("kueue_admission_wait_time_seconds_bucket",
                       {"cluster_queue": load.queue, "le": "+Inf" if math.isinf(le) else f"{le:g}"}, admitted)
    out.writelines(scenario.extra)
    out.write("# EOF\n")
    return count


def backfill(scenario: Scenario, work: Path, data_dir: Path) -> int:
    """OpenMetrics file -> TSDB blocks in data_dir (promtool); returns the samples written."""
    source = work / "series.om"
    with source.open("w") as out:
        samples = write_openmetrics(scenario, out)
    create_blocks(source, data_dir, scenario.end - scenario.start)
    return samples


def create_blocks(source: Path, data_dir: Path, span_seconds: float) -> None:
    """`promtool tsdb create-blocks-from openmetrics` with blocks long enough for the span; the source goes after."""
    import subprocess

    from tests.prometheus.promtool import promtool

    hours = max(2, math.ceil(span_seconds / 3600) + 2)
    result = subprocess.run([promtool(), "tsdb", "create-blocks-from", "openmetrics",
                             f"--max-block-duration={hours}h", str(source), str(data_dir)],
                            capture_output=True, text=True, timeout=1800, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"promtool backfill failed: {result.stdout}\n{result.stderr}")
    source.unlink()


def backfill_recording_rules(groups: list[dict[str, Any]], data_dir: Path, work: Path, start: int, end: int) -> None:
    """What gpushare's recording rules would have recorded over [start, end], level by level: each level is
    evaluated by `promtool tsdb create-blocks-from rules` against a server that already holds the levels before."""
    import shutil
    import subprocess

    import yaml

    from gpushare.ops.backfill import rule_levels
    from tests.prometheus.promtool import promtool
    from tests.prometheus.server import prometheus_server

    for i, level in enumerate(rule_levels(groups)):
        rules = work / f"level-{i}.yaml"
        rules.write_text(yaml.safe_dump({"groups": [{"name": f"level-{i}", "interval": "1m", "rules": level}]},
                                        sort_keys=False))
        out = work / f"level-{i}-blocks"
        with prometheus_server(data_dir, work) as url:
            result = subprocess.run([promtool(), "tsdb", "create-blocks-from", "rules", f"--start={start}",
                                     f"--end={end}", f"--url={url}", f"--output-dir={out}", "--eval-interval=1m",
                                     str(rules)], capture_output=True, text=True, timeout=3600, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"promtool rules backfill (level {i}) failed: {result.stdout}\n{result.stderr}")
        for block in out.iterdir():
            if block.is_dir():
                shutil.move(str(block), str(data_dir / block.name))
        shutil.rmtree(out, ignore_errors=True)
