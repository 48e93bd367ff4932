"""`gpushare capacity`: window statistics from Prometheus, and per pool a recommendation with its evidence.

Prometheus does the aggregation: every figure is one PromQL query over the window (subqueries at the policy's
step), built from the same expressions as the recording rules (gpushare.monitoring.rules) but on the raw DCGM and
kube-state-metrics series, so it works on history recorded before gpushare's rules were deployed. gpushare pulls
one number per pool (or per pool and MIG profile), never raw series.

How a pool is sized (targets in policies/guardrails.yaml `capacity:`, limits in its `environments:`):
- time-slicing / MPS: replicas per GPU = the most that keep the GPU's mean busy share under target_utilization
  and its p95 under max_p95_utilization (from the load per allocated replica), that fit in memory (p95 memory per
  replica, memory_headroom kept free), and that the environment allows (max_shared_replicas for the GPU's memory
  class, max_oversubscription); then GPUs = what the allocated replicas plus the waiting workloads need.
- MIG: an instance profile whose p95 busy share and memory would fit a smaller profile is split into smaller
  instances; every proposed layout passes gpushare.mig.check_layout for the pool's GPU and driver.
- whole GPUs: GPUs no workload needed at the p95 of allocation are GPUs that could be freed.
Nothing is applied: the proposal is a patch of the environment file (and new profile files) for review."""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.files import check_output_file, write_file
from gpushare.core.guardrails import Guardrails, duration_seconds, load_guardrails
from gpushare.core.resolve import ResolvedFleet, ResolvedPool, resolve_env
from gpushare.render.monitoring import rules as r
from gpushare.render.monitoring.promql import alternatives, ksm_name

GIB = 1024**3

# ---------------------------------------------------------------- Prometheus HTTP API


@dataclass
class QueryTiming:
    name: str
    seconds: float  # what Prometheus reports (evalTotalTime), or wall time where it reports none
    wall: float


class Prometheus:
    """The /api/v1/query and /api/v1/query_range endpoints. Errors name the URL and what to do."""

    def __init__(self, url: str, timeout: float = 120.0) -> None:
        try:
            parsed = urllib.parse.urlsplit(url)
            ok = parsed.scheme in ("http", "https") and bool(parsed.hostname) and parsed.port != 0
        except ValueError:  # an unclosed IPv6 bracket, a port that is not a number or above 65535
            ok = False
        if not ok:
            raise GpushareError(Problem(f"--prometheus {url[:200]!r} is not an http(s) URL",
                                        fix="give the Prometheus base URL, e.g. http://prometheus:9090"), exit_code=2)
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.timings: list[QueryTiming] = []

    def query(self, name: str, expr: str, at: float) -> list[dict[str, Any]]:
        """One value per series at `at` (an instant vector)."""
        return self._call("query", name, {"query": expr, "time": f"{at:.3f}"}, "vector")

    def query_range(self, name: str, expr: str, start: float, end: float, step: int) -> list[dict[str, Any]]:
        """Values per series every `step` seconds from start to end (a matrix: `values` of [time, text])."""
        return self._call("query_range", name, {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                "step": str(step)}, "matrix")

    def _call(self, endpoint: str, name: str, params: dict[str, str], result_type: str) -> list[dict[str, Any]]:
        body = urllib.parse.urlencode({**params, "stats": "all"}).encode()
        request = urllib.request.Request(f"{self.url}/api/v1/{endpoint}", data=body, method="POST",
                                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 - user's URL
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            try:
                detail = json.loads(detail).get("error", detail)
            except ValueError:
                pass
            raise GpushareError(Problem(
                f"Prometheus at {self.url} refused the {name} query: HTTP {exc.code}: {detail[:300]}",
                fix="check that --prometheus is the Prometheus server's base URL (no /graph or /api path)"),
                exit_code=2) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise GpushareError(Problem(f"cannot reach Prometheus at {self.url}: {reason}",
                                        fix="check --prometheus (scheme, host, port) and that the server is up"),
                                exit_code=2) from None
        wall = time.perf_counter() - started
        try:
            doc = json.loads(raw)
        except ValueError:
            raise GpushareError(Problem(f"{self.url} did not answer like a Prometheus API (no JSON)",
                                        fix="point --prometheus at a Prometheus server"), exit_code=2) from None
        if doc.get("status") != "success":
            raise GpushareError(Problem(f"Prometheus at {self.url}: {doc.get('error', doc)}"), exit_code=2)
        data = doc["data"]
        reported = data.get("stats", {}).get("timings", {}).get("evalTotalTime")
        self.timings.append(QueryTiming(name, float(reported) if reported is not None else wall, wall))
        if data.get("resultType") != result_type:
            raise GpushareError(Problem(f"Prometheus answered the {name} query with {data.get('resultType')}"))
        result: list[dict[str, Any]] = data["result"]
        return result


def _value(sample: dict[str, Any]) -> float | None:
    value = float(sample["value"][1])
    return None if math.isnan(value) or math.isinf(value) else value


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

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "mig"}
        out["mig"] = {p: m.__dict__ for p, m in self.mig.items()}
        return out


