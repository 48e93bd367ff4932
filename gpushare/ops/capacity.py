"""`gpushare capacity`: window statistics from Prometheus, and per pool a recommendation with its evidence.

Prometheus does the joins and the aggregation to pool level: every figure is a window statistic of a PromQL
expression built from the same expressions as the recording rules (gpushare.monitoring.rules), on the rules' own
series or on the raw DCGM and kube-state-metrics series, so it works on history recorded before gpushare's rules
were deployed. gpushare reads that pool-level expression at the policy's step, a day at a time (a refused chunk is
halved), and applies the statistic itself exactly as Prometheus would; it never pulls the exporters' raw series.

How a pool is sized (targets in policies/guardrails.yaml `capacity:`, limits in its `environments:`):
- time-slicing / MPS: replicas per GPU = the most that keep the GPU's mean busy share under target_utilization
  and its p95 under max_p95_utilization (from the load per allocated replica), that fit in memory (p95 memory per
  replica, memory_headroom kept free), and that the environment allows (max_shared_replicas for the GPU's memory
  class, max_oversubscription); then GPUs = what the allocated replicas plus the waiting workloads need.
- MIG: saturated instances, or instances near their framebuffer, grow to a larger profile; an instance profile whose
  p95 busy share and memory would fit a smaller profile is split into smaller instances (not on mig-time-slicing
  pools, whose replicas per instance stay as they are); every proposed layout passes gpushare.mig.check_layout.
- whole GPUs: GPUs no workload needed at the p95 of allocation are GPUs that could be freed.
Nothing is applied: the proposal is a patch of the environment file (and new profile files) for review."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare.core.coverage import Gap, coverage_gaps, duration_text, gaps_text
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.files import check_output_file, write_file
from gpushare.core.guardrails import Guardrails, duration_seconds, load_guardrails
from gpushare.core.resolve import ResolvedFleet, ResolvedPool, resolve_env
from gpushare.ops.diagnose import diagnose_join
from gpushare.ops.patch import Proposal, dump_yaml, keep_untouched_lines, roundtrip_yaml
from gpushare.ops.prometheus import (
    Prometheus,
    Series,
    apply_stat,
    read_steps,
    sample_value,
    window_stat,
    window_steps,
)
from gpushare.render.monitoring import rules as r
from gpushare.render.monitoring.promql import alternatives, ksm_name

GIB = 1024**3


# ---------------------------------------------------------------- evidence


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
                parts.insert(0, r.pool_pending_workloads_expr(p, queues[p.name], by_cluster[p.cluster][1]))
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


# ---------------------------------------------------------------- recommendations


@dataclass
class Recommendation:
    pool: str
    sharing: str
    gpus_now: int
    gpus_proposed: int | None = None
    replicas_now: int | None = None
    replicas_proposed: int | None = None
    mig_layout_now: dict[str, int] | None = None
    mig_layout_proposed: dict[str, int] | None = None
    utilization_now: float | None = None
    utilization_projected: float | None = None
    evidence: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # profile -> (the profile that replaces it, how many of those per old instance: 2 when split, 3/7 when merged)
    mig_replacements: dict[str, tuple[str, float]] = field(default_factory=dict)
    mig_resource_suffix: str = ""  # ".shared" where time-sliced MIG instances are advertised under renamed resources
    reasons: list[str] = field(default_factory=list)  # why the change, in a few words each
    pressure: float = 0.0  # how long queued work waited (s): the longest waits get relief first
    mig_grows: bool = False  # a saturated MIG profile (or one near its framebuffer) gets a larger instance

    @property
    def gpus_freed(self) -> int:
        return max(0, self.gpus_now - self.gpus_proposed) if self.gpus_proposed is not None else 0

    @property
    def changes(self) -> bool:
        return (self.gpus_proposed not in (None, self.gpus_now)
                or self.replicas_proposed not in (None, self.replicas_now)
                or self.mig_layout_proposed not in (None, self.mig_layout_now))

    def as_dict(self) -> dict[str, Any]:
        return {**{k: v for k, v in self.__dict__.items()}, "gpus_freed": self.gpus_freed, "changes": self.changes}


def _pct(v: float | None) -> str:
    return "no data" if v is None else f"{v:.0%}"


def _replicas(fleet: ResolvedFleet, pool: ResolvedPool) -> int:
    profile = fleet.profiles[pool.profile]
    block = getattr(profile, "mps", None) if pool.sharing == "mps" else getattr(profile, "time_slicing", None)
    return int(block.replicas) if block is not None else 1


def _env_ratio_allows(fleet: ResolvedFleet, pool: ResolvedPool, gpus: int, replicas: int, limit: float) -> bool:
    t = fleet.totals
    advertised = t.advertised_total - pool.totals.advertised_total + gpus * replicas
    units = t.hardware_units - pool.totals.hardware_units + gpus
    return units > 0 and advertised / units <= limit + 1e-9


def _gaps(e: PoolEvidence, guardrails: Guardrails, window: str) -> list[str]:
    if e.utilization_mean is None:
        return [f"no DCGM series for pool {e.pool} in the last {window} (dcgm-exporter scraped? kube-state-metrics "
                "exporting the node label gpushare.io/pool?)"]
    if e.coverage < guardrails.capacity.min_coverage:
        return [f"pool {e.pool} has data for {e.coverage:.0%} of the window, below capacity.min_coverage "
                f"({guardrails.capacity.min_coverage:.0%}): no recommendation"]
    return []


def _node_coverage_notes(pool: ResolvedPool, e: PoolEvidence, guardrails: Guardrails) -> list[str]:
    """Nodes of the pool that reported in less than capacity.min_coverage of the window, or not at all (bare-metal
    hosts have known names; cloud nodes do not)."""
    floor = guardrails.capacity.min_coverage
    notes = [f"node {node} reported in {share:.0%} of the window (capacity.min_coverage {floor:.0%}): its GPUs count "
             "only while they reported" + (f" ({gaps_text(e.node_gaps[node])})" if e.node_gaps.get(node) else "")
             for node, share in sorted(e.node_coverage.items()) if share < floor]
    if pool.cloud is None and e.node_coverage:
        silent = sorted({n.name for n in pool.nodes if n.count == 1} - set(e.node_coverage))
        notes += [f"node {node} sent no DCGM series in the window" for node in silent]
    return notes


def recommend_time_slicing(fleet: ResolvedFleet, guardrails: Guardrails, pool: ResolvedPool, e: PoolEvidence,
                           rec: Recommendation) -> None:
    c = guardrails.capacity
    limits = guardrails.environment(fleet.environment)
    n, replicas = pool.totals.physical_gpus, _replicas(fleet, pool)
    model = pool.nodes[0].gpu_model
    rec.replicas_now = replicas
    mean, p95 = e.utilization_mean or 0.0, e.utilization_p95 or 0.0
    allocated_mean = e.allocated_mean or 0.0
    allocated_p95 = max(e.allocated_p95 or 0.0, allocated_mean)
    pending = e.pending_mean or 0.0
    queued = _queued(e, guardrails)
    rec.evidence += [f"utilization mean {_pct(mean)}, p95 {_pct(p95)} of {n} GPUs",
                     f"allocated replicas mean {allocated_mean:.1f}, p95 {allocated_p95:.1f} of {n * replicas}",
                     f"pending workloads mean {pending:.1f}"
                     + (f", queue wait up to {duration_text(e.queue_wait_seconds)}" if e.queue_wait_seconds else "")]
    # Compute: the load one allocated replica puts on its GPU.
    caps: dict[str, int] = {}
    if allocated_mean > 0 and mean > 0:
        per_replica, per_replica_p95 = mean * n / allocated_mean, p95 * n / allocated_p95
        caps["compute"] = max(1, math.floor(min(c.target_utilization / per_replica,
                                                c.max_p95_utilization / per_replica_p95)))
        rec.evidence.append(f"one replica keeps its GPU {_pct(per_replica)} busy on average ({_pct(per_replica_p95)} "
                            "at p95)")
    memory = e.replica_memory_p95_bytes or e.memory_per_allocated_p95_bytes
    if memory:
        caps["memory"] = math.floor(model.memory_gib * GIB * (1 - c.memory_headroom) / memory)
        source = "largest pod" if e.replica_memory_p95_bytes else "pool memory / allocated replicas"
        rec.evidence.append(f"memory per replica p95 {memory / GIB:.1f} GiB ({source}) of {model.memory_gib:g} GiB")
    else:
        caps["memory"] = replicas
        rec.gaps.append("no memory per replica measured: replicas are not raised")
    cls = guardrails.memory_class(model.memory_gib)
    caps["guardrail"] = limits.max_shared_replicas[cls]
    best = min(caps.values())
    if caps["memory"] < 2:
        rec.notes.append(f"memory allows {caps['memory']} replica(s) per GPU: this pool should not time-slice; "
                         "use an exclusive or MIG profile")
        best = replicas if replicas <= caps["memory"] else 1
    proposed = max(2, best) if best >= 2 else 1
    demand = allocated_p95 + queued
    per_gpu = proposed
    gpus = max(1, math.ceil(demand / per_gpu - 1e-9), math.ceil(mean * n / c.target_utilization - 1e-9))
    while proposed > 2 and not _env_ratio_allows(fleet, pool, gpus, proposed, limits.max_oversubscription):
        proposed -= 1
        gpus = max(1, math.ceil(demand / proposed - 1e-9), math.ceil(mean * n / c.target_utilization - 1e-9))
    limiting = min(caps, key=lambda k: caps[k])
    rec.evidence.append("replica limits: " + ", ".join(f"{k} {v}" for k, v in caps.items()) + f" (binding: {limiting})")
    rec.replicas_proposed = proposed
    rec.gpus_proposed = gpus
    if proposed > replicas:
        rec.reasons.append(f"under-used ({_pct(mean)} busy, {_pct(p95)} at p95): {limiting} allows {proposed} "
                           "replicas per GPU")
    elif proposed < replicas:
        rec.reasons.append(f"{limiting} allows only {proposed} replicas per GPU" +
                           (" (memory-bound: never more replicas)" if limiting == "memory" else ""))
    if queued:
        rec.reasons.append(f"the pool queues ({queued:.1f} pending, waits up to "
                           f"{duration_text(e.queue_wait_seconds or 0)}): GPUs for the waiting work")
    # The same work, plus what the waiting workloads would add at the load an allocated replica puts on a GPU.
    waiting = queued * mean * n / allocated_mean if allocated_mean > 0 else 0.0
    rec.utilization_projected = min(1.0, (mean * n + waiting) / gpus)


def recommend_exclusive(fleet: ResolvedFleet, guardrails: Guardrails, pool: ResolvedPool, e: PoolEvidence,
                        rec: Recommendation) -> None:
    c = guardrails.capacity
    n = pool.totals.physical_gpus
    mean = e.utilization_mean or 0.0
    allocated_p95 = e.allocated_p95 or 0.0
    queued = _queued(e, guardrails)
    needed = max(1, math.ceil(allocated_p95 + queued - 1e-9))
    rec.gpus_proposed = min(max(needed, math.ceil(mean * n / c.target_utilization - 1e-9)), max(n, needed))
    rec.utilization_projected = min(1.0, mean * n / rec.gpus_proposed)
    if rec.gpus_proposed < n:
        rec.reasons.append(f"{n - rec.gpus_proposed} GPU(s) were not allocated even at the p95")
    elif rec.gpus_proposed > n:
        rec.reasons.append(f"the pool queues ({queued:.1f} pending, waits up to "
                           f"{duration_text(e.queue_wait_seconds or 0)})")
    rec.evidence += [f"utilization mean {_pct(mean)}, p95 {_pct(e.utilization_p95)} of {n} GPUs",
                     f"allocated GPUs p95 {allocated_p95:.1f}, pending mean {e.pending_mean or 0:.1f}"]
    if mean < guardrails.monitoring.pool_underused_ratio:
        rec.notes.append(f"whole GPUs {_pct(mean)} busy: trusted work here could share, starting at "
                         f"{c.start_ratio}:1 (time-slicing on part of the hosts), then follow `gpushare capacity`")


def _plain_profiles(model: Any) -> list[Any]:
    return sorted((p for p in model.profiles.values() if "+" not in p.name and "-" not in p.name),
                  key=lambda p: (p.compute_slices, p.memory_slices))


def recommend_mig(fleet: ResolvedFleet, guardrails: Guardrails, pool: ResolvedPool, e: PoolEvidence,
                  rec: Recommendation) -> None:
    from gpushare.core.mig import check_layout, layout_from_counts

    c = guardrails.capacity
    node = pool.nodes[0]
    model, layout = node.gpu_model, dict(node.mig_layout or {})
    driver = min(n.driver_branch for n in pool.nodes)
    rec.mig_layout_now = dict(layout)
    if {n.gpu_model.name for n in pool.nodes} != {model.name} or any(n.mig_layout != layout for n in pool.nodes):
        rec.gaps.append("nodes of the pool differ in GPU model or layout: no MIG change proposed")
        return
    if pool.sharing == "mig-time-slicing":
        rec.replicas_now = rec.replicas_proposed = _replicas(fleet, pool)
        if any(res.startswith("nvidia.com/mig-") and res.endswith(".shared") for res in pool.totals.advertised):
            rec.mig_resource_suffix = ".shared"
    proposed = dict(layout)
    grow: list[tuple[str, int, float]] = []  # (profile, compute slices needed, GiB needed) of saturated instances
    shrink: list[tuple[str, int, float]] = []
    for name in sorted(layout, key=lambda p: -model.profiles[p].compute_slices):
        current = model.profiles[name]
        m = e.mig.get(name)
        if m is None or m.utilization_p95 is None or m.memory_p95_bytes is None:
            rec.gaps.append(f"no series for MIG profile {name}: it stays")
            continue
        slices = max(1, math.ceil(m.utilization_p95 * current.compute_slices / c.max_p95_utilization - 1e-9))
        memory_gib = m.memory_p95_bytes / GIB / (1 - c.memory_headroom)
        rec.evidence.append(f"{name} x{layout[name]}: busiest instance p95 {_pct(m.utilization_p95)} busy, "
                            f"{m.memory_p95_bytes / GIB:.1f} of {current.memory_gib:g} GiB; allocated p95 "
                            f"{m.allocated_p95 or 0:.1f}")
        saturated = m.utilization_p95 > c.max_p95_utilization or memory_gib > (current.memory_gib or 0)
        (grow if saturated else shrink).append((name, slices, memory_gib))
    # Saturated instances grow first (taking room from idle ones); what stays idle is then split.
    for name, slices, memory_gib in grow:
        proposed = _grow_mig(model, driver, e, c, proposed, name, slices, memory_gib, rec)
    if pool.sharing == "mig-time-slicing" and shrink:
        # Pods already share each instance: splitting it too would cut every pod's share twice over.
        rec.reasons.append(f"time-sliced MIG instances ({', '.join(n for n, _, _ in shrink)}) idle, but not split: "
                           f"their {rec.replicas_now} replicas already share each one")
        shrink = []
    for name, slices, memory_gib in shrink:
        current = model.profiles[name]
        count = proposed.get(name, 0)
        if not count:  # gave its room to a saturated profile
            continue
        smaller = [q for q in _plain_profiles(model) if q.compute_slices < current.compute_slices
                   and q.compute_slices >= slices and (q.memory_gib or 0) >= memory_gib]
        done = False
        for q in smaller:
            for k in range(current.compute_slices // q.compute_slices, 0, -1):
                candidate = dict(proposed)
                candidate[name] -= count
                candidate[q.name] = candidate.get(q.name, 0) + k * count
                candidate = {p: v for p, v in candidate.items() if v}
                if check_layout(model, layout_from_counts(candidate), driver).ok:
                    rec.evidence.append(f"{name} needs {slices} compute slice(s) and {memory_gib:.1f} GiB: "
                                        f"each becomes {k} x {q.name}")
                    rec.reasons.append(f"{name} instances are idle enough for {q.name}: more, smaller instances")
                    proposed = candidate
                    rec.mig_replacements[name] = (q.name, k)
                    done = True
                    break
            if done:
                break
    if proposed != layout:
        assert check_layout(model, layout_from_counts(proposed), driver).ok
        rec.mig_layout_proposed = proposed
    n = pool.totals.physical_gpus
    rec.gpus_proposed = n
    queued = _queued(e, guardrails)
    if queued:
        per_gpu = (sum(proposed.values()) or 1) * (rec.replicas_now or 1)
        rec.gpus_proposed = n + math.ceil(queued / per_gpu - 1e-9)
        wait = duration_text(e.queue_wait_seconds or 0)
        slots = "replica(s) of instances" if rec.replicas_now else "instance(s)"
        rec.reasons.append(f"the pool queues ({queued:.1f} pending, waits up to {wait}): "
                           f"{rec.gpus_proposed - n} more GPU(s), {per_gpu} {slots} each")
    util = e.utilization_mean
    # Same work over the GPUs proposed: smaller instances lift instance, not GPU, utilization.
    rec.utilization_projected = None if util is None else min(1.0, util * n / rec.gpus_proposed)


def _queued(e: PoolEvidence, guardrails: Guardrails) -> float:
    """Pending demand that waited past monitoring.queue_wait_seconds (work admitted quickly is busy, not queued)."""
    if not e.pending_mean or (e.queue_wait_seconds or 0) <= guardrails.monitoring.queue_wait_seconds:
        return 0.0
    return e.pending_mean


def _grow_mig(model: Any, driver: int, e: PoolEvidence, c: Any, proposed: dict[str, int], name: str, slices: int,
              memory_gib: float, rec: Recommendation) -> dict[str, int]:
    """One instance of a saturated profile per GPU becomes the next profile that gives it the compute and memory it
    needs, taking room from the least busy other instances if it must; the layout passes check_layout or stays."""
    from gpushare.core.mig import check_layout, layout_from_counts

    current = model.profiles[name]
    m = e.mig[name]
    why = (f"{name} instances are saturated ({_pct(m.utilization_p95)} busy at p95)"
           if (m.utilization_p95 or 0) > c.max_p95_utilization else
           f"{name} instances are near their framebuffer ({(m.memory_p95_bytes or 0) / GIB:.1f} of "
           f"{current.memory_gib:g} GiB at p95)")
    larger = [q for q in _plain_profiles(model) if q.name != name and q.compute_slices >= max(slices,
              current.compute_slices) and (q.memory_gib or 0) >= max(memory_gib, current.memory_gib or 0)
              and ((q.memory_gib or 0) > (current.memory_gib or 0) or q.compute_slices > current.compute_slices)]
    # Room comes only from instances busy under target_utilization (least busy first), or from the saturated profile.
    idle_first = sorted((p for p in proposed if p != name and p in e.mig
                         and (e.mig[p].utilization_p95 or 0) < c.target_utilization),
                        key=lambda p: e.mig[p].utilization_p95 or 0)
    for q in larger:
        candidate = {**proposed, name: proposed.get(name, 0) - 1, q.name: proposed.get(q.name, 0) + 1}
        removed: list[str] = []
        for other in idle_first + [name]:
            while not check_layout(model, layout_from_counts({p: v for p, v in candidate.items() if v}), driver).ok \
                    and candidate.get(other, 0) > 0 and other != q.name:
                candidate[other] -= 1
                removed.append(other)
        candidate = {p: v for p, v in candidate.items() if v}
        if check_layout(model, layout_from_counts(candidate), driver).ok:
            rec.mig_grows = True
            rec.reasons.append(f"{why}: one per GPU becomes {q.name}" +
                               (f" (in place of {', '.join(removed)})" if removed else ""))
            rec.evidence.append(f"{name} needs {slices} compute slice(s) and {memory_gib:.1f} GiB: one per GPU "
                                f"becomes {q.name}")
            for gone in sorted({name, *removed} - set(candidate)):
                # Quotas follow the hardware: a 3g share of a 7g instance is 3/7 of it.
                rec.mig_replacements[gone] = (q.name, model.profiles[gone].compute_slices / q.compute_slices)
                rec.notes.append(f"workloads that ask for {_resource(gone, rec.mig_resource_suffix)} must ask for "
                                 f"{_resource(q.name, rec.mig_resource_suffix)}")
            return candidate
    rec.notes.append(f"{why}, and no larger instance fits this GPU's layout: more GPUs or whole GPUs for this work")
    return proposed


def recommend(fleet: ResolvedFleet, guardrails: Guardrails, evidence: dict[str, PoolEvidence], window: str
              ) -> list[Recommendation]:
    out = []
    for pool in fleet.pools:
        e = evidence[pool.name]
        rec = Recommendation(pool=pool.name, sharing=pool.sharing, gpus_now=pool.totals.physical_gpus,
                             utilization_now=e.utilization_mean)
        rec.gaps += _gaps(e, guardrails, window)
        if e.utilization_mean is not None:
            rec.notes += _node_coverage_notes(pool, e, guardrails)
        if not rec.gaps:
            rec.pressure = (e.queue_wait_seconds or 0.0) if _queued(e, guardrails) else 0.0
            if pool.sharing in ("time-slicing", "mps"):
                recommend_time_slicing(fleet, guardrails, pool, e, rec)
            elif pool.sharing in ("mig", "mig-time-slicing"):
                recommend_mig(fleet, guardrails, pool, e, rec)
            else:
                recommend_exclusive(fleet, guardrails, pool, e, rec)
        out.append(rec)
    return out


# ---------------------------------------------------------------- the proposal: a patch, never applied



def _profile_for_replicas(fleet: ResolvedFleet, guardrails: Guardrails, pool: ResolvedPool, replicas: int,
                          new_profiles: dict[str, dict[str, Any]]) -> tuple[str | None, str]:
    """An existing profile like the pool's with `replicas`, or a new one where the environment allows any."""
    import re

    limits = guardrails.environment(fleet.environment)
    current = fleet.profiles[pool.profile]
    if replicas == 1:
        found = [n for n, p in fleet.profiles.items() if p.kind == "exclusive" and limits.allows_profile(n)]
        return (found[0], "") if found else (None, "no allowed exclusive profile")
    block = "mps" if current.kind == "mps" else "time_slicing"
    want = getattr(current, block).model_copy(update={"replicas": replicas})
    for name, profile in sorted(fleet.profiles.items()):
        if profile.kind == current.kind and getattr(profile, block) == want and limits.allows_profile(name):
            return name, ""
    if "*" not in limits.allowed_profiles:
        return None, (f"no allowed {current.kind} profile with {replicas} replicas in {fleet.environment}: prove one "
                      "in the promotion source first")
    data = current.model_dump(mode="json", exclude_defaults=True)
    data.update({block: {**data.get(block, {}), "replicas": replicas}})
    data["description"] = f"{current.description.strip()} (replicas {replicas}, proposed by gpushare capacity)"
    for name, made in new_profiles.items():  # another pool of this patch already proposes the same profile
        if {**made, "name": ""} == {**data, "name": ""}:
            return name, ""
    name = _new_profile_name(fleet, re.sub(r"\d+$", str(replicas), current.name) if re.search(r"\d+$", current.name)
                             else f"{current.name}-{replicas}", new_profiles)
    new_profiles[name] = {**data, "name": name}
    return name, ""


