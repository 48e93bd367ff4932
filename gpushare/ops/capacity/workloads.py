"""Capacity per workload on shared pools (time-slicing, MPS): which workloads drive a shared GPU, from gpushare's
per-process exporter (role gpu_process_exporter: the gpushare_pod_gpu_* series, or the recording rules'
gpushare:pod_gpu_*:avg5m), and the replicas per GPU their observed peaks fit.

A workload is a pod's owner: kube-state-metrics' kube_pod_owner (its controller), a ReplicaSet's pod-template-hash
suffix stripped so a Deployment's pods are one workload whatever its rollouts; a pod without kube_pod_owner gets its
workload from its name (`<deployment>-<hash>-<5 chars>`, `<job or daemonset>-<5 chars>`, `<statefulset>-<ordinal>`,
else the pod's name). A Job created by a CronJob stays its own workload.

Figures per workload and pool: the busiest replica's SM share and framebuffer (5-minute averages) at the window's
p95 and max, and the replicas it ran on each GPU (the most at once). From them, per pool:
- a workload crowds a GPU where its replica's p95 SM share is above its fair share, 1 / replicas per GPU (or its
  p95 memory above the GPU's usable memory / replicas per GPU);
- replicas per GPU by peaks: the most replicas R such that the R busiest replicas' p95 SM shares sum to at most the
  whole GPU and their p95 memory to at most its memory less capacity.memory_headroom (any R replicas may share a
  GPU; beyond the replicas seen, each more counts at the mean), capped by the environment's max_shared_replicas;
- per crowding workload a profile: a whole GPU where one replica alone passes capacity.max_p95_utilization, else the
  smallest MIG profile of the GPU that holds its peaks, else a pool with at most 1 / peak replicas per GPU (a whole
  GPU where that is 1).
The pool-level recommendation and the patch stay as they are: this section explains them per workload.
Without per-pod series the section says the exporter is needed and capacity sizes from pool averages, as before."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpushare.core.catalog import GpuModel
from gpushare.core.guardrails import Guardrails
from gpushare.core.resolve import ResolvedFleet
from gpushare.ops.prometheus import Prometheus, Series, apply_stat, read_steps, window_stat, window_steps
from gpushare.render.monitoring import expressions as r

GIB = 1024**3
FLOAT_SLACK = 1e-9
SHARED = ("time-slicing", "mps")
EXPORTER = ("no per-pod series (gpushare_pod_gpu_*) for this pool: per-workload figures need gpushare's per-process "
            "exporter (Ansible role gpu_process_exporter) on its hosts; capacity falls back to pool averages")
# The characters Kubernetes' rand.SafeEncodeString uses for pod-template-hash and generated pod-name suffixes.
SAFE = "[bcdfghjklmnpqrstvwxz2456789]"
WORKLOAD = "pool, namespace, tenant, workload"
PLACEMENT = f"pool, node, UUID, GPU_I_ID, {WORKLOAD.removeprefix('pool, ')}"


# ---------------------------------------------------------------- evidence (Prometheus)

def owner_expr() -> str:
    """Each pod's workload from kube_pod_owner: its controller, a ReplicaSet's hash suffix stripped."""
    return f"""max by (namespace, pod, workload) (
  label_replace(
    label_join(kube_pod_owner{{owner_is_controller="true", owner_name!="<none>"}}, "owner", "/", "owner_kind",
               "owner_name"),
    "workload", "$1$2", "owner", "ReplicaSet/(.+)-{SAFE}{{6,10}}|[^/]*/(.+)"
  )
)"""


def with_workload(pods: str) -> str:
    """Per-pod series with a `workload` label: from kube_pod_owner where it has the pod, else from the pod's name."""
    owners = owner_expr()
    named = f'label_replace(({pods}) unless on (namespace, pod) {owners}, "workload", "$1", "pod", "(.*)")'
    named = f'label_replace({named}, "workload", "$1", "pod", "(.+)-[0-9]+")'
    named = f'label_replace({named}, "workload", "$1", "pod", "(.+?)(?:-{SAFE}{{6,10}})?-{SAFE}{{5}}")'
    return f"(\n  ({pods}) * on (namespace, pod) group_left (workload) {owners}\n  or\n  {named}\n)"


