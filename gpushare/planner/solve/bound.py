"""The compact bound: one LP over the configurations with replicas assigned to unit kinds in aggregate, a lower
bound that needs no column generation (and, with costs, the same with whole GPUs per configuration)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpushare.planner.model import EPS
from gpushare.planner.solve.data import Data
from gpushare.planner.solve.engine import Clock, highs
from gpushare.planner.solve.master import Rows, add_columns
from gpushare.planner.solve.tuning import BOUND_MARGIN, INTEGRALITY

COMPACT_NODES = 200  # for the compact LP with whole GPU counts (objective: cost), whose dual bound counts


@dataclass
class Compact:
    bound: float
    assignment: dict[tuple[int, int], float]  # (item type, unit kind) -> replicas, fractional


def size_rows(data: Data) -> list[tuple[int, str, float, float]]:
    """The compact LP's rows per time-sliced unit kind: (unit kind, dimension, threshold or -1 for the sum, what one
    unit holds): the sums of memory and compute, and "at most k replicas larger than 1/(k+1) of it"."""
    extra: list[tuple[int, str, float, float]] = []
    for unit in data.units:
        if unit.sharing != "time-slicing":
            continue
        admitted = np.flatnonzero(data.adm[:, unit.index])
        extra.append((unit.index, "memory", -1.0, unit.memory_gib))
        extra.append((unit.index, "compute", -1.0, unit.sum_compute))
        for dimension, sizes, capacity in (("memory", data.memory, unit.memory_gib),
                                           ("compute", data.compute, unit.sum_compute)):
            previous = -1
            for k in range(1, unit.replicas):
                big = int((sizes[admitted] > capacity / (k + 1) + EPS).sum())
                if big and big != previous:
                    extra.append((unit.index, dimension, capacity / (k + 1), float(k)))
                previous = big
    return extra


def unit_slots(data: Data) -> np.ndarray:
    """Replicas one unit of each kind takes: one when exclusive, `replicas` otherwise."""
    return np.array([1.0 if u.sharing == "exclusive" else float(u.replicas) for u in data.units])


def size_entries(data: Data, i: int, extra: list[tuple[int, str, float, float]], rows: Any, row0: int
                 ) -> list[tuple[int, float]]:
    """One replica of type i in the size rows `rows` (indices into `extra`, which start at row `row0`)."""
    entries = []
    for k in rows:
        _, dimension, threshold, _ = extra[k]
        size = float(data.memory[i] if dimension == "memory" else data.compute[i])
        if threshold < 0:
            entries.append((row0 + k, -size))
        elif size > threshold + EPS:
            entries.append((row0 + k, -1.0))
    return entries


def compact_bound(data: Data, clock: Clock) -> Compact:
    """A second lower bound, from one LP that scales to thousands of replica types: the configurations as in
    the master LP, but replicas assigned to unit kinds in aggregate. Exclusive and MPS units are exact this way
    (one replica, or `replicas` admissible ones); a time-sliced kind's units hold in total at most their memory,
    their compute and their replica slots, and, for every k below `replicas`, at most k replicas each of those
    larger than 1/(k+1) of the unit's memory (or compute). Every plan satisfies all of it."""
    import highspy

    h = highs()
    rows = Rows(data)
    n, units = data.n, len(data.units)
    extra = size_rows(data)
    count = rows.count + len(extra)
    lower = np.concatenate([rows.lower, np.zeros(len(extra))])
    h.addRows(count, lower, np.full(count, highspy.kHighsInf), 0, np.zeros(1, dtype=np.int32),
              np.zeros(0, dtype=np.int32), np.zeros(0))
    # Unit rows read "slots provided - replicas placed >= 0": one slot per exclusive unit, `replicas` otherwise.
    slots = unit_slots(data)
    by_unit: dict[int, list[int]] = {}
    for k, (u, *_rest) in enumerate(extra):
        by_unit.setdefault(u, []).append(k)
    columns: list[tuple[float, list[tuple[int, float]]]] = []
    for g in data.configs:
        entries = []
        for r, c in rows.config(g):
            unit_row = rows.unit_row0 <= r < rows.unit_row0 + units
            entries.append((r, c * slots[r - rows.unit_row0] if unit_row else c))
        for u, c in g.units:
            for k in by_unit.get(u, ()):
                entries.append((rows.count + k, c * extra[k][3]))
        columns.append((g.cost, entries))
    pairs: list[tuple[int, int]] = []
    for i in range(n):
        for u in map(int, data.item_kinds[i]):
            pairs.append((i, u))
            entries = [(i, 1.0), (rows.unit_row0 + u, -1.0)]
            entries += size_entries(data, i, extra, by_unit.get(u, ()), rows.count)
            columns.append((0.0, entries))
    add_columns(h, columns)
    clock.run(h)
    if h.modelStatusToString(h.getModelStatus()) != "Optimal":
        return Compact(0.0, {})
    value = float(h.getInfo().objective_function_value)
    x = h.getSolution().col_value
    first = len(data.configs)
    assignment = {pair: float(x[first + k]) for k, pair in enumerate(pairs) if x[first + k] > INTEGRALITY}
    if data.problem.demand.objective == "cost":
        value = max(value, _whole_gpus_bound(h, len(data.configs), clock))
    return Compact(value - BOUND_MARGIN * max(1.0, abs(value)), assignment)


def _whole_gpus_bound(h: Any, configs: int, clock: Clock) -> float:
    """The compact LP with whole GPUs per configuration (replicas still fractional): its MIP dual bound is a lower
    bound that the integer rounding per model and what the supply forces raise above the LP's. With costs, whole
    GPU counts are what an LP bound misses (an L4 mix: LP 12.42 where whole GPUs force 12.6)."""
    import highspy

    h.changeColsIntegrality(configs, np.arange(configs, dtype=np.int32),
                            np.full(configs, highspy.HighsVarType.kInteger))
    h.setOptionValue("mip_max_nodes", COMPACT_NODES)
    h.setOptionValue("mip_max_leaves", COMPACT_NODES)
    clock.run(h)
    bound = float(h.getInfo().mip_dual_bound)
    return bound if math.isfinite(bound) else -math.inf