def _resource(profile: str, suffix: str = "") -> str:
    return f"nvidia.com/mig-{profile.replace('+', '.')}{suffix}"


def _dropped(rec: Recommendation) -> set[str]:
    """MIG resources a pool stops advertising under its recommendation."""
    if rec.mig_layout_proposed is None:
        return set()
    return {_resource(p, rec.mig_resource_suffix) for p in rec.mig_layout_now or {} if p not in rec.mig_layout_proposed}


def _edit_pool(fleet: ResolvedFleet, guardrails: Guardrails, doc: Any, rec: Recommendation, pool: ResolvedPool,
               new_profiles: dict[str, dict[str, Any]]) -> tuple[str | None, list[str], int, bool]:
    """Apply one pool's recommendation (not its tenants' quotas) to the round-trip document: (why not or None, notes,
    the pool's GPUs as the document now says, whether the document really changed)."""
    from gpushare.core.mig import format_layout, layout_from_counts

    limits = guardrails.environment(fleet.environment)
    entry = next(p for p in doc["pools"] if p["name"] == pool.name)
    notes: list[str] = []
    gpus = rec.gpus_now
    edited = False
    if rec.replicas_proposed is not None and rec.replicas_proposed != rec.replicas_now:
        name, why = _profile_for_replicas(fleet, guardrails, pool, rec.replicas_proposed, new_profiles)
        if name is None:
            return why, notes, gpus, edited
        entry["profile"], edited = name, True
    if rec.mig_layout_proposed is not None:
        if "*" not in limits.allowed_profiles:
            return (f"a new MIG layout needs a new profile, which {fleet.environment} allows only after its promotion "
                    "source runs it"), notes, gpus, edited
        model = pool.nodes[0].gpu_model
        name = _new_profile_name(fleet, f"{pool.name}-mig"[:30].rstrip("-"), new_profiles)
        new_profiles[name] = {"name": name, "kind": pool.sharing,
                              "description": f"Layout proposed by gpushare capacity for pool {pool.name}.",
                              "mig": {"layouts": {model.name: format_layout(layout_from_counts(
                                  rec.mig_layout_proposed))}}}
        if pool.sharing == "mig-time-slicing":  # the same replicas per instance: never more for memory-bound work
            new_profiles[name]["time_slicing"] = fleet.profiles[pool.profile].time_slicing.model_dump(mode="json")
        entry["profile"], edited = name, True
    if rec.gpus_proposed is not None and rec.gpus_proposed != rec.gpus_now:
        gpus, resized = _resize(pool, entry, rec, notes)
        edited = edited or resized
    return None, notes, gpus, edited