def pod_series(source: str) -> tuple[str, str]:
    """(SM share, memory) per pod and GPU on time-sliced and MPS GPUs, as 5-minute averages."""
    shared = f'share=~"{r.SHARED_SM}"'
    if source == "recorded":
        return (f"gpushare:pod_gpu_sm_utilization_ratio:avg5m{{{shared}}}",
                f"gpushare:pod_gpu_memory_used_bytes:avg5m{{{shared}}}")
    node_pool = f"(\n{r.NODE_POOL_EXPR}\n)"
    sm, memory = (r.pod_gpu_expr(metric, "avg_over_time({}[5m])", node_pool, shared)
                  for metric in ("gpushare_pod_gpu_sm_utilization_ratio", "gpushare_pod_gpu_memory_used_bytes"))
    return sm, memory


def workload_queries(window: str, step: str, source: str) -> list[tuple[str, str]]:
    """(name, query) of the per-workload window statistics; three inner expressions are read."""
    sm, memory = (with_workload(x) for x in pod_series(source))
    sub = f"[{window}:{step}]"
    busiest_sm = f"max by ({WORKLOAD}) ({sm})"
    busiest_memory = f"max by ({WORKLOAD}) ({memory})"
    placement = f"count by ({PLACEMENT}) ({sm})"
    return [
        ("workload SM share p95", f"quantile_over_time(0.95, ({busiest_sm}){sub})"),
        ("workload SM share max", f"max_over_time(({busiest_sm}){sub})"),
        ("workload memory p95", f"quantile_over_time(0.95, ({busiest_memory}){sub})"),
        ("workload memory max", f"max_over_time(({busiest_memory}){sub})"),
        ("workload replicas per GPU", f"max_over_time(({placement}){sub})"),
    ]


@dataclass
class WorkloadEvidence:
    pool: str
    namespace: str
    workload: str
    tenant: str
    sm_p95: float | None = None  # busiest replica's share of its GPU's SM time (5-minute average), p95
    sm_max: float | None = None
    memory_p95_bytes: float | None = None  # busiest replica's framebuffer, p95
    memory_max_bytes: float | None = None
    gpus: dict[str, int] = field(default_factory=dict)  # GPU (node/UUID[/GPU_I_ID]) -> its replicas there, at most

    @property
    def replicas(self) -> int:
        return sum(self.gpus.values()) or 1

    @property
    def key(self) -> tuple[str, str, str]:
        return self.namespace, self.workload, self.tenant


def collect_workloads(prom: Prometheus, fleet: ResolvedFleet, guardrails: Guardrails, window: str, at: float,
                      source: str, progress: Callable[[str], None] | None = None
                      ) -> dict[str, list[WorkloadEvidence]]:
    """Per shared pool its workloads' figures, read like the pool evidence (inner expression at the policy's step,
    in chunks); an empty dict where no shared pool has per-pod series."""
    pools = {p.name for p in fleet.pools if p.sharing in SHARED}
    if not pools:
        return {}
    step = guardrails.capacity.step
    steps = window_steps(window, step, at)
    read: dict[str, Series] = {}
    found: dict[tuple[str, str, str, str], WorkloadEvidence] = {}
    setters = {"workload SM share p95": "sm_p95", "workload SM share max": "sm_max",
               "workload memory p95": "memory_p95_bytes", "workload memory max": "memory_max_bytes"}
    for name, expr in workload_queries(window, step, source):
        stat = window_stat(expr, window, step)
        assert stat is not None
        if stat.inner not in read:
            if progress:
                progress(name)
            read[stat.inner] = read_steps(prom, name, stat.inner, steps)
        for key, values in read[stat.inner].items():
            labels = dict(key)
            value = apply_stat(stat, values) if values else math.nan
            if labels.get("pool") not in pools or not math.isfinite(value):
                continue
            w = found.setdefault((labels["pool"], labels.get("namespace", ""), labels.get("workload", ""),
                                  labels.get("tenant", "")),
                                 WorkloadEvidence(labels["pool"], labels.get("namespace", ""),
                                                  labels.get("workload", ""), labels.get("tenant", "")))
            if name in setters:
                setattr(w, setters[name], value)
            else:
                gpu = "/".join(x for x in (labels.get("node", ""), labels.get("UUID", ""),
                                           labels.get("GPU_I_ID", "")) if x)
                w.gpus[gpu] = max(w.gpus.get(gpu, 0), round(value))
    out: dict[str, list[WorkloadEvidence]] = {}
    for w in found.values():
        if w.sm_p95 is not None:
            out.setdefault(w.pool, []).append(w)
    return out


# ---------------------------------------------------------------- sizing (no Prometheus)

