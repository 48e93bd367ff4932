"""Capacity's second stage: per pool a recommendation from its evidence, by sharing kind (time-slicing and MPS,
MIG, whole GPUs), with the figures and reasons behind it. Nothing here reads Prometheus or writes files."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gpushare.core.coverage import duration_text, gaps_text
from gpushare.core.guardrails import Guardrails
from gpushare.core.mig import check_layout, layout_from_counts
from gpushare.core.resolve import ResolvedFleet, ResolvedPool
from gpushare.core.words import counted
from gpushare.ops.capacity.evidence import PoolEvidence

GIB = 1024**3
# Float quotients this little above a whole number (or a limit) count as it: ceil(x - it), x <= limit + it.
FLOAT_SLACK = 1e-9


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
    return units > 0 and advertised / units <= limit + FLOAT_SLACK


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
    rec.evidence += [f"utilization mean {_pct(mean)}, p95 {_pct(p95)} of {counted(n, 'GPU')}",
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
    gpus = max(1, math.ceil(demand / per_gpu - FLOAT_SLACK), math.ceil(mean * n / c.target_utilization - FLOAT_SLACK))
    while proposed > 2 and not _env_ratio_allows(fleet, pool, gpus, proposed, limits.max_oversubscription):
        proposed -= 1
        gpus = max(1, math.ceil(demand / proposed - FLOAT_SLACK),
                   math.ceil(mean * n / c.target_utilization - FLOAT_SLACK))
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
    needed = max(1, math.ceil(allocated_p95 + queued - FLOAT_SLACK))
    rec.gpus_proposed = min(max(needed, math.ceil(mean * n / c.target_utilization - FLOAT_SLACK)), max(n, needed))
    rec.utilization_projected = min(1.0, mean * n / rec.gpus_proposed)
    if rec.gpus_proposed < n:
        rec.reasons.append(f"{n - rec.gpus_proposed} GPU(s) were not allocated even at the p95")
    elif rec.gpus_proposed > n:
        rec.reasons.append(f"the pool queues ({queued:.1f} pending, waits up to "
                           f"{duration_text(e.queue_wait_seconds or 0)})")
    rec.evidence += [f"utilization mean {_pct(mean)}, p95 {_pct(e.utilization_p95)} of {counted(n, 'GPU')}",
                     f"allocated GPUs p95 {allocated_p95:.1f}, pending mean {e.pending_mean or 0:.1f}"]
    if mean < guardrails.monitoring.pool_underused_ratio:
        rec.notes.append(f"whole GPUs {_pct(mean)} busy: trusted work here could share, starting at "
                         f"{c.start_ratio}:1 (time-slicing on part of the hosts), then follow `gpushare capacity`")


def _plain_profiles(model: Any) -> list[Any]:
    return sorted((p for p in model.profiles.values() if "+" not in p.name and "-" not in p.name),
                  key=lambda p: (p.compute_slices, p.memory_slices))


def recommend_mig(fleet: ResolvedFleet, guardrails: Guardrails, pool: ResolvedPool, e: PoolEvidence,
                  rec: Recommendation) -> None:

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
        slices = max(1, math.ceil(m.utilization_p95 * current.compute_slices / c.max_p95_utilization - FLOAT_SLACK))
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
        rec.gpus_proposed = n + math.ceil(queued / per_gpu - FLOAT_SLACK)
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


def _resource(profile: str, suffix: str = "") -> str:
    return f"nvidia.com/mig-{profile.replace('+', '.')}{suffix}"