def _resize(pool: ResolvedPool, entry: Any, rec: Recommendation, notes: list[str]) -> tuple[int, bool]:
    """Resize the pool's entry toward rec.gpus_proposed: (the GPUs it now has, whether the entry changed)."""
    assert rec.gpus_proposed is not None
    if pool.cloud is not None:
        per_node = pool.cloud.gpus_per_node
        nodes = max(math.ceil(rec.gpus_proposed / per_node), pool.cloud.min_node_count or 0)
        if pool.cloud.max_node_count:
            nodes = min(nodes, pool.cloud.max_node_count)
        if nodes * per_node != rec.gpus_proposed:
            notes.append(f"{nodes} node(s) of {per_node} GPUs (the pool's node counts and whole nodes): "
                         f"{nodes * per_node} GPUs rather than {rec.gpus_proposed}")
        changed = entry["cloud"].get("node_count") != nodes
        entry["cloud"]["node_count"] = nodes
        return nodes * per_node, changed
    if rec.gpus_proposed > rec.gpus_now:
        notes.append(f"bare-metal pools grow by adding hosts: add {rec.gpus_proposed - rec.gpus_now} GPUs' worth of "
                     "hosts to the environment")
        return rec.gpus_now, False
    hosts, gpus = entry["hosts"], rec.gpus_now
    freed = rec.gpus_now - rec.gpus_proposed
    while len(hosts) > 1 and hosts[-1]["gpu_count"] <= freed:
        freed -= hosts[-1]["gpu_count"]
        gpus -= hosts[-1]["gpu_count"]
        notes.append(f"host {hosts[-1]['name']} leaves the pool ({hosts[-1]['gpu_count']} GPUs freed)")
        del hosts[-1]
    if freed:
        notes.append(f"{freed} more GPU(s) could go, but only whole hosts leave a bare-metal pool")
    return gpus, gpus != rec.gpus_now


