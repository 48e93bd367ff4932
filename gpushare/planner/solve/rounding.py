"""Integer plans: the compact LP's assignment and the master LP's fills rounded, packed first-fit decreasing and
covered with configurations, and (on small inputs) a HiGHS MIP over the generated columns."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpushare.planner.model import EPS, UnitKind
from gpushare.planner.solve.bound import Compact
from gpushare.planner.solve.data import Data, Fill
from gpushare.planner.solve.engine import Clock, highs
from gpushare.planner.solve.master import Rows, add_columns
from gpushare.planner.solve.tuning import INTEGRALITY

COVER_NODES = 1000  # for covering the units a set of fills needs with GPUs
MIP_NODES = 500  # for the MIP over the generated columns
MIP_GAP = 1e-6  # HiGHS's relative MIP gap; where objectives count GPUs, the absolute gap is a GPU less this


@dataclass
class IntSolution:
    configs: dict[int, int]  # configuration index -> GPUs
    fills: dict[Fill, int]  # fill -> units
    objective: float


def pack_kinds(data: Data, wanted: dict[int, dict[int, int]]) -> list[Fill]:
    """First-fit decreasing per unit kind: replicas (item type -> count per kind) into as few units as it finds.

    The replicas of one type are alike, so each unit takes at once as many of them as one-at-a-time first-fit would
    put there (the units before it had no room for one, and it has none left after): the same packing, in work that
    grows with the units rather than the replicas (first-fit one replica at a time took minutes past any
    --time-limit at 100,000 replicas a workload)."""
    fills: list[Fill] = []
    for u, counts in wanted.items():
        unit = data.units[u]
        if unit.sharing == "exclusive":
            fills += [Fill(u, ((i, 1),)) for i, c in counts.items() for _ in range(c)]
            continue
        units: list[list[Any]] = []  # [counts, memory, compute, size]
        sliced = unit.sharing == "time-slicing"
        least_m = min(float(data.memory[i]) for i in counts)
        least_c = min(float(data.compute[i]) for i in counts)
        order = sorted(counts, key=lambda i: -max(data.memory[i] / unit.memory_gib, data.compute[i] / unit.sum_compute))
        open_: list[list[Any]] = []
        for i in order:
            m, c = float(data.memory[i]), float(data.compute[i])
            left = counts[i]

            for entry in open_:
                if not left:
                    break
                take = min(_room(unit, sliced, entry, m, c), left)
                if take:
                    _add(entry, i, take, m, c)
                    left -= take
            while left:
                entry = [{}, 0.0, 0.0, 0]
                take = min(_room(unit, sliced, entry, m, c), left)
                if take <= 0:  # a replica no empty unit of this kind holds: one per unit, as before
                    take = 1
                _add(entry, i, take, m, c)
                units.append(entry)
                open_.append(entry)
                left -= take
            # A unit that cannot take even the smallest replica left stays closed.
            open_ = [e for e in open_ if e[3] < unit.replicas and not (sliced and (
                e[1] + least_m > unit.memory_gib + EPS or e[2] + least_c > unit.sum_compute + EPS))]
        fills += [Fill(u, tuple(sorted(entry[0].items()))) for entry in units]
    return fills


def _room(unit: UnitKind, sliced: bool, entry: list[Any], m: float, c: float) -> int:
    """How many more replicas of memory m and compute c the unit `entry` takes."""
    most = unit.replicas - entry[3]
    if sliced:
        most = min(most, _copies(unit.memory_gib - entry[1], m), _copies(unit.sum_compute - entry[2], c))
    return max(most, 0)


def _copies(free: float, each: float) -> int:
    """How many of `each` fit in `free` (within EPS, as one-at-a-time placement compares)."""
    if each <= 0:
        return 1 << 62
    return int(math.floor((free + EPS) / each + 1e-12))


def _add(entry: list[Any], i: int, take: int, m: float, c: float) -> None:
    entry[0][i] = entry[0].get(i, 0) + take
    entry[1] += m * take
    entry[2] += c * take
    entry[3] += take


def compact_plan(data: Data, compact: Compact, clock: Clock) -> IntSolution | None:
    """The compact LP's assignment rounded per replica type (largest remainders), packed per unit kind, and
    the units covered by configurations."""
    by_item: dict[int, list[tuple[int, float]]] = {}
    for (i, u), value in compact.assignment.items():
        by_item.setdefault(i, []).append((u, value))
    wanted: dict[int, dict[int, int]] = {}
    for i, shares in by_item.items():
        total = sum(v for _, v in shares)
        demand = int(data.demand[i])
        exact = [(u, v * demand / total) for u, v in shares]
        counts = {u: int(math.floor(v + INTEGRALITY)) for u, v in exact}
        left = demand - sum(counts.values())
        for u, _ in sorted(exact, key=lambda t: -(t[1] - math.floor(t[1] + INTEGRALITY)))[:left]:
            counts[u] += 1
        for u, c in counts.items():
            if c:
                wanted.setdefault(u, {})[i] = c
    return settle(data, pack_kinds(data, wanted), clock)


def _int_model(data: Data, fills: list[Fill], start: IntSolution | None) -> Any:
    rows = Rows(data)
    h = highs(MIP_NODES)
    rows.add_to(h)
    columns = [(g.cost, rows.config(g)) for g in data.configs] + [(0.0, rows.fill(f)) for f in fills]
    add_columns(h, columns, integer=True)
    if data.problem.demand.objective == "gpus":
        h.setOptionValue("mip_abs_gap", 1.0 - MIP_GAP)  # objectives are whole numbers of GPUs
    h.setOptionValue("mip_rel_gap", MIP_GAP)
    if start is not None:
        col = {f: len(data.configs) + k for k, f in enumerate(fills)}
        values = np.zeros(len(columns))
        for g, x in start.configs.items():
            values[g] = x
        for f, y in start.fills.items():
            values[col[f]] = y
        h.setSolution(len(columns), np.arange(len(columns), dtype=np.int32), values)
    return h


def solve_mip(data: Data, fills: list[Fill], clock: Clock, start: IntSolution | None
              ) -> tuple[IntSolution | None, bool, float]:
    """Best plan over the given fills: (plan, proven optimal over them, the MIP's dual bound)."""
    h = _int_model(data, fills, start)
    clock.run(h)
    info = h.getInfo()
    status = h.modelStatusToString(h.getModelStatus())
    if info.primal_solution_status != 2:
        return None, False, -math.inf
    values = np.array(h.getSolution().col_value)
    g_count = len(data.configs)
    configs = {g: int(round(values[g])) for g in range(g_count) if round(values[g]) >= 1}
    chosen = {f: int(round(values[g_count + k])) for k, f in enumerate(fills) if round(values[g_count + k]) >= 1}
    objective = sum(data.configs[g].cost * x for g, x in configs.items())
    return IntSolution(configs, chosen, objective), status == "Optimal", float(info.mip_dual_bound)


def cover_units(data: Data, need: dict[int, int], clock: Clock) -> tuple[dict[int, int], dict[int, int]] | None:
    """Fewest (cheapest) GPUs whose configurations provide the units needed, within availability and the
    oversubscription limit: the integer program above with the fills fixed. Units it cannot provide (GPUs in
    short supply) are returned as a shortfall per kind instead of failing."""
    rows = Rows(data)
    h = highs(COVER_NODES)
    lower = rows.lower.copy()
    lower[:data.n] = 0.0
    lower[rows.unit_row0:rows.unit_row0 + len(data.units)] = [float(need.get(u, 0)) for u in range(len(data.units))]
    rows.lower = lower
    rows.add_to(h)
    add_columns(h, [(g.cost, rows.config(g)) for g in data.configs], integer=True)
    short_kinds = sorted(u for u, c in need.items() if c > 0)
    penalty = 1e3 * max(max(data.problem.cost.values()), 1.0)
    add_columns(h, [(penalty, [(rows.unit_row0 + u, 1.0)]) for u in short_kinds], integer=True)
    if data.problem.demand.objective == "gpus":
        h.setOptionValue("mip_abs_gap", 1.0 - MIP_GAP)
    clock.run(h)
    if h.getInfo().primal_solution_status != 2:
        return None
    values = h.getSolution().col_value
    g_count = len(data.configs)
    configs = {g: int(round(values[g])) for g in range(g_count) if round(values[g]) >= 1}
    short = {u: int(round(values[g_count + k])) for k, u in enumerate(short_kinds) if round(values[g_count + k]) >= 1}
    return configs, short


def settle(data: Data, fills: list[Fill], clock: Clock) -> IntSolution | None:
    """Configurations for the units these fills need; where GPUs in short supply cannot provide them, the
    replicas of the emptiest such units are packed again on other GPU models."""
    placed = np.zeros(data.n, dtype=np.int64)
    for f in fills:
        for i, n in f.counts:
            placed[i] += n
    if (placed < data.demand).any():
        return None
    for _ in range(4):
        need: dict[int, int] = {}
        for f in fills:
            need[f.unit] = need.get(f.unit, 0) + 1
        covered = cover_units(data, need, clock)
        if covered is None:
            return None
        configs, short = covered
        if not short:
            counted: dict[Fill, int] = {}
            for f in fills:
                counted[f] = counted.get(f, 0) + 1
            return IntSolution(configs, counted, sum(data.configs[g].cost * x for g, x in configs.items()))
        used: dict[str, int] = {}
        for g, x in configs.items():
            used[data.configs[g].model.name] = used.get(data.configs[g].model.name, 0) + x
        exhausted = {name for name, supply in data.problem.supply.items()
                     if supply.count is not None and used.get(name, 0) >= supply.count}
        avoid = {u.index for u in data.units if u.model.name in exhausted} | set(short)
        released: dict[int, int] = {}
        kept: list[Fill] = []
        for f in sorted(fills, key=lambda f: sum(n for _, n in f.counts)):
            if short.get(f.unit, 0) > 0:
                short[f.unit] -= 1
                for i, n in f.counts:
                    released[i] = released.get(i, 0) + n
            else:
                kept.append(f)
        fills = pack_leftovers(data, released, kept, avoid)
    return None


def pack_leftovers(data: Data, residual: dict[int, int], fills: list[Fill], avoid: set[int] | None = None
                    ) -> list[Fill]:
    """Leftover replicas, each on the unit kind where it costs the least share of a GPU (outside `avoid` where
    it has another), packed first-fit decreasing."""
    wanted: dict[int, dict[int, int]] = {}
    for i, count in residual.items():
        if count <= 0:
            continue
        kinds = [int(u) for u in data.item_kinds[i] if not avoid or int(u) not in avoid] or \
            [int(u) for u in data.item_kinds[i]]
        best = min(kinds, key=lambda u: (gpu_share(data, data.units[u], i), data.unit_price[u]))
        wanted.setdefault(best, {})[i] = count
    return fills + pack_kinds(data, wanted)


def gpu_share(data: Data, unit: UnitKind, i: int) -> float:
    """The part of a GPU's price one replica of type i takes on a unit of this kind (first-fit's choice of kind)."""
    price = data.unit_price[unit.index]
    if unit.sharing == "exclusive":
        return float(price)
    if unit.sharing == "mps":
        return float(price / unit.replicas)
    return float(price * max(data.memory[i] / unit.memory_gib, data.compute[i] / unit.sum_compute,
                             1.0 / unit.replicas))


def round_lp(data: Data, fills: list[Fill], y: np.ndarray, clock: Clock) -> IntSolution | None:
    """LP-guided rounding: whole fills first, then the fractional ones trimmed to what is left, then FFD."""
    residual = {i: int(d) for i, d in enumerate(data.demand)}
    chosen: list[Fill] = []

    def take(fill: Fill, times: int) -> None:
        for _ in range(times):
            counts = tuple((i, min(n, residual[i])) for i, n in fill.counts if residual[i] > 0)
            if not counts:
                return
            for i, n in counts:
                residual[i] -= n
            chosen.append(Fill(fill.unit, counts))

    order = np.argsort(-(y - np.floor(y + INTEGRALITY)), kind="stable")
    for k in np.flatnonzero(y >= 1 - INTEGRALITY):
        take(fills[k], int(math.floor(y[k] + INTEGRALITY)))
    for k in order:
        if y[k] - math.floor(y[k] + INTEGRALITY) > INTEGRALITY:
            take(fills[k], 1)
    leftover = {i: r for i, r in residual.items() if r > 0}
    if leftover:
        pack_leftovers(data, leftover, chosen)
    return settle(data, chosen, clock)