@dataclass
class WorkloadFinding:
    evidence: WorkloadEvidence
    fair_share: float  # 1 / replicas per GPU now
    crowds: bool = False  # its replica's p95 SM share is above its fair share
    crowds_memory: bool = False  # its replica's p95 memory is above the GPU's usable memory / replicas per GPU
    profile: str | None = None  # what it should run on, where it crowds
    why: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        e = self.evidence
        return {"namespace": e.namespace, "workload": e.workload, "tenant": e.tenant, "replicas": e.replicas,
                "gpus": dict(e.gpus), "sm_p95": e.sm_p95, "sm_max": e.sm_max,
                "memory_p95_bytes": e.memory_p95_bytes, "memory_max_bytes": e.memory_max_bytes,
                "fair_share": self.fair_share, "crowds": self.crowds, "crowds_memory": self.crowds_memory,
                "profile": self.profile, "why": list(self.why)}


@dataclass
class PoolWorkloads:
    pool: str
    sharing: str
    replicas_now: int
    available: bool = False  # per-pod series were found
    replicas_by_peaks: int | None = None
    binding: str | None = None  # compute, memory or guardrail
    workloads: list[WorkloadFinding] = field(default_factory=list)
    gpus_over: list[str] = field(default_factory=list)  # GPUs whose replicas' peaks sum above the whole GPU
    notes: list[str] = field(default_factory=list)

    @property
    def crowding(self) -> list[WorkloadFinding]:
        return [f for f in self.workloads if f.crowds or f.crowds_memory]

    def as_dict(self) -> dict[str, Any]:
        return {"available": self.available, "replicas_now": self.replicas_now,
                "replicas_by_peaks": self.replicas_by_peaks, "binding": self.binding,
                "workloads": [f.as_dict() for f in self.workloads],
                "crowding": [f"{f.evidence.namespace}/{f.evidence.workload}" for f in self.crowding],
                "gpus_over": list(self.gpus_over), "notes": list(self.notes)}

    def lines(self) -> list[str]:
        """The section as text lines, for the report's table."""
        if not self.available:
            return list(self.notes)
        lines = [f"per workload: replicas per GPU by peaks {self.replicas_by_peaks} ({self.binding}), now "
                 f"{self.replicas_now}"]
        for f in self.workloads:
            e = f.evidence
            mark = "CROWDS " if f.crowds or f.crowds_memory else ""
            lines.append(f"{mark}{e.namespace}/{e.workload} (tenant {e.tenant}) x{e.replicas}: SM p95 "
                         f"{_pct(e.sm_p95)}, max {_pct(e.sm_max)}; memory p95 "
                         f"{(e.memory_p95_bytes or 0) / GIB:.1f} GiB, max {(e.memory_max_bytes or 0) / GIB:.1f} GiB; "
                         f"fair share {_pct(f.fair_share)}"
                         + (f" -> {f.profile}: " + "; ".join(f.why) if f.profile else ""))
        lines += [f"over at peaks: {g}" for g in self.gpus_over] + list(self.notes)
        return lines


def _pct(v: float | None) -> str:
    return "no data" if v is None else f"{v:.0%}"


def replicas_by_peaks(workloads: list[WorkloadEvidence], memory_bytes: float, cap: int) -> tuple[int, str]:
    """The most replicas per GPU (1..cap) whose busiest R replicas' p95 SM shares sum to at most 1 and p95 memory
    to at most `memory_bytes`; beyond the replicas seen, each more counts at the mean. Returns (R, binding)."""
    sm = sorted((w.sm_p95 or 0.0 for w in workloads for _ in range(w.replicas)), reverse=True)
    memory = sorted((w.memory_p95_bytes or 0.0 for w in workloads for _ in range(w.replicas)), reverse=True)

    def top(values: list[float], n: int) -> float:
        mean = math.fsum(values) / len(values) if values else 0.0
        return math.fsum(values[:n]) + max(0, n - len(values)) * mean

    best, binding = cap, "guardrail"
    for n in range(2, cap + 1):
        if top(sm, n) > 1.0 + FLOAT_SLACK:
            best, binding = n - 1, "compute"
            break
        if top(memory, n) > memory_bytes + FLOAT_SLACK:
            best, binding = n - 1, "memory"
            break
    return max(1, best), binding