def _new_profile_name(fleet: ResolvedFleet, stem: str, new_profiles: dict[str, dict[str, Any]]) -> str:
    """A profile name (and file name) that no profile in the fleet or its profiles folder, nor this patch, uses yet."""
    from gpushare.core.paths import default_profiles_dir

    folder = default_profiles_dir(fleet.source.resolve())
    taken = set(fleet.profiles) | set(new_profiles) | {p.stem for p in folder.glob("*.yaml")}
    name, n = stem, 1
    while name in taken:
        n += 1
        name = f"{stem[:27].rstrip('-')}-{n}"
    return name


def _move_quotas(fleet: ResolvedFleet, doc: Any, applied: list[Recommendation]) -> None:
    """Tenants' quotas on a MIG resource that no pool of their clusters advertises any more (after every applied
    change) move to the smaller instances that replace it, in proportion to the instances each pool replaced."""
    by_pool = {rc.pool: rc for rc in applied}
    for tenant in doc.get("tenants", []):
        clusters = set(tenant.get("clusters") or fleet.clusters)
        pools = [p for p in fleet.pools if p.cluster in clusters]

        def still(res: str, pools: list[ResolvedPool] = pools) -> bool:
            return any(res in p.totals.advertised and res not in _dropped(by_pool[p.name]) if p.name in by_pool
                       else res in p.totals.advertised for p in pools)

        for key in ("quota", "borrowing_limit"):
            quota = tenant.get(key) or {}
            added: dict[str, float] = {}
            for old_res in [k for k in list(quota) if k.startswith("nvidia.com/mig-") and not still(k)]:
                moves = [((_resource(rc.mig_replacements[old][0], rc.mig_resource_suffix), rc.mig_replacements[old][1]),
                          (rc.mig_layout_now or {}).get(old, 0) * n)
                         for rc in applied if fleet.pool(rc.pool).cluster in clusters
                         for old in rc.mig_replacements if _resource(old, rc.mig_resource_suffix) == old_res
                         for n in [fleet.pool(rc.pool).totals.physical_gpus]]
                if not moves:
                    continue
                total, amount = sum(w for _, w in moves) or 1, quota.pop(old_res)
                for (new_res, factor), weight in moves:
                    added[new_res] = added.get(new_res, 0.0) + amount * factor * weight / total
            for new_res, amount in added.items():
                quota[new_res] = quota.get(new_res, 0) + math.ceil(amount - 1e-9)


