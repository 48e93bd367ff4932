"""Pricing: fill columns whose value against the master's duals beats their unit kind's dual, found greedily while
generating, and proven (an enumeration, or a HiGHS knapsack MIP's dual bound) for the bound; and every fill of
every unit kind where there are few."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpushare.planner.model import EPS, UnitKind
from gpushare.planner.solve.data import Data, Fill
from gpushare.planner.solve.engine import Clock, highs
from gpushare.planner.solve.master import Master, dual_values

TOL = 1e-7  # duals and improvements within this of zero are HiGHS's round-off, not a reason for a column
SEARCH_NODES = 20_000  # a knapsack enumeration longer than this goes to a HiGHS MIP
# Pricing for the bound proves fill values to this relative precision; the bound gives up at most as much.
PRICING_GAP = 1e-3
KNAPSACK_NODES = 500  # branch-and-bound nodes for one knapsack MIP; its dual bound counts even when it stops early


def _capacity_key(unit: UnitKind) -> tuple[Any, ...]:
    return (unit.sharing, unit.memory_gib, unit.sum_compute, unit.item_memory_gib, unit.item_compute, unit.replicas)


def _top_replicas(order: np.ndarray, demand: np.ndarray, slots: int) -> list[tuple[int, int]]:
    taken: list[tuple[int, int]] = []
    for i in order:
        if slots <= 0:
            break
        k = int(min(demand[i], slots))
        taken.append((int(i), k))
        slots -= k
    return taken


def _greedy_knapsack(data: Data, unit: UnitKind, pi: np.ndarray, candidates: np.ndarray, order: np.ndarray
                     ) -> list[tuple[int, int]]:
    left_m, left_c, left_n = unit.memory_gib + EPS, unit.sum_compute + EPS, unit.replicas
    taken: list[tuple[int, int]] = []
    min_m = data.memory[candidates].min()
    min_c = data.compute[candidates].min()
    for i in candidates[order]:
        if left_n <= 0 or left_m < min_m or left_c < min_c:
            break
        m, c = data.memory[i], data.compute[i]
        k = int(min(data.demand[i], left_n, math.floor(left_m / m), math.floor(left_c / c)))
        if k > 0:
            taken.append((int(i), k))
            left_m -= m * k
            left_c -= c * k
            left_n -= k
    return taken


def _exact_knapsack(data: Data, unit: UnitKind, pi: np.ndarray, candidates: np.ndarray, floor: float,
                    clock: Clock) -> tuple[float | None, list[tuple[int, int]] | None]:
    """A time-sliced unit's best fill as a HiGHS MIP, looking only for fills worth more than `floor`:
    (an upper bound on the best value, or None when the MIP proved none; the best fill found)."""
    import highspy

    h = highs(KNAPSACK_NODES)
    h.setOptionValue("mip_rel_gap", PRICING_GAP)
    h.setOptionValue("objective_bound", -(floor + TOL))  # a cutoff: prune what cannot beat the floor
    k = len(candidates)
    upper = np.minimum(data.demand[candidates], unit.replicas).astype(float)
    h.addVars(k, np.zeros(k), upper)
    h.changeColsCost(k, np.arange(k, dtype=np.int32), -pi[candidates])
    h.changeColsIntegrality(k, np.arange(k, dtype=np.int32), np.full(k, highspy.HighsVarType.kInteger))
    coefficients = np.concatenate([data.memory[candidates], data.compute[candidates], np.ones(k)])
    index = np.tile(np.arange(k, dtype=np.int32), 3)
    h.addRows(3, np.full(3, -highspy.kHighsInf), np.array([unit.memory_gib, unit.sum_compute, unit.replicas]),
              3 * k, np.array([0, k, 2 * k], dtype=np.int32), index, coefficients)
    clock.run(h)
    status = h.modelStatusToString(h.getModelStatus())
    info = h.getInfo()
    fill = None
    if info.primal_solution_status == 2:
        values = np.array(h.getSolution().col_value)
        fill = [(int(candidates[j]), int(round(v))) for j, v in enumerate(values) if round(v) >= 1]
    if status == "Infeasible":
        return None, fill
    bound = -info.mip_dual_bound if math.isfinite(info.mip_dual_bound) else math.inf
    return bound, fill


def _fractional_bound(pi: np.ndarray, weight: np.ndarray, most: np.ndarray, capacity: float) -> float:
    """The fractional knapsack's optimum: an upper bound on the integer one."""
    order = np.argsort(-pi / weight, kind="stable")
    w = (weight * most)[order]
    v = (pi * most)[order]
    cw = np.cumsum(w)
    k = int(np.searchsorted(cw, capacity, side="right"))
    if k >= len(order):
        return float(v.sum())
    before = float(cw[k - 1]) if k else 0.0
    value = float(v[:k].sum())
    return value + (capacity - before) * float(pi[order[k]] / weight[order[k]])