def _profile(e: WorkloadEvidence, model: GpuModel, guardrails: Guardrails) -> tuple[str, str]:
    """(profile, why) for a workload that crowds its GPU."""
    c = guardrails.capacity
    sm, memory = e.sm_p95 or 0.0, (e.memory_p95_bytes or 0.0) / (1 - c.memory_headroom)
    if sm >= c.max_p95_utilization or memory > model.memory_gib * GIB:
        return "exclusive", (f"one replica alone keeps a GPU {_pct(sm)} busy at p95 (capacity.max_p95_utilization "
                             f"{_pct(c.max_p95_utilization)}): a whole GPU")
    total = model.compute_slices_total or 0
    fits = sorted((p for p in model.profiles.values() if "+" not in p.name and "-" not in p.name and total
                   and p.compute_slices / total >= sm and (p.memory_gib or 0) * GIB >= memory),
                  key=lambda p: (p.compute_slices, p.memory_slices))
    if fits:
        p = fits[0]
        return f"mig {p.name}", (f"MIG {p.name} isolates its SM ({p.compute_slices}/{total} of the GPU) and memory "
                                 f"({p.memory_gib:g} GiB) from its neighbours")
    most = max(1, math.floor(1 / sm + FLOAT_SLACK)) if sm else 1
    if most < 2:
        return "exclusive", (f"one replica needs {_pct(sm)} of a GPU's SM at p95: no other replica fits beside it, "
                             "and this GPU has no MIG: a whole GPU")
    return f"replicas {most}", f"a pool with at most {most} replicas per GPU gives it its {_pct(sm)} at p95"


def size_workloads(pool: str, sharing: str, replicas_now: int, model: GpuModel, workloads: list[WorkloadEvidence],
                   guardrails: Guardrails, cap: int) -> PoolWorkloads:
    """The per-workload section of one shared pool (`cap`: the environment's max_shared_replicas for the GPU)."""
    out = PoolWorkloads(pool, sharing, replicas_now)
    if not workloads:
        out.notes.append(EXPORTER)
        return out
    out.available = True
    usable = model.memory_gib * GIB * (1 - guardrails.capacity.memory_headroom)
    fair = 1 / max(1, replicas_now)
    peaks = {w.key: w for w in workloads}
    for w in sorted(workloads, key=lambda w: (-(w.sm_p95 or 0), w.namespace, w.workload)):
        f = WorkloadFinding(w, fair)
        f.crowds = (w.sm_p95 or 0) > fair + FLOAT_SLACK
        f.crowds_memory = (w.memory_p95_bytes or 0) > usable / max(1, replicas_now) + FLOAT_SLACK
        if f.crowds:
            f.why.append(f"its replica takes {_pct(w.sm_p95)} of a GPU's SM at p95 (max {_pct(w.sm_max)}), above its "
                         f"fair share {_pct(fair)} of {replicas_now} replicas per GPU")
        if f.crowds_memory:
            f.why.append(f"its replica holds {(w.memory_p95_bytes or 0) / GIB:.1f} GiB at p95, above its share "
                         f"{usable / max(1, replicas_now) / GIB:.1f} GiB of the GPU's usable memory")
        if f.crowds or f.crowds_memory:
            f.profile, why = _profile(w, model, guardrails)
            f.why.append(why)
        out.workloads.append(f)
    out.replicas_by_peaks, out.binding = replicas_by_peaks(workloads, usable, cap)
    # The GPUs where the replicas seen together would need more than the whole GPU at their p95s.
    demand: dict[str, float] = {}
    for w in peaks.values():
        for gpu, n in w.gpus.items():
            demand[gpu] = demand.get(gpu, 0.0) + n * (w.sm_p95 or 0.0)
    out.gpus_over = [f"{gpu} ({_pct(v)} of its SM at the replicas' p95s)"
                     for gpu, v in sorted(demand.items(), key=lambda kv: -kv[1]) if v > 1.0 + FLOAT_SLACK][:5]
    if out.replicas_by_peaks < replicas_now:
        out.notes.append(f"the workloads' peaks fit {out.replicas_by_peaks} replica(s) per GPU ({out.binding}), "
                         f"not {replicas_now}: move the crowding workloads or lower the replicas")
    return out


def pool_workloads(fleet: ResolvedFleet, guardrails: Guardrails, found: dict[str, list[WorkloadEvidence]]
                   ) -> dict[str, PoolWorkloads]:
    """The per-workload section of every time-sliced and MPS pool of the fleet."""
    limits = guardrails.environment(fleet.environment)
    out = {}
    for pool in fleet.pools:
        if pool.sharing not in SHARED:
            continue
        profile = fleet.profiles[pool.profile]
        block = getattr(profile, "mps", None) if pool.sharing == "mps" else getattr(profile, "time_slicing", None)
        replicas = int(block.replicas) if block is not None else 1
        model = pool.nodes[0].gpu_model
        cap = limits.max_shared_replicas[guardrails.memory_class(model.memory_gib)]
        out[pool.name] = size_workloads(pool.name, pool.sharing, replicas, model, found.get(pool.name, []),
                                        guardrails, cap)
    return out