def _groups(fleet: ResolvedFleet, recs: list[Recommendation]) -> list[list[Recommendation]]:
    """Changes that must move together: pools of one cluster that stop advertising the same MIG resource (the
    quotas on it move only when all of them do). Every other change is a group of its own."""
    groups: list[list[Recommendation]] = []
    for rc in recs:
        key = {(fleet.pool(rc.pool).cluster, res) for res in _dropped(rc)}
        joined = [g for g in groups if key & {(fleet.pool(o.pool).cluster, res) for o in g for res in _dropped(o)}]
        merged = [rc] + [o for g in joined for o in g]
        groups = [g for g in groups if g not in joined] + [sorted(merged, key=recs.index)]
    return sorted(groups, key=lambda g: recs.index(g[0]))


def relieves(rc: Recommendation) -> bool:
    """The change gives work that waits or saturates more: GPUs, larger MIG instances, fewer replicas per GPU."""
    return (rc.mig_grows or (rc.gpus_proposed or 0) > rc.gpus_now
            or (rc.replicas_proposed or 0) < (rc.replicas_now or 0))


def _value_first(group: list[Recommendation], freed: int) -> tuple[bool, float]:
    """The order groups are combined in, most value first: relief for pools that queue or saturate (longest waits
    first) before savings (most GPUs the patch frees first: whole hosts only on bare metal). A later group that breaks
    the combination is the one withheld."""
    relief = any(relieves(rc) for rc in group)
    return not relief, -max(rc.pressure for rc in group) if relief else -freed