def _window_queries(fleet: ResolvedFleet, guardrails: Guardrails, pools: list[ResolvedPool], window: str,
                    source: str = "raw"
                    ) -> list[tuple[str, str, Callable[[PoolEvidence, dict[str, str], float], None]]]:
    """The window statistics. `recorded` reads gpushare's recording rules (cheap: pool-level series); `raw` builds
    the same figures from the exporters' series, for history from before the rules were deployed."""
    step = guardrails.capacity.step
    queues = r.pool_queues(fleet, guardrails, pools)
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
            "pending": "gpushare:pool_pending:sum",
            "mig_count": "gpushare:pool_mig_instances:count",
            "mig_util": 'max by (pool, GPU_I_PROFILE) (gpushare:unit_utilization:ratio{GPU_I_ID!=""})',
            "mig_mem": 'max by (pool, GPU_I_PROFILE) (gpushare:unit_memory_used:bytes{GPU_I_ID!=""})',
            "alloc_by_resource": "gpushare:pool_allocated:units",
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
            parts = [f"({r.unschedulable_requests_expr(p)})"]
            if p.name in queues:
                parts.insert(0, f'sum(kueue_pending_workloads{{cluster_queue=~"{alternatives(queues[p.name])}"}})')
            pending_parts.append(f'label_replace(({" + ".join(parts)}) or ({" or ".join(parts)}), '
                                 f'"pool", "{p.name}", "", "")')
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
            "pending": "\n or ".join(pending_parts),
            "mig_count": f"count by (pool, GPU_I_PROFILE) ({mig_util})",
            "mig_util": f"max by (pool, GPU_I_PROFILE) ({mig_util})",
            "mig_mem": f"max by (pool, GPU_I_PROFILE) ({mig_used})",
            "alloc_by_resource": f"sum by (pool, resource) ({r.allocated_expr(node_pool)})",
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
    ]