def _undominated(data: Data, unit: UnitKind, pi: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Drop a replica type when at least `replicas` copies of others are as valuable and no larger: a best fill
    never needs it (swap it for an unused one of those)."""
    if len(candidates) <= 24:
        return candidates
    p, m, c = pi[candidates], data.memory[candidates], data.compute[candidates]
    copies = np.minimum(data.demand[candidates], unit.replicas)
    keep = np.ones(len(candidates), dtype=bool)
    for start in range(0, len(candidates), 512):
        block = slice(start, start + 512)
        index = np.arange(len(candidates))[block]
        better = ((p[None, :] >= p[block, None]) & (m[None, :] <= m[block, None]) & (c[None, :] <= c[block, None])
                  & (index[:, None] != np.arange(len(candidates))[None, :]))
        # Equal types must not remove each other: among equals only the lower index dominates.
        equal = (p[None, :] == p[block, None]) & (m[None, :] == m[block, None]) & (c[None, :] == c[block, None])
        better &= ~equal | (np.arange(len(candidates))[None, :] < index[:, None])
        keep[block] = (better * copies[None, :]).sum(axis=1) < unit.replicas
    return candidates[keep]


class _NodeLimit(Exception):
    pass


def _search_knapsack(data: Data, unit: UnitKind, pi: np.ndarray, candidates: np.ndarray, floor: float,
                     node_limit: int) -> tuple[bool, float, list[tuple[int, int]]]:
    """A time-sliced unit's best fill worth more than `floor`, by depth-first enumeration (replica types by
    value, most copies first; a branch is cut when even the densest remaining replicas in every free slot,
    GiB and compute share cannot beat the best so far by PRICING_GAP). (an upper bound on the best value, the
    best fill, [] when none beats the floor); past `node_limit` nodes (False, inf, the best fill so far)."""
    order = candidates[np.argsort(-pi[candidates], kind="stable")]
    p = [float(pi[i]) for i in order]
    m = [float(data.memory[i]) for i in order]
    c = [float(data.compute[i]) for i in order]
    d = [int(data.demand[i]) for i in order]
    k = len(order)
    # Suffix maxima of value per GiB and per compute share: no later replica is denser.
    per_m = [0.0] * (k + 1)
    per_c = [0.0] * (k + 1)
    for j in range(k - 1, -1, -1):
        per_m[j] = max(per_m[j + 1], p[j] / m[j])
        per_c[j] = max(per_c[j + 1], p[j] / c[j])
    best_value = floor
    best: list[tuple[int, int]] = []
    chosen: list[tuple[int, int]] = []
    nodes = 0

    def walk(j: int, left_n: int, left_m: float, left_c: float, value: float) -> None:
        nonlocal best_value, best, nodes
        nodes += 1
        if nodes > node_limit:
            raise _NodeLimit
        if value > best_value + 1e-12:
            best_value, best = value, list(chosen)
        if j >= k or left_n == 0:
            return
        optimistic = value + min(left_n * p[j], (left_m + EPS) * per_m[j], (left_c + EPS) * per_c[j])
        if optimistic <= best_value * (1.0 + PRICING_GAP) + 1e-12:
            return
        most = min(d[j], left_n, math.floor((left_m + EPS) / m[j]), math.floor((left_c + EPS) / c[j]))
        for n in range(most, -1, -1):
            if n:
                chosen.append((int(order[j]), n))
            walk(j + 1, left_n - n, left_m - n * m[j], left_c - n * c[j], value + n * p[j])
            if n:
                chosen.pop()

    try:
        walk(0, unit.replicas, unit.memory_gib, unit.sum_compute, 0.0)
    except _NodeLimit:
        return False, math.inf, best
    return True, best_value * (1.0 + PRICING_GAP), best


class Pricer:
    """Best fills of each unit kind against the duals; kinds with equal capacities are priced once."""

    def __init__(self, data: Data) -> None:
        self.data = data
        groups: dict[tuple[Any, ...], list[int]] = {}
        for u in data.units:
            groups.setdefault(_capacity_key(u), []).append(u.index)
        self.groups = list(groups.values())
        self.mip_calls = 0

    def _bound(self, unit: UnitKind, pi: np.ndarray, candidates: np.ndarray) -> float:
        """Surrogate relaxations of the three knapsack rows, each solved fractionally; the least is an upper
        bound on every fill's value."""
        data = self.data
        m, c = data.memory[candidates], data.compute[candidates]
        most = np.minimum(data.demand[candidates], unit.replicas).astype(float)
        values = pi[candidates]
        M, C, R = unit.memory_gib, unit.sum_compute, float(unit.replicas)
        best = math.inf
        for sm, sc, sn in ((1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 1), (1, 1, 0), (1, 0, 1), (0, 1, 1)):
            weight = sm * m / M + sc * c / C + sn / R
            best = min(best, _fractional_bound(values, weight, most, float(sm + sc + sn)))
        return best

    def _ts_fills(self, unit: UnitKind, pi: np.ndarray, candidates: np.ndarray) -> list[list[tuple[int, int]]]:
        data = self.data
        m, c = data.memory[candidates], data.compute[candidates]
        p = pi[candidates]
        fills = []
        for weight in (m / unit.memory_gib + c / unit.sum_compute + 1.0 / unit.replicas,
                       np.maximum(np.maximum(m / unit.memory_gib, c / unit.sum_compute), 1.0 / unit.replicas),
                       m / unit.memory_gib + 0.1 / unit.replicas, c / unit.sum_compute + 0.1 / unit.replicas,
                       np.ones(len(candidates))):
            fills.append(_greedy_knapsack(data, unit, pi, candidates, np.argsort(-p / weight, kind="stable")))
        return fills

    def _cheap(self, group: list[int], pi: np.ndarray, theta: np.ndarray, exact: bool
               ) -> tuple[float, list[list[tuple[int, int]]], bool]:
        """(an upper bound on the best fill value, good fills, whether the bound is reached by a fill)."""
        data = self.data
        unit = data.units[group[0]]
        candidates = np.flatnonzero(data.adm[:, unit.index] & (pi > TOL))
        if len(candidates) == 0:
            return 0.0, [], True
        order = candidates[np.argsort(-pi[candidates], kind="stable")]
        if unit.sharing == "exclusive":
            return float(pi[order[0]]), [[(int(i), 1)] for i in order[:3]], True
        top = _top_replicas(order, data.demand, unit.replicas)
        top_value = float(sum(pi[i] * n for i, n in top))
        if unit.sharing == "mps":
            return top_value, [top], True
        bound = min(top_value, self._bound(unit, pi, candidates)) if exact else top_value
        if bound <= float(theta[group].min()) + TOL:
            return bound, [], False
        fills = self._ts_fills(unit, pi, candidates)
        best = max(float(sum(pi[i] * n for i, n in f)) for f in fills)
        return bound, fills, best >= bound - TOL

    def _columns(self, group: list[int], fills: list[list[tuple[int, int]]], pi: np.ndarray, theta: np.ndarray
                 ) -> list[Fill]:
        found = []
        for u in group:
            for counts in fills:
                fill = Fill(u, tuple(sorted(counts)))
                if counts and self.data.value(fill, pi) > theta[u] + TOL and self.data.valid(fill):
                    found.append(fill)
        return found

    def price(self, pi: np.ndarray, theta: np.ndarray) -> list[Fill]:
        """Improving fill columns found greedily."""
        found: list[Fill] = []
        for group in self.groups:
            _, fills, _ = self._cheap(group, pi, theta, exact=False)
            found += self._columns(group, fills, pi, theta)
        return found

    def certify(self, master: Master, duals: np.ndarray, clock: Clock, full: bool
                ) -> tuple[list[Fill], np.ndarray]:
        """Improving columns and, per unit kind, an upper bound on its best fill value, tight where it matters.

        Raising every unit kind's dual to such a bound makes every fill dual feasible; only configurations whose
        dual constraint the raised duals then break can lower the bound (farley_bound). So only the kinds in
        those configurations are searched exactly, largest excess first (an enumeration, or a HiGHS knapsack MIP
        whose dual bound counts where the enumeration runs long), until no configuration is broken by a kind
        not yet searched. Unless `full`, it stops at the first improving column: that round's bound is not
        the last."""
        data = self.data
        pi, theta, mu, sigma = master.split_duals(duals)
        upper = np.zeros(len(data.units))
        exact = np.zeros(len(data.units), dtype=bool)
        columns: list[Fill] = []
        group_of = {}
        for k, group in enumerate(self.groups):
            bound, fills, tight = self._cheap(group, pi, theta, exact=True)
            upper[group] = bound
            exact[group] = tight
            columns += self._columns(group, fills, pi, theta)
            for u in group:
                group_of[u] = k
        while not clock.expired() and (full or not columns):
            excess: dict[int, float] = {}
            values = dual_values(data, np.maximum(theta, upper), mu, sigma)
            for g in np.flatnonzero(values > data.config_cost + TOL):
                for u, c in data.configs[g].units:
                    if not exact[u] and upper[u] > theta[u] + TOL:
                        k = group_of[u]
                        excess[k] = excess.get(k, 0.0) + c * (upper[u] - theta[u])
            if not excess:
                break
            group = self.groups[max(excess, key=lambda k: excess[k])]
            unit = data.units[group[0]]
            candidates = np.flatnonzero(data.adm[:, unit.index] & (pi > TOL))
            reduced = _undominated(data, unit, pi, candidates)
            floor = float(theta[group].min())
            complete, bound, fill = _search_knapsack(data, unit, pi, reduced, floor, SEARCH_NODES)
            if not complete and not fill:
                self.mip_calls += 1
                mip_bound, mip_fill = _exact_knapsack(data, unit, pi, reduced, floor, clock)
                bound = floor * (1.0 + PRICING_GAP) + TOL if mip_bound is None else mip_bound
                fill = mip_fill or []
            upper[group] = np.minimum(upper[group], bound)
            exact[group] = True
            if fill:
                columns += self._columns(group, [fill], pi, theta)
        return columns, upper