@dataclass
class _Attempt:
    text: str
    new_profiles: dict[str, dict[str, Any]]
    notes: dict[str, list[str]]
    gpus: dict[str, int]
    why: dict[str, str]  # pool -> why its group cannot be applied (empty: the whole attempt holds)
    edited: dict[str, bool] = field(default_factory=dict)  # pool -> whether its edit changes the files


def propose(fleet: ResolvedFleet, guardrails: Guardrails, recs: list[Recommendation]) -> Proposal:
    """The environment change as files (never written over the originals). Each pool's change (or group of changes
    that must move together) is checked alone, then the groups that hold alone are combined one at a time, and a
    group that breaks the combination is withheld with its reason: every change kept resolves (the exact MIG check
    included) and adds no guardrail violation, alone and together."""
    import tempfile
    from datetime import date

    from gpushare.core.paths import default_profiles_dir, find_workspace, patch_path, project_root
    from gpushare.core.resolve import resolve
    from gpushare.policy import rules as policies

    source = fleet.source.resolve()
    root = find_workspace(source.parent) or project_root()  # the profiles' paths too are named from there
    rel_env = patch_path(source, root)
    profiles_dir = default_profiles_dir(source)
    rel_profiles = patch_path(profiles_dir, root)
    original = source.read_text()
    limits = guardrails.environment(fleet.environment)
    promotion = resolve_env(limits.promote_from) if limits.promote_from else None

    def violations(candidate: ResolvedFleet) -> set[tuple[str, str]]:
        ctx = policies.Context(fleet=candidate, guardrails=guardrails, promotion_source=promotion)
        report = policies.evaluate(ctx, [], date.today())
        return {(v.rule, v.message) for v in report.violations if v.level == "mandatory"}

    baseline = violations(fleet)

    def attempt(groups: list[list[Recommendation]]) -> _Attempt:
        y = roundtrip_yaml()
        doc = y.load(original)
        out = _Attempt("", {}, {}, {}, {})
        applied = []
        for group in groups:
            for rc in group:
                why, out.notes[rc.pool], out.gpus[rc.pool], out.edited[rc.pool] = _edit_pool(
                    fleet, guardrails, doc, rc, fleet.pool(rc.pool), out.new_profiles)
                if why:
                    out.why.update({o.pool: why if o is rc else f"moves together with pool {rc.pool}: {why}"
                                    for o in group})
            applied += group
        if out.why:
            return out
        _move_quotas(fleet, doc, applied)
        out.text = keep_untouched_lines(original, dump_yaml(y, y.load(original)), dump_yaml(y, doc))
        with tempfile.TemporaryDirectory(prefix="gpushare-capacity-") as tmp:
            tmp_profiles = Path(tmp) / "profiles"
            tmp_profiles.mkdir()
            for path in profiles_dir.glob("*.yaml"):
                (tmp_profiles / path.name).write_text(path.read_text())
            for name, data in out.new_profiles.items():
                (tmp_profiles / f"{name}.yaml").write_text(dump_yaml(roundtrip_yaml(), data))
            env_file = Path(tmp) / "environments" / source.name
            env_file.parent.mkdir()
            env_file.write_text(out.text)
            try:
                candidate = resolve(env_file, tmp_profiles)
            except GpushareError as err:
                # Name the files as the reviewer knows them, never the temporary copies.
                text = str(err.problems[0]).replace(str(env_file), rel_env).replace(str(tmp_profiles), rel_profiles)
                out.why = {rc.pool: f"the change does not resolve: {text}" for rc in applied}
                return out
        added = violations(candidate) - baseline
        if added:
            why = "guardrails: " + "; ".join(f"{rule}: {m}" for rule, m in sorted(added))
            out.why = {rc.pool: why for rc in applied}
        return out

    proposal = Proposal()
    candidates = []
    for rc in (rc for rc in recs if rc.changes and not rc.gaps):
        why, notes, _, edited = _edit_pool(fleet, guardrails, roundtrip_yaml().load(original), rc, fleet.pool(rc.pool),
                                           {})
        if edited or why:
            candidates.append(rc)
        else:  # nothing to write: a bare-metal pool that should grow, or shrink by less than a host
            proposal.withheld[rc.pool] = "; ".join(notes) or "the change leaves the files as they are"
    alone = []
    for group in _groups(fleet, candidates):
        tried = attempt([group])
        proposal.withheld.update(tried.why)
        if not tried.why:
            alone.append((_value_first(group, sum(rc.gpus_now - tried.gpus[rc.pool] for rc in group)), group))
    kept: list[list[Recommendation]] = []
    for _, group in sorted(alone, key=lambda pair: pair[0]):
        tried = attempt(kept + [group])
        if tried.why:
            others = ", ".join(rc.pool for g in kept for rc in g)
            proposal.withheld.update({rc.pool: f"holds alone but not together with {others}: {tried.why[rc.pool]}"
                                      for rc in group})
        else:
            kept.append(group)
    if kept:
        final = attempt(kept)
        proposal.applied = [rc.pool for g in kept for rc in g]
        if final.text != original:
            proposal.files[rel_env] = (original, final.text)
        for name, data in final.new_profiles.items():
            proposal.files[f"{rel_profiles}/{name}.yaml"] = (None, dump_yaml(roundtrip_yaml(), data))
        for g in kept:
            for rc in g:
                rc.notes += final.notes[rc.pool]
                if rc.gpus_proposed is not None:
                    rc.gpus_proposed = final.gpus[rc.pool]  # what the patch writes: whole hosts, node count limits
    return proposal


