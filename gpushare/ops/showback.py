"""`gpushare showback`: GPU-hours (and their cost) per tenant over a window, split the way each GPU is shared.

One unit of a GPU resource held for an hour is its share of a physical GPU-hour (rules.resource_gpu_shares):
a whole GPU 1, a MIG instance its compute slices over the GPU's (memory slices beside), a time-slicing or MPS
replica 1/replicas. Idle is each pool's physical GPU-hours less what its tenants held, so rows plus idle equal
the physical GPU-hours. Every figure counts only the steps where DCGM reports the pool's GPUs: a gap in the data
lowers `coverage`, never anyone's hours. Used hours are DCGM's busy share where the exporter names the pod (whole
GPUs, MIG instances); on time-sliced and MPS GPUs it cannot, so they are null (allocation only).

`--basis use` charges time-sliced and MPS pools by measured use instead, from gpushare's per-process exporter
(role gpu_process_exporter): each tenant's SM GPU-hours, plus the unused remainder of the pool's physical
GPU-hours split by allocation as the allocation basis splits it (tenants in proportion to what they held, idle the
unallocated part), so rows plus idle still equal the physical GPU-hours. Whole GPUs and MIG instances stay on the
allocation basis: use does not change who holds hardware-isolated capacity."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.files import check_output_file
from gpushare.core.guardrails import duration_seconds, load_guardrails
from gpushare.core.prices import PriceTable, load_prices, prices_path
from gpushare.core.resolve import ResolvedFleet, ResolvedPool, resolve_env
from gpushare.ops.diagnose import diagnose_join
from gpushare.ops.prometheus import QUERY_SECONDS, Prometheus, check_window
from gpushare.render.monitoring import expressions as r

SOURCES = ("auto", "recorded", "raw")
BASES = ("allocation", "use")
USE_BASED = ("time-slicing", "mps")  # sharing kinds whose hours --basis use splits by measured SM use
SM_METRIC = "gpushare_pod_gpu_sm_utilization_ratio"
GROUPINGS = ("tenant", "pool", "model")
MEASURED = ("exclusive", "mig")  # sharing kinds whose busy time DCGM attributes to a pod


@dataclass
class Row:
    tenant: str
    pool: str
    model: str
    sharing: str
    allocated_gpu_hours: float
    used_gpu_hours: float | None
    cost: float | None = None
    memory_gpu_hours: float = 0.0  # MIG: the instances' memory slices over the GPU's, for the same hours
    sm_gpu_hours: float | None = None  # --basis use: measured SM GPU-hours on time-sliced and MPS GPUs
    charged_gpu_hours: float | None = None  # --basis use: what the row is charged (None: its allocation)

    @property
    def gpu_hours(self) -> float:
        """The GPU-hours the row is charged: its allocation, or on the use basis its use plus its part of the rest."""
        return self.allocated_gpu_hours if self.charged_gpu_hours is None else self.charged_gpu_hours

    def as_dict(self, basis: str = "allocation") -> dict[str, Any]:
        out = {"tenant": self.tenant, "pool": self.pool, "model": self.model, "sharing": self.sharing,
               "allocated_gpu_hours": _round(self.allocated_gpu_hours), "used_gpu_hours": _round(self.used_gpu_hours)}
        if basis == "use":
            out |= {"sm_gpu_hours": _round(self.sm_gpu_hours), "gpu_hours": _round(self.gpu_hours)}
        return out | {"cost": _round(self.cost)}


@dataclass
class Idle:
    pool: str
    model: str
    gpu_hours: float
    cost: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"pool": self.pool, "model": self.model, "gpu_hours": _round(self.gpu_hours), "cost": _round(self.cost)}


@dataclass
class ShowbackReport:
    fleet: ResolvedFleet
    window: str
    end: float
    source: str
    physical_gpu_hours: float
    planned_gpu_hours: float
    rows: list[Row]
    idle: list[Idle]
    currency: str | None = None
    notes: list[str] = field(default_factory=list)
    basis: str = "allocation"

    @property
    def coverage(self) -> float:
        """Share of the window's planned physical GPU-hours that DCGM reported."""
        return min(1.0, self.physical_gpu_hours / self.planned_gpu_hours) if self.planned_gpu_hours else 0.0

    def as_dict(self) -> dict[str, Any]:
        head: dict[str, Any] = {"ok": True, "environment": self.fleet.environment, "window": self.window}
        if self.basis != "allocation":
            head["basis"] = self.basis
        return head | {"physical_gpu_hours": _round(self.physical_gpu_hours), "coverage": round(self.coverage, 4),
                       "rows": [row.as_dict(self.basis) for row in self.rows], "idle": [i.as_dict() for i in self.idle]}