def enumerate_fills(data: Data, limit: int) -> list[Fill] | None:
    """Every fill of every unit kind, or None when there are more than `limit` in all."""
    fills: list[Fill] = []
    for unit in data.units:
        if _unit_fills(data, unit, fills, limit) is None:
            return None
    return fills


def _unit_fills(data: Data, unit: UnitKind, fills: list[Fill], limit: int) -> list[Fill] | None:
    candidates = [int(i) for i in np.flatnonzero(data.adm[:, unit.index])]
    chosen: list[tuple[int, int]] = []
    most = 1 if unit.sharing == "exclusive" else unit.replicas
    sliced = unit.sharing == "time-slicing"

    def walk(k: int, left_n: int, left_m: float, left_c: float) -> bool:
        if chosen:
            fills.append(Fill(unit.index, tuple(chosen)))
            if len(fills) > limit:
                return False
        for j in range(k, len(candidates)):
            i = candidates[j]
            m, c = data.memory[i], data.compute[i]
            for n in range(1, int(min(data.demand[i], left_n)) + 1):
                if sliced and (m * n > left_m + EPS or c * n > left_c + EPS):
                    break
                chosen.append((i, n))
                ok = walk(j + 1, left_n - n, left_m - m * n, left_c - c * n)
                chosen.pop()
                if not ok:
                    return False
        return True

    return fills if walk(0, most, unit.memory_gib, unit.sum_compute) else None