# ---------------------------------------------------------------- the whole run: what `gpushare capacity` calls

SOURCES = ("auto", "recorded", "raw")


@dataclass
class CapacityReport:
    """One capacity run: the evidence from Prometheus, the recommendations, and the proposed patch (written)."""

    fleet: ResolvedFleet
    window: str
    end: float
    source: str  # recorded (gpushare's recording rules) or raw (exporter series)
    evidence: dict[str, PoolEvidence]
    recommendations: list[Recommendation]
    proposal: Proposal
    patch_path: Path
    query_seconds: float
    queries: int

    @property
    def gpus_freed(self) -> int:
        return sum(r.gpus_freed for r in self.recommendations if r.pool in self.proposal.applied)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": True, "environment": self.fleet.environment, "window": self.window, "end": self.end,
            "source": "recording rules" if self.source == "recorded" else "raw exporter series",
            "pools": [{**r.as_dict(), "evidence_figures": self.evidence[r.pool].as_dict(),
                       "in_patch": r.pool in self.proposal.applied, "withheld": self.proposal.withheld.get(r.pool)}
                      for r in self.recommendations],
            "gpus_freed": self.gpus_freed,
            "patch": str(self.patch_path) if self.proposal.patch else None,
            "prometheus_query_seconds": round(self.query_seconds, 3),
            "queries": self.queries,
        }