def _value(sample: dict[str, Any]) -> float | None:
    value = float(sample["value"][1])
    return None if math.isnan(value) or math.isinf(value) else value


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def pool_model(pool: ResolvedPool) -> str:
    return ", ".join(sorted({n.gpu_model.name for n in pool.nodes}))


# ---------------------------------------------------------------- queries: one number per series over the window


def _queries(fleet: ResolvedFleet, source: str) -> dict[str, str]:
    """Per-step expressions: physical GPUs per pool; allocated units per namespace, pool and resource; busy
    GPU-equivalents per namespace and pool. Allocation and use count only where the pool's GPUs report."""
    if source == "recorded":
        physical = "gpushare:pool_physical_gpus:count"
        allocated = "gpushare:namespace_allocated:units"
        used = "gpushare:namespace_used:gpus"
    else:
        node_pool = f"(\n{r.NODE_POOL_EXPR}\n)"
        physical = r.physical_gpus_expr(node_pool)
        allocated = r.allocated_expr(node_pool)
        used = r.used_gpus_expr(node_pool, r.compute_fractions_expr(fleet.pools))
    return {"physical": physical, "allocated": f"({allocated})\nand on (pool) ({physical})",
            "used": f"({used})\nand on (pool) ({physical})"}


def _recorded_coverage(prom: Prometheus, window: str, step: str, at: float) -> float:
    samples = prom.query("recording rules coverage",
                         f"max(count_over_time(gpushare:namespace_allocated:units[{window}:{step}]))", at)
    steps = max(1, duration_seconds(window) // duration_seconds(step))
    return min(1.0, max((v for v in map(_value, samples) if v is not None), default=0.0) / steps)


def _hours(prom: Prometheus, name: str, expr: str, window: str, step: str, at: float
           ) -> list[tuple[dict[str, str], float]]:
    """sum_over_time of a per-step GPU count, as GPU-hours, per series."""
    per_step = duration_seconds(step) / 3600
    out = []
    for sample in prom.query(name, f"sum_over_time((\n{expr}\n)[{window}:{step}])", at):
        value = _value(sample)
        if value is not None:
            out.append((sample.get("metric", {}), value * per_step))
    return out


# ---------------------------------------------------------------- the split


def _tenants(fleet: ResolvedFleet) -> dict[str, str]:
    return {t.namespace: t.name for t in fleet.tenants}


def split(fleet: ResolvedFleet, physical: dict[str, float], allocated: list[tuple[dict[str, str], float]],
          used: dict[tuple[str, str], float]) -> tuple[list[Row], list[Idle], list[str]]:
    """Rows per (tenant, pool) and idle per pool from the window's sums: `physical` pool -> GPU-hours, `allocated`
    (labels namespace/pool/resource, unit-hours), `used` (namespace, pool) -> busy GPU-hours."""
    shares = r.resource_gpu_shares(fleet.pools)
    tenants = _tenants(fleet)
    pools = {p.name: p for p in fleet.pools}
    rows: dict[tuple[str, str], Row] = {}
    notes: list[str] = []
    for labels, unit_hours in allocated:
        pool, resource, namespace = labels.get("pool", ""), labels.get("resource", ""), labels.get("namespace", "")
        if pool not in pools:
            notes.append(f"pool {pool!r} is not in {fleet.environment}: its {unit_hours:.1f} unit-hours are left out")
            continue
        compute, memory = shares.get((pool, resource), (1.0, 1.0))
        tenant = tenants.get(namespace, namespace)
        p = pools[pool]
        row = rows.setdefault((tenant, pool), Row(tenant, pool, pool_model(p), p.sharing, 0.0, None))
        row.allocated_gpu_hours += unit_hours * compute
        row.memory_gpu_hours += unit_hours * memory
    for (tenant, pool), row in rows.items():
        if row.sharing in MEASURED:
            row.used_gpu_hours = sum(v for (ns, pl), v in used.items() if pl == pool and tenants.get(ns, ns) == tenant)
    idle = []
    for p in fleet.pools:
        held = sum(row.allocated_gpu_hours for (_, pool), row in rows.items() if pool == p.name)
        idle.append(Idle(p.name, pool_model(p), physical.get(p.name, 0.0) - held))
    return sorted(rows.values(), key=lambda x: (x.tenant, x.pool)), idle, notes


def split_by_use(fleet: ResolvedFleet, rows: list[Row], idle: list[Idle], sm: dict[tuple[str, str], float]
                 ) -> tuple[list[Row], list[str]]:
    """The use basis on time-sliced and MPS pools, from the allocation basis' rows and idle lines and `sm`
    (namespace, pool) -> SM GPU-hours: per pool with physical GPU-hours P, a tenant's use U_t, the pool's use U and
    the rest R = P - U, a tenant is charged U_t + R * A_t / P (A_t: the GPU-hours it held) and idle is
    R * (P - A) / P, so rows plus idle stay P. Other pools keep the allocation basis. Rows are changed in place;
    returns the rows (tenants that used a pool without holding anything there added) and notes."""
    tenants = _tenants(fleet)
    pools = {p.name: p for p in fleet.pools}
    by_key = {(row.tenant, row.pool): row for row in rows}
    notes: list[str] = []
    for (namespace, pool), hours in sorted(sm.items()):
        if pool not in pools or pools[pool].sharing not in USE_BASED or hours <= 0:
            continue
        tenant = tenants.get(namespace, namespace)
        p = pools[pool]
        row = by_key.setdefault((tenant, pool), Row(tenant, pool, pool_model(p), p.sharing, 0.0, None))
        row.sm_gpu_hours = (row.sm_gpu_hours or 0.0) + hours
    for line in idle:
        if line.pool not in pools or pools[line.pool].sharing not in USE_BASED:
            continue
        pool_rows = [row for (_, pool), row in by_key.items() if pool == line.pool]
        held = sum(row.allocated_gpu_hours for row in pool_rows)
        physical = held + line.gpu_hours
        if physical <= 0:
            continue
        used = sum(row.sm_gpu_hours or 0.0 for row in pool_rows)
        scale = 1.0
        if used > physical:  # more SM time than the pool's GPUs had: a double-counting exporter; keep the total
            notes.append(f"{line.pool}: measured SM use ({used:.1f} GPU-hours) exceeds the physical GPU-hours "
                         f"({physical:.1f}); use scaled down to fit")
            scale, used = physical / used, physical
        rest = physical - used
        for row in pool_rows:
            row.sm_gpu_hours = (row.sm_gpu_hours or 0.0) * scale
            row.charged_gpu_hours = row.sm_gpu_hours + rest * row.allocated_gpu_hours / physical
        line.gpu_hours = rest * (physical - held) / physical
    return sorted(by_key.values(), key=lambda x: (x.tenant, x.pool)), notes


def price(rows: list[Row], idle: list[Idle], table: PriceTable) -> None:
    """Cost of each row and idle line: GPU-hours charged (allocated, or on the use basis use plus a part of the
    rest) times the model's hourly price (mixed-model pools: the first)."""
    for row in rows:
        row.cost = row.gpu_hours * table.price(row.model.split(", ")[0])
    for line in idle:
        line.cost = line.gpu_hours * table.price(line.model.split(", ")[0])


def grouped(rows: list[Row], by: str) -> list[Row]:
    """Rows summed by tenant, pool or model (for the table and the CSV; the JSON keeps every row)."""
    if by not in GROUPINGS:
        raise GpushareError(Problem(f"--by {by!r}", fix="use tenant, pool or model"), exit_code=2)
    key: Callable[[Row], tuple[str, ...]] = {
        "tenant": lambda x: (x.tenant, x.pool), "pool": lambda x: (x.pool,), "model": lambda x: (x.model,)}[by]
    out: dict[tuple[str, ...], Row] = {}
    for row in rows:
        k = key(row)
        if k not in out:
            out[k] = Row("*" if by != "tenant" else row.tenant, row.pool if by != "model" else "*", row.model,
                         row.sharing, 0.0, None if row.used_gpu_hours is None else 0.0,
                         None if row.cost is None else 0.0)
        acc = out[k]
        acc.allocated_gpu_hours += row.allocated_gpu_hours
        acc.memory_gpu_hours += row.memory_gpu_hours
        acc.charged_gpu_hours = (acc.charged_gpu_hours or 0.0) + row.gpu_hours
        if row.sm_gpu_hours is not None:
            acc.sm_gpu_hours = (acc.sm_gpu_hours or 0.0) + row.sm_gpu_hours
        if row.used_gpu_hours is not None:
            acc.used_gpu_hours = (acc.used_gpu_hours or 0.0) + row.used_gpu_hours
        if row.cost is not None:
            acc.cost = (acc.cost or 0.0) + row.cost
        if acc.sharing != row.sharing:
            acc.sharing = "mixed"
    return list(out.values())


# ---------------------------------------------------------------- the whole run


def _check_options(source: str, window: str, by: str, basis: str = "allocation") -> None:
    if basis not in BASES:
        raise GpushareError(Problem(f"--basis {basis!r} is not a showback basis",
                                    fix="use allocation (the default) or use"), exit_code=2)
    if source not in SOURCES:
        raise GpushareError(Problem(f"--source {source!r}", fix="use auto, recorded or raw"), exit_code=2)
    if not re.fullmatch(r"[1-9][0-9]*[smhdw]", window):
        raise GpushareError(Problem(f"--window {window!r} is not a Prometheus duration",
                                    fix="use e.g. 30d, 36h or 90m"), exit_code=2)
    check_window(window)
    if by not in GROUPINGS:
        raise GpushareError(Problem(f"--by {by!r}", fix="use tenant, pool or model"), exit_code=2)


def run_showback(env: str, prometheus: str, window: str = "30d", end: float | None = None,
                 prices: Path | None = None, source: str = "auto", by: str = "tenant",
                 outputs: tuple[tuple[Path | None, str], ...] = (), timeout: float = QUERY_SECONDS,
                 basis: str = "allocation") -> ShowbackReport:
    """Query Prometheus and split the window's physical GPU-hours between tenants and idle. `outputs` are
    (path, option) pairs only checked here, before any work; `timeout` bounds each query (--timeout); `basis`
    is allocation, or use (time-sliced and MPS pools by measured SM use, see split_by_use)."""
    _check_options(source, window, by, basis)
    prom = Prometheus(prometheus, timeout=timeout)
    fleet = resolve_env(env)
    for path, option in outputs:
        if path is not None:
            check_output_file(path, [fleet.source], option=option)
    table = load_prices(prices or prices_path(), fleet.environment) \
        if prices is not None or prices_path().is_file() else None
    guardrails = load_guardrails()
    step = guardrails.capacity.step
    at = end if end is not None else time.time()
    if source == "auto":
        source = "recorded" if _recorded_coverage(prom, window, step, at) >= guardrails.capacity.min_coverage \
            else "raw"
    x = _queries(fleet, source)
    physical = {labels.get("pool", ""): v for labels, v in _hours(prom, "physical GPUs", x["physical"], window,
                                                                     step, at)}
    if not any(physical.get(p.name, 0.0) > 0 for p in fleet.pools):
        # No GPU of any pool reported in the window: 0.0 GPU-hours would read as an idle fleet, not missing data.
        if source == "recorded":  # the raw series may be there: what is missing is the recording rules' history
            raise GpushareError(Problem(
                f"no gpushare:pool_physical_gpus:count series for any pool of {fleet.environment} in the {window} "
                "before the end of the window: gpushare's recording rules have not run over it",
                fix="use --source raw (or auto), or backfill the rules' history (gpushare capacity --backfill-rules)"))
        raise GpushareError(diagnose_join(prom, fleet, window, at))
    allocated = _hours(prom, "allocation", x["allocated"], window, step, at)
    used = {(labels.get("namespace", ""), labels.get("pool", "")): v
            for labels, v in _hours(prom, "use", x["used"], window, step, at)}
    rows, idle, notes = split(fleet, physical, allocated, used)
    if basis == "use":
        sm = _sm_hours(prom, fleet, source, window, step, at, notes)
        rows, more = split_by_use(fleet, rows, idle, sm)
        notes += more
    if table is not None:
        price(rows, idle, table)
    planned = sum(p.totals.physical_gpus for p in fleet.pools) * duration_seconds(window) / 3600
    return ShowbackReport(fleet, window, at, source, sum(physical.get(p.name, 0.0) for p in fleet.pools), planned,
                          rows, idle, table.currency if table else None, notes, basis)


def _sm_hours(prom: Prometheus, fleet: ResolvedFleet, source: str, window: str, step: str, at: float,
              notes: list[str]) -> dict[tuple[str, str], float]:
    """(namespace, pool) -> SM GPU-hours on time-sliced and MPS GPUs over the window, from the per-process
    exporter; an error where it has no series at all (never a silent fallback to the allocation basis)."""
    shared = [p.name for p in fleet.pools if p.sharing in USE_BASED]
    if not shared:
        notes.append("no time-sliced or MPS pool: --basis use charges like --basis allocation")
        return {}
    present = prom.query("process exporter series", f"count(count_over_time({SM_METRIC}[{window}]))", at)
    if not any((_value(s) or 0) > 0 for s in present):
        raise GpushareError(Problem(
            f"--basis use needs per-pod GPU use, but Prometheus has no {SM_METRIC} (gpushare_pod_gpu_*) series in "
            f"the {window} before the end of the window: gpushare's per-process exporter does not run or is not "
            f"scraped (pools {', '.join(shared)} are time-sliced or MPS)",
            fix=f"run the Ansible role {r.PROCESS_EXPORTER_ROLE} on the GPU hosts (site.yml runs it after dcgm "
                "unless gpu_process_exporter_enabled is false) and scrape its port (9835 by default), then wait for "
                "data; or use --basis allocation (the default)"))
    node_pool = f"(\n{r.NODE_POOL_EXPR}\n)"
    expr = "gpushare:namespace_sm_used:gpus"
    if source == "recorded":
        recorded = prom.query("recorded SM use", f"count(count_over_time({expr}[{window}]))", at)
        if not any((_value(s) or 0) > 0 for s in recorded):
            notes.append(f"{expr} has no history in the window: SM use read from the exporter's raw series")
            source = "raw"
    if source != "recorded":
        expr = r.sm_used_expr(node_pool)
        physical = r.physical_gpus_expr(node_pool)
    else:
        physical = "gpushare:pool_physical_gpus:count"
    return {(labels.get("namespace", ""), labels.get("pool", "")): v
            for labels, v in _hours(prom, "SM use", f"({expr})\nand on (pool) ({physical})", window, step, at)}
