"""Capacity's first stage: per-pool evidence from Prometheus. Prometheus does the joins and the aggregation to pool
level: every figure is a window statistic of a PromQL expression built from the same expressions as the recording
rules, on the rules' own series or on the raw DCGM and kube-state-metrics series, read in chunks the server accepts."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpushare.core.coverage import Gap, coverage_gaps
from gpushare.core.guardrails import Guardrails, duration_seconds
from gpushare.core.resolve import ResolvedFleet, ResolvedPool
from gpushare.ops.prometheus import (
    Prometheus,
    Series,
    apply_stat,
    read_steps,
    sample_value,
    window_stat,
    window_steps,
)
from gpushare.render.monitoring import expressions as r
from gpushare.render.monitoring.promql import alternatives, ksm_name


@dataclass
class MigEvidence:
    profile: str
    instances: float | None = None
    utilization_p95: float | None = None  # busiest instance's busy share (of the instance's compute), p95
    memory_p95_bytes: float | None = None  # busiest instance's framebuffer used, p95
    allocated_p95: float | None = None


@dataclass
class PoolEvidence:
    pool: str
    coverage: float = 0.0  # share of the window's steps with utilization data
    utilization_mean: float | None = None
    utilization_p95: float | None = None
    gpus_reporting: float | None = None
    gpu_memory_p95_ratio: float | None = None  # fullest GPU's framebuffer used / total, p95
    replica_memory_p95_bytes: float | None = None  # largest pod on a shared GPU, p95 (--kubernetes-virtual-gpus)
    memory_per_allocated_p95_bytes: float | None = None  # pool framebuffer used / allocated units, p95
    allocated_mean: float | None = None
    allocated_p95: float | None = None
    advertised: float | None = None
    pending_mean: float | None = None
    queue_wait_seconds: float | None = None
    mig: dict[str, MigEvidence] = field(default_factory=dict)
    node_coverage: dict[str, float] = field(default_factory=dict)  # node -> share of the window's steps it reported
    node_gaps: dict[str, list[Gap]] = field(default_factory=dict)  # node below capacity.min_coverage -> its gaps

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("mig", "node_gaps")}
        out["mig"] = {p: m.__dict__ for p, m in self.mig.items()}
        out["node_gaps"] = {n: [g.as_dict() for g in gaps] for n, gaps in self.node_gaps.items()}
        return out


def _window_queries(fleet: ResolvedFleet, guardrails: Guardrails, pools: list[ResolvedPool], window: str,
                    source: str = "raw"
                    ) -> list[tuple[str, str, Callable[[PoolEvidence, dict[str, str], float], None]]]:
    """The window statistics. `recorded` reads gpushare's recording rules (cheap: pool-level series); `raw` builds
    the same figures from the exporters' series, for history from before the rules were deployed."""
    step = guardrails.capacity.step
    # Live rules are rendered per cluster: a queue's demand splits only over the pools of the pool's own cluster.
    local = {c: [p for p in pools if p.cluster == c] for c in {p.cluster for p in pools}}
    by_cluster = {c: r.queues_by_pool(fleet, guardrails, ps) for c, ps in local.items()}
    queues = {name: qs for found, _ in by_cluster.values() for name, qs in found.items()}
    zeros = r.pool_zeros(pools)  # no pending series is 0 pending: the mean is over the whole window
    if source == "recorded":
        x = {
            "pool_util": "gpushare:pool_utilization:ratio",
            "gpus": "gpushare:pool_physical_gpus:count",
            "gpu_mem_ratio": "max by (pool) (gpushare:gpu_memory_used:ratio)",
            "replica_mem": "max by (pool) (gpushare:replica_memory_used:bytes)",
            "mem_per_alloc": "sum by (pool) (gpushare:unit_memory_used:bytes) "
                             "/ sum by (pool) (gpushare:pool_allocated:units)",
            "allocated": "sum by (pool) (gpushare:pool_allocated:units)",
            "advertised": "sum by (pool) (gpushare:pool_advertised:units)",
            "pending": f"max by (pool) (gpushare:pool_pending:sum) or {zeros}",
            "mig_count": "gpushare:pool_mig_instances:count",
            "mig_util": 'max by (pool, GPU_I_PROFILE) (gpushare:unit_utilization:ratio{GPU_I_ID!=""})',
            "mig_mem": 'max by (pool, GPU_I_PROFILE) (gpushare:unit_memory_used:bytes{GPU_I_ID!=""})',
            "alloc_by_resource": "gpushare:pool_allocated:units",
            "node_units": "count by (pool, node) (gpushare:unit_utilization:ratio)",
        }
        wait = f"max_over_time(gpushare:pool_queue_wait_seconds:max[{window}])"
    else:
        node_pool = f"(\n{r.NODE_POOL_EXPR}\n)"
        unit_util = r.unit_utilization_expr(node_pool)
        gpu_util = r.gpu_utilization_expr(unit_util, r.compute_fractions_expr(pools))
        used = r.unit_memory_used_expr(node_pool)
        total = r.unit_memory_total_expr(used)
        allocated = f"sum by (pool) ({r.allocated_expr(node_pool)})"
        mig_util = r.unit_utilization_expr(node_pool, 'GPU_I_ID!=""')
        mig_used = r.unit_memory_used_expr(node_pool, 'GPU_I_ID!=""')
        pending_parts, wait_parts = [], []
        for p in pools:
            parts = [r.unschedulable_requests_expr(p, local[p.cluster])]
            if p.name in queues:
                parts.insert(0, r.pool_pending_workloads_expr(p, queues[p.name], by_cluster[p.cluster][1],
                                                              r.queue_namespaces(fleet)))
            pending_parts.append(f'label_replace({r.sum_present(parts)}, "pool", "{p.name}", "", "")')
            wait_parts.append(f"label_replace(max_over_time(({r.unschedulable_pod_age_expr(p)})[{window}:{step}]), "
                              f'"pool", "{p.name}", "", "")')
            if p.name in queues:
                wait_parts.append(
                    "label_replace(histogram_quantile(0.9, sum by (le) (increase("
                    f'kueue_admission_wait_time_seconds_bucket{{cluster_queue=~"{alternatives(queues[p.name])}"}}'
                    f'[{window}]))), "pool", "{p.name}", "", "")')
        x = {
            "pool_util": f"avg by (pool) (\n{gpu_util}\n)",
            "gpus": f"count by (pool) ({gpu_util})",
            "gpu_mem_ratio": f"max by (pool) (\n  sum by ({r.GPU_NODE}) ({used})\n"
                             f"  / sum by ({r.GPU_NODE}) ({total})\n)",
            "replica_mem": f"max by (pool) ({r.replica_memory_expr(node_pool)})",
            "mem_per_alloc": f"sum by (pool) ({used}) / {allocated}",
            "allocated": allocated,
            "advertised": f"sum by (pool) ({r.advertised_expr(node_pool)})",
            "pending": "\n or ".join([*pending_parts, zeros]),
            "mig_count": f"count by (pool, GPU_I_PROFILE) ({mig_util})",
            "mig_util": f"max by (pool, GPU_I_PROFILE) ({mig_util})",
            "mig_mem": f"max by (pool, GPU_I_PROFILE) ({mig_used})",
            "alloc_by_resource": f"sum by (pool, resource) ({r.allocated_expr(node_pool)})",
            "node_units": f"count by (pool, node) ({r.unit_utilization_expr(node_pool)})",
        }
        wait = f"max by (pool) (\n{' or '.join(wait_parts)}\n)"
    sub = f"[{window}:{step}]"

    def setter(attr: str) -> Callable[[PoolEvidence, dict[str, str], float], None]:
        def apply(e: PoolEvidence, _labels: dict[str, str], v: float) -> None:
            setattr(e, attr, v)
        return apply

    def mig_setter(attr: str) -> Callable[[PoolEvidence, dict[str, str], float], None]:
        def apply(e: PoolEvidence, labels: dict[str, str], v: float) -> None:
            profile = labels.get("GPU_I_PROFILE")
            if profile:
                setattr(e.mig.setdefault(profile, MigEvidence(profile)), attr, v)
        return apply

    def mig_alloc(e: PoolEvidence, labels: dict[str, str], v: float) -> None:
        resource = labels.get("resource", "")
        for profile in e.mig:
            if ksm_name(f"nvidia.com/mig-{profile.replace('+', '.')}") == resource:
                e.mig[profile].allocated_p95 = v

    def node_coverage(e: PoolEvidence, labels: dict[str, str], v: float) -> None:
        steps = max(1, duration_seconds(window) // duration_seconds(step))
        e.node_coverage[labels.get("node", "")] = min(1.0, v / steps)

    def coverage(e: PoolEvidence, _labels: dict[str, str], v: float) -> None:
        e.coverage = min(1.0, v / max(1, duration_seconds(window) // duration_seconds(step)))

    return [
        ("utilization coverage", f"count_over_time(({x['pool_util']}){sub})", coverage),
        ("utilization mean", f"avg_over_time(({x['pool_util']}){sub})", setter("utilization_mean")),
        ("utilization p95", f"quantile_over_time(0.95, ({x['pool_util']}){sub})", setter("utilization_p95")),
        ("GPUs reporting", f"max_over_time(({x['gpus']}){sub})", setter("gpus_reporting")),
        ("memory per GPU p95", f"quantile_over_time(0.95, ({x['gpu_mem_ratio']}){sub})",
         setter("gpu_memory_p95_ratio")),
        ("memory per replica p95", f"quantile_over_time(0.95, ({x['replica_mem']}){sub})",
         setter("replica_memory_p95_bytes")),
        ("memory per allocated unit p95", f"quantile_over_time(0.95, ({x['mem_per_alloc']}){sub})",
         setter("memory_per_allocated_p95_bytes")),
        ("allocated mean", f"avg_over_time(({x['allocated']}){sub})", setter("allocated_mean")),
        ("allocated p95", f"quantile_over_time(0.95, ({x['allocated']}){sub})", setter("allocated_p95")),
        ("advertised", f"max_over_time(({x['advertised']}){sub})", setter("advertised")),
        ("pending mean", f"avg_over_time(({x['pending']}){sub})", setter("pending_mean")),
        ("queue wait", wait, setter("queue_wait_seconds")),
        ("MIG instances", f"max_over_time(({x['mig_count']}){sub})", mig_setter("instances")),
        ("MIG utilization p95", f"quantile_over_time(0.95, ({x['mig_util']}){sub})", mig_setter("utilization_p95")),
        ("MIG memory p95", f"quantile_over_time(0.95, ({x['mig_mem']}){sub})", mig_setter("memory_p95_bytes")),
        ("MIG allocated p95", f"quantile_over_time(0.95, ({x['alloc_by_resource']}){sub})", mig_alloc),
        ("coverage per node", f"count_over_time(({x['node_units']}){sub})", node_coverage),
    ]


def recorded_coverage(prom: Prometheus, guardrails: Guardrails, window: str, at: float) -> float:
    """Share of the window that gpushare's recording rules cover (the best-covered pool)."""
    steps = window_steps(window, guardrails.capacity.step, at)
    series = read_steps(prom, "recording rules coverage", "gpushare:pool_utilization:ratio", steps)
    expected = max(1, duration_seconds(window) // duration_seconds(guardrails.capacity.step))
    return min(1.0, max(map(len, series.values()), default=0) / expected)


def collect_evidence(prom: Prometheus, fleet: ResolvedFleet, guardrails: Guardrails, window: str, at: float,
                     progress: Callable[[str], None] | None = None, source: str = "auto"
                     ) -> tuple[dict[str, PoolEvidence], str]:
    """Per-pool evidence, and which series it came from: gpushare's recording rules where they cover the window
    (capacity.min_coverage), else the exporters' raw series. A whole-window statistic is computed here from its
    inner (pool-level) expression read at the policy's step in chunks the server accepts (one read serves every
    statistic of that expression); any other query runs as one instant query."""
    if source == "auto":
        covered = recorded_coverage(prom, guardrails, window, at)
        source = "recorded" if covered >= guardrails.capacity.min_coverage else "raw"
    pools = fleet.pools
    evidence = {p.name: PoolEvidence(p.name) for p in pools}
    steps = window_steps(window, guardrails.capacity.step, at)
    read: dict[str, Series] = {}
    for name, expr, apply in _window_queries(fleet, guardrails, pools, window, source):
        stat = window_stat(expr, window, guardrails.capacity.step)
        if stat is None:
            if progress:
                progress(name)
            results = [(s.get("metric", {}), sample_value(s)) for s in prom.query(name, expr, at)]
        else:
            if stat.inner not in read:
                if progress:
                    progress(name)
                read[stat.inner] = read_steps(prom, name, stat.inner, steps)
            results = [(dict(key), apply_stat(stat, values)) for key, values in read[stat.inner].items() if values]
        for labels, value in results:
            pool = labels.get("pool")
            if pool in evidence and value is not None and math.isfinite(value):
                apply(evidence[pool], labels, value)
    return evidence, source


def find_node_gaps(prom: Prometheus, fleet: ResolvedFleet, guardrails: Guardrails, evidence: dict[str, PoolEvidence],
                   window: str, at: float, source: str) -> None:
    """The dated gaps of every node below capacity.min_coverage, into its pool's evidence. Read only where such a
    node exists: the per-node expression's step times (`timestamp()` of an aggregate is the step), in the same
    chunks as every window read."""
    floor = guardrails.capacity.min_coverage
    if not any(share < floor for e in evidence.values() for share in e.node_coverage.values()):
        return
    step = guardrails.capacity.step
    expr = next(x for name, x, _ in _window_queries(fleet, guardrails, fleet.pools, window, source)
                if name == "coverage per node")
    stat = window_stat(expr, window, step)
    if stat is None:
        return
    first, last, step_ms = window_steps(window, step, at)
    series = read_steps(prom, "gaps per node", f"timestamp({stat.inner})", (first, last, step_ms))
    for key, times in series.items():
        labels = dict(key)
        e = evidence.get(labels.get("pool", ""))
        node = labels.get("node", "")
        if e is not None and e.node_coverage.get(node, 1.0) < floor:
            e.node_gaps[node] = coverage_gaps(times, first / 1000, last / 1000, step_ms // 1000)