def _check_options(source: str, window: str) -> None:
    if source not in SOURCES:
        raise GpushareError(Problem(f"--source {source!r}", fix="use auto, recorded or raw"), exit_code=2)
    if not re.fullmatch(r"[1-9][0-9]*[smhdw]", window):
        raise GpushareError(Problem(f"--window {window!r} is not a Prometheus duration",
                                    fix="use e.g. 7d, 36h or 90m"), exit_code=2)




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


def run_capacity(env: str, prometheus: str, window: str = "7d", end: float | None = None, source: str = "auto",
                 patch: Path | None = None, chart: Path | None = None,
                 progress: Callable[[str], None] = lambda what: None) -> CapacityReport:
    """Query Prometheus, size every pool, and write the proposed change as a patch for review (never applied).
    `chart` is only checked as an output path here; `progress` hears what is being done."""
    _check_options(source, window)
    prom = Prometheus(prometheus)
    fleet = resolve_env(env)
    patch_path = patch or Path("build") / "capacity" / f"{fleet.environment}.patch"
    check_output_file(patch_path, [fleet.source], option="--patch")
    if chart is not None:
        check_output_file(chart, [fleet.source], option="--chart")
    guardrails = load_guardrails()
    at = end if end is not None else time.time()
    progress("querying Prometheus")
    evidence, used = collect_evidence(prom, fleet, guardrails, window, at,
                                      lambda name: progress(f"Prometheus: {name}"), source)
    if not any(e.utilization_mean is not None for e in evidence.values()):
        raise GpushareError(diagnose_join(prom, fleet, window, at))
    find_node_gaps(prom, fleet, guardrails, evidence, window, at, used)
    progress("sizing pools")
    recs = recommend(fleet, guardrails, evidence, window)
    progress("checking the proposed change (resolve, MIG check, guardrails)")
    proposal = propose(fleet, guardrails, recs)
    if proposal.patch:
        write_file(patch_path, proposal.patch)
    return CapacityReport(fleet, window, at, used, evidence, recs, proposal, patch_path,
                          sum(t.seconds for t in prom.timings), len(prom.timings))