def recorded_coverage(prom: Prometheus, guardrails: Guardrails, window: str, at: float) -> float:
    """Share of the window that gpushare's recording rules cover (the best-covered pool)."""
    step = guardrails.capacity.step
    samples = prom.query("recording rules coverage",
                         f"max(count_over_time(gpushare:pool_utilization:ratio[{window}:{step}]))", at)
    steps = max(1, duration_seconds(window) // duration_seconds(step))
    return min(1.0, max((v for v in map(_value, samples) if v is not None), default=0.0) / steps)


def collect_evidence(prom: Prometheus, fleet: ResolvedFleet, guardrails: Guardrails, window: str, at: float,
                     progress: Callable[[str], None] | None = None, source: str = "auto"
                     ) -> tuple[dict[str, PoolEvidence], str]:
    """Per-pool evidence, and which series it came from: gpushare's recording rules where they cover the window
    (capacity.min_coverage), else the exporters' raw series."""
    if source == "auto":
        covered = recorded_coverage(prom, guardrails, window, at)
        source = "recorded" if covered >= guardrails.capacity.min_coverage else "raw"
    pools = fleet.pools
    evidence = {p.name: PoolEvidence(p.name) for p in pools}
    for name, expr, apply in _window_queries(fleet, guardrails, pools, window, source):
        if progress:
            progress(name)
        for sample in prom.query(name, expr, at):
            labels = sample.get("metric", {})
            pool = labels.get("pool")
            value = _value(sample)
            if pool in evidence and value is not None:
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
    mig_replacements: dict[str, tuple[str, int]] = field(default_factory=dict)  # profile -> (smaller, count each)

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
    rec.evidence += [f"utilization mean {_pct(mean)}, p95 {_pct(p95)} of {n} GPUs",
                     f"allocated replicas mean {allocated_mean:.1f}, p95 {allocated_p95:.1f} of {n * replicas}",
                     f"pending workloads mean {pending:.1f}"
                     + (f", queue wait up to {e.queue_wait_seconds:.0f} s" if e.queue_wait_seconds else "")]
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
    demand = allocated_p95 + pending
    per_gpu = proposed
    gpus = max(1, math.ceil(demand / per_gpu - 1e-9), math.ceil(mean * n / c.target_utilization - 1e-9))
    while proposed > 2 and not _env_ratio_allows(fleet, pool, gpus, proposed, limits.max_oversubscription):
        proposed -= 1
        gpus = max(1, math.ceil(demand / proposed - 1e-9), math.ceil(mean * n / c.target_utilization - 1e-9))
    limiting = min(caps, key=lambda k: caps[k])
    rec.evidence.append("replica limits: " + ", ".join(f"{k} {v}" for k, v in caps.items()) + f" (binding: {limiting})")
    rec.replicas_proposed = proposed
    rec.gpus_proposed = gpus
    # The same work, plus what the waiting workloads would add at the load an allocated replica puts on a GPU.
    waiting = pending * mean * n / allocated_mean if allocated_mean > 0 else 0.0
    rec.utilization_projected = min(1.0, (mean * n + waiting) / gpus)


def recommend_exclusive(fleet: ResolvedFleet, guardrails: Guardrails, pool: ResolvedPool, e: PoolEvidence,
                        rec: Recommendation) -> None:
    c = guardrails.capacity
    n = pool.totals.physical_gpus
    mean = e.utilization_mean or 0.0
    allocated_p95 = e.allocated_p95 or 0.0
    needed = max(1, math.ceil(allocated_p95 + (e.pending_mean or 0.0) - 1e-9))
    rec.gpus_proposed = min(max(needed, math.ceil(mean * n / c.target_utilization - 1e-9)), max(n, needed))
    rec.utilization_projected = min(1.0, mean * n / rec.gpus_proposed)
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
        rec.notes.append("MIG with time-slicing: replicas and layout are not resized together yet")
        return
    proposed = dict(layout)
    for name in sorted(layout, key=lambda p: -model.profiles[p].compute_slices):
        current = model.profiles[name]
        m = e.mig.get(name)
        if m is None or m.utilization_p95 is None or m.memory_p95_bytes is None:
            rec.gaps.append(f"no series for MIG profile {name}: it stays")
            continue
        slices = max(1, math.ceil(m.utilization_p95 * current.compute_slices / c.max_p95_utilization - 1e-9))
        memory_gib = m.memory_p95_bytes / GIB / (1 - c.memory_headroom)
        rec.evidence.append(f"{name} x{layout[name]}: busiest instance p95 {_pct(m.utilization_p95)} busy, "
                            f"{m.memory_p95_bytes / GIB:.1f} GiB; allocated p95 {m.allocated_p95 or 0:.1f}")
        smaller = [q for q in _plain_profiles(model) if q.compute_slices < current.compute_slices
                   and q.compute_slices >= slices and (q.memory_gib or 0) >= memory_gib]
        done = False
        for q in smaller:
            for k in range(current.compute_slices // q.compute_slices, 0, -1):
                candidate = dict(proposed)
                candidate[name] -= 1 * layout[name]
                candidate[q.name] = candidate.get(q.name, 0) + k * layout[name]
                candidate = {p: v for p, v in candidate.items() if v}
                if check_layout(model, layout_from_counts(candidate), driver).ok:
                    rec.evidence.append(f"{name} needs {slices} compute slice(s) and {memory_gib:.1f} GiB: "
                                        f"each becomes {k} x {q.name}")
                    proposed = candidate
                    rec.mig_replacements[name] = (q.name, k)
                    done = True
                    break
            if done:
                break
    if proposed != layout:
        assert check_layout(model, layout_from_counts(proposed), driver).ok
        rec.mig_layout_proposed = proposed
    rec.gpus_proposed = pool.totals.physical_gpus
    util = e.utilization_mean
    rec.utilization_projected = util  # same GPUs, same work: smaller instances lift instance, not GPU, utilization


def recommend(fleet: ResolvedFleet, guardrails: Guardrails, evidence: dict[str, PoolEvidence], window: str
              ) -> list[Recommendation]:
    out = []
    for pool in fleet.pools:
        e = evidence[pool.name]
        rec = Recommendation(pool=pool.name, sharing=pool.sharing, gpus_now=pool.totals.physical_gpus,
                             utilization_now=e.utilization_mean)
        rec.gaps += _gaps(e, guardrails, window)
        if not rec.gaps:
            if pool.sharing in ("time-slicing", "mps"):
                recommend_time_slicing(fleet, guardrails, pool, e, rec)
            elif pool.sharing in ("mig", "mig-time-slicing"):
                recommend_mig(fleet, guardrails, pool, e, rec)
            else:
                recommend_exclusive(fleet, guardrails, pool, e, rec)
        out.append(rec)
    return out


# ---------------------------------------------------------------- the proposal: a patch, never applied


@dataclass
class Proposal:
    files: dict[str, tuple[str | None, str]] = field(default_factory=dict)  # relative path -> (old, new)
    applied: list[str] = field(default_factory=list)  # pools whose change is in the patch
    withheld: dict[str, str] = field(default_factory=dict)  # pool -> why its change is not in the patch

    @property
    def patch(self) -> str:
        import difflib

        out: list[str] = []
        for rel, (old, new) in sorted(self.files.items()):
            out += difflib.unified_diff((old or "").splitlines(True), new.splitlines(True),
                                        fromfile="/dev/null" if old is None else f"a/{rel}", tofile=f"b/{rel}")
        return "".join(out)


def roundtrip_yaml() -> Any:
    from ruamel.yaml import YAML

    y = YAML()
    y.preserve_quotes = True
    y.width = 4096
    y.indent(mapping=2, sequence=4, offset=2)
    return y


def dump_yaml(y: Any, data: Any) -> str:
    import io

    buf = io.StringIO()
    y.dump(data, buf)
    return buf.getvalue()


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
    name = re.sub(r"\d+$", str(replicas), current.name) if re.search(r"\d+$", current.name) else \
        f"{current.name}-{replicas}"
    data = current.model_dump(mode="json", exclude_defaults=True)
    data.update({"name": name, block: {**data.get(block, {}), "replicas": replicas}})
    data["description"] = f"{current.description.strip()} (replicas {replicas}, proposed by gpushare capacity)"
    new_profiles[name] = data
    return name, ""


def _edit_pool(fleet: ResolvedFleet, guardrails: Guardrails, doc: Any, rec: Recommendation, pool: ResolvedPool,
               new_profiles: dict[str, dict[str, Any]]) -> str | None:
    """Apply one pool's recommendation to the round-trip document; returns why not, or None."""
    from gpushare.core.mig import format_layout, layout_from_counts

    limits = guardrails.environment(fleet.environment)
    entry = next(p for p in doc["pools"] if p["name"] == pool.name)
    if rec.replicas_proposed is not None and rec.replicas_proposed != rec.replicas_now:
        name, why = _profile_for_replicas(fleet, guardrails, pool, rec.replicas_proposed, new_profiles)
        if name is None:
            return why
        entry["profile"] = name
    if rec.mig_layout_proposed is not None:
        if "*" not in limits.allowed_profiles:
            return f"a new MIG layout needs a new profile, which {fleet.environment} allows only after its promotion " \
                   "source runs it"
        model = pool.nodes[0].gpu_model
        name = f"{pool.name}-mig"[:30].rstrip("-")
        new_profiles[name] = {"name": name, "kind": "mig",
                              "description": f"Layout proposed by gpushare capacity for pool {pool.name}.",
                              "mig": {"layouts": {model.name: format_layout(layout_from_counts(
                                  rec.mig_layout_proposed))}}}
        entry["profile"] = name
        for tenant in doc.get("tenants", []):
            for key in ("quota", "borrowing_limit"):
                quota = tenant.get(key) or {}
                for old, (new, count) in rec.mig_replacements.items():
                    old_res, new_res = f"nvidia.com/mig-{old.replace('+', '.')}", f"nvidia.com/mig-{new}"
                    others = any(old_res in p.totals.advertised for p in fleet.pools
                                 if p.name != pool.name and p.cluster == pool.cluster)
                    if old_res in quota and not others:
                        quota[new_res] = quota.get(new_res, 0) + quota.pop(old_res) * count
    if rec.gpus_proposed is not None and rec.gpus_proposed != rec.gpus_now:
        if pool.cloud is not None:
            per_node = pool.cloud.gpus_per_node
            nodes = math.ceil(rec.gpus_proposed / per_node)
            nodes = max(nodes, pool.cloud.min_node_count or 0)
            if pool.cloud.max_node_count:
                nodes = min(nodes, pool.cloud.max_node_count)
            entry["cloud"]["node_count"] = nodes
        elif rec.gpus_proposed < rec.gpus_now:
            hosts = entry["hosts"]
            freed = rec.gpus_now - rec.gpus_proposed
            while len(hosts) > 1 and hosts[-1]["gpu_count"] <= freed:
                freed -= hosts[-1]["gpu_count"]
                rec.notes.append(f"host {hosts[-1]['name']} leaves the pool ({hosts[-1]['gpu_count']} GPUs freed)")
                del hosts[-1]
        else:
            rec.notes.append(f"add {rec.gpus_proposed - rec.gpus_now} GPUs (hosts) to the pool: bare-metal hosts "
                             "are not invented here")
    return None


def propose(fleet: ResolvedFleet, guardrails: Guardrails, recs: list[Recommendation]) -> Proposal:
    """The environment change as files (never written over the originals); every change kept resolves (the exact
    MIG check included) and adds no guardrail violation."""
    import tempfile
    from datetime import date
    from pathlib import Path

    from gpushare.core.paths import default_profiles_dir, find_workspace, patch_path, project_root
    from gpushare.core.resolve import resolve, resolve_env
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
    candidates = [rc for rc in recs if rc.changes and not rc.gaps]
    proposal = Proposal()
    while candidates:
        y = roundtrip_yaml()
        doc = y.load(original)
        new_profiles: dict[str, dict[str, Any]] = {}
        kept = []
        for rc in candidates:
            why = _edit_pool(fleet, guardrails, doc, rc, fleet.pool(rc.pool), new_profiles)
            if why:
                proposal.withheld[rc.pool] = why
            else:
                kept.append(rc)
        text = dump_yaml(y, doc)
        with tempfile.TemporaryDirectory(prefix="gpushare-capacity-") as tmp:
            tmp_profiles = Path(tmp) / "profiles"
            tmp_profiles.mkdir()
            for path in profiles_dir.glob("*.yaml"):
                (tmp_profiles / path.name).write_text(path.read_text())
            for name, data in new_profiles.items():
                (tmp_profiles / f"{name}.yaml").write_text(dump_yaml(roundtrip_yaml(), data))
            env_file = Path(tmp) / "environments" / source.name
            env_file.parent.mkdir()
            env_file.write_text(text)
            try:
                candidate = resolve(env_file, tmp_profiles)
            except GpushareError as err:
                culprit = next((rc for rc in kept if any(rc.pool in str(p) for p in err.problems)), None)
                for rc in [culprit] if culprit else kept:
                    proposal.withheld[rc.pool] = f"the change does not resolve: {err.problems[0]}"
                candidates = [rc for rc in kept if rc.pool not in proposal.withheld]
                continue
            added = violations(candidate) - baseline
        if added:
            blamed = [rc for rc in kept if any(rc.pool in m or candidate.pool(rc.pool).profile in m for _, m in added)]
            for rc in blamed or kept:
                proposal.withheld[rc.pool] = "guardrails: " + "; ".join(f"{rule}: {m}" for rule, m in sorted(added))
            candidates = [rc for rc in kept if rc.pool not in proposal.withheld]
            continue
        proposal.applied = [rc.pool for rc in kept]
        if kept:
            proposal.files[rel_env] = (original, text)
            for name, data in new_profiles.items():
                proposal.files[f"{rel_profiles}/{name}.yaml"] = (None, dump_yaml(roundtrip_yaml(), data))
        break
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


def _no_utilization(url: str, fleet: ResolvedFleet, window: str, at: float) -> GpushareError:
    return GpushareError(Problem(
        f"Prometheus at {url} has no GPU utilization for any pool of {fleet.environment} in the "
        f"{window} before {time.strftime('%Y-%m-%d %H:%M', time.gmtime(at))} UTC",
        fix="check --window and --end, that dcgm-exporter is scraped, and that kube-state-metrics "
            "exports the node label gpushare.io/pool (--metric-labels-allowlist)"))


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
        raise _no_utilization(prometheus, fleet, window, at)
    progress("sizing pools")
    recs = recommend(fleet, guardrails, evidence, window)
    progress("checking the proposed change (resolve, MIG check, guardrails)")
    proposal = propose(fleet, guardrails, recs)
    if proposal.patch:
        write_file(patch_path, proposal.patch)
    return CapacityReport(fleet, window, at, used, evidence, recs, proposal, patch_path,
                          sum(t.seconds for t in prom.timings), len(prom.timings))
