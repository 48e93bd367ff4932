# One module: the stages below are one column-generation solve, sharing Data, HiGHS's settings and the work limits.
"""Solving the packing with HiGHS: two LP lower bounds, integer plans from rounding them (and a MIP over the
generated columns on small inputs), and a local search that empties GPUs.

The configuration LP has two levels, which together are exactly the LP over whole-GPU patterns:
    min  sum_g cost_g x_g
    s.t. sum_f a_if y_f >= d_i                          for every item type i          (dual pi_i)
         sum_g n_gu x_g - sum_{f on u} y_f >= 0         for every unit kind u          (dual theta_u)
         sum_{g of model t} x_g <= N_t                  for every model with a count   (dual mu_t)
         sum_g (rho units_g - advertised_g) x_g >= 0    with --env                     (dual sigma)
x_g counts GPUs made into configuration g (all enumerated; every MIG layout passed the exact check) and y_f counts
units of kind u filled with the multiset f of replicas. Fill columns are priced: for an exclusive unit the best
replica, for MPS the best `replicas` ones, for time-slicing a three-row knapsack (memory, compute, replica slots),
greedily while generating; for the bound by enumeration or a HiGHS MIP (its dual bound), to PRICING_GAP.

Bounds valid whether or not generation converged, from the duals of any round that was priced exactly (V_u: an
upper bound on the best fill of kind u):
- Farley: raise theta_u to max(theta_u, V_u) (every fill is then dual feasible) and scale all duals down until
  every configuration is dual feasible again; the dual objective sum_i d_i pi_i - sum_t N_t mu_t, scaled, bounds.
- Lagrangian: sum_i d_i pi_i - sum_t N_t mu_t - sum_u U_u max(0, V_u - theta_u) - sum_g K_t max(0, -rc_g),
  K_t bounding the GPUs of model t in an optimal plan (from the plan found), U_u = K_t x most units u per GPU.
At convergence both are the LP optimum. A third, the compact LP (compact_bound), needs no generation at all.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpushare.planner.model import EPS, PackProblem, UnitKind

Progress = Callable[[str], None]
TOL = 1e-7
# Per time-slicing unit kind, enumerate every fill when there are at most this many: the MIP is then exact.
ENUMERATION_LIMIT = 4000
ENUMERATION_TYPES = 40
# The MIP over generated columns pays off on small models only; on large ones HiGHS spends long in root cuts.
MIP_TYPES, MIP_COLUMNS = 120, 4000
EMPTY_TRIES = 200  # failed attempts in a row that end a pass of the local search
SEARCH_NODES = 20_000  # a knapsack enumeration longer than this goes to a HiGHS MIP
# Pricing for the bound proves fill values to this relative precision; the bound gives up at most as much.
PRICING_GAP = 1e-3
# Work limits instead of time limits, so that the same input gives the same plan on every run (HiGHS has no
# work limit of its own: one thread, a fixed seed, and node and leaf limits are counted the same every time).
SEED = 20  # HiGHS random_seed
KNAPSACK_NODES = 500  # branch-and-bound nodes for one knapsack MIP; its dual bound counts even when it stops early
COVER_NODES = 1000  # for covering the units a set of fills needs with GPUs
MIP_NODES = 500  # for the MIP over the generated columns
CG_ROUNDS = 120  # rounds of column generation before the bound is certified from the last duals
COMPACT_NODES = 200  # for the compact LP with whole GPU counts (objective: cost), whose dual bound counts


@dataclass(frozen=True)
class Fill:
    """The replicas on one unit: (item type, count) pairs, sorted by item type."""

    unit: int
    counts: tuple[tuple[int, int], ...]


@dataclass
class IntSolution:
    configs: dict[int, int]  # configuration index -> GPUs
    fills: dict[Fill, int]  # fill -> units
    objective: float


@dataclass
class Slot:
    """One concrete unit of one GPU and the item types placed on it."""

    kind: int
    items: list[int] = field(default_factory=list)
    memory: float = 0.0
    compute: float = 0.0


@dataclass
class Gpu:
    config: int
    slots: list[Slot]


@dataclass
class SolveResult:
    gpus: list[Gpu]
    objective: float
    lower_bound: float
    lp_value: float
    converged: bool
    proven_optimal: bool
    method: str
    stats: dict[str, Any]


class Infeasible(Exception):
    """No plan: proven when the LP (with every column priced) needs more GPUs than are available."""

    def __init__(self, proven: bool) -> None:
        super().__init__("infeasible" if proven else "no plan found")
        self.proven = proven


_QUIET = False


def highs(nodes: int | None = None) -> Any:
    """A silent, deterministic HiGHS instance (one thread, a fixed seed, a node and leaf limit for MIPs). The first
    construction prints a banner on the C-level stdout, which would spoil `--json` output, so that one happens with
    file descriptor 1 pointed at /dev/null."""
    global _QUIET
    import highspy

    if not _QUIET:
        sys.stdout.flush()
        saved = os.dup(1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 1)
            h = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            os.close(devnull)
        _QUIET = True
    else:
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)  # parallel HiGHS is not reproducible run to run
    h.setOptionValue("random_seed", SEED)
    if nodes is not None:
        h.setOptionValue("mip_max_nodes", int(nodes))
        h.setOptionValue("mip_max_leaves", int(nodes))
    return h


class Clock:
    """A wall-clock guard only: phases end by work limits, so a run that never reaches the guard is reproducible;
    one that does is cut by time and says so (`cut`)."""

    def __init__(self, limit: float) -> None:
        self.start = time.monotonic()
        self.limit = limit
        self.cut = False

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def expired(self) -> bool:
        if self.elapsed() >= self.limit:
            self.cut = True
        return self.cut

    def run(self, h: Any) -> None:
        """Run HiGHS under what is left of the guard, noting whether the guard cut it."""
        h.setOptionValue("time_limit", float(max(0.05, self.limit - self.elapsed())))
        import highspy

        h.run()
        if h.getModelStatus() == highspy.HighsModelStatus.kTimeLimit:
            self.cut = True


# ---------------------------------------------------------------- data as arrays


class Data:
    def __init__(self, problem: PackProblem) -> None:
        self.problem = problem
        self.n = len(problem.items)
        self.units = problem.units
        self.memory = np.array([it.memory_gib for it in problem.items])
        self.compute = np.array([it.compute for it in problem.items])
        self.demand = np.array([it.demand for it in problem.items], dtype=np.int64)
        self.adm = problem.admissible
        self.configs = problem.configs
        self.limited = [name for name, s in problem.supply.items() if s.count is not None]
        self.rho = problem.max_oversubscription
        # Most units of each kind one GPU holds, and the model of each kind.
        self.per_gpu = np.zeros(len(self.units), dtype=np.int64)
        for g in self.configs:
            for u, count in g.units:
                self.per_gpu[u] = max(self.per_gpu[u], count)
        self.item_kinds = [np.flatnonzero(self.adm[i]) for i in range(self.n)]
        # Per configuration: its units by kind, its model, its term in the oversubscription row, its cost.
        self.config_units = np.zeros((len(self.configs), len(self.units)))
        for g in self.configs:
            for u, count in g.units:
                self.config_units[g.index, u] = count
        self.config_model = [g.model.name for g in self.configs]
        self.config_over = np.array([(self.rho or 0.0) * g.hardware_units - g.advertised for g in self.configs])
        self.config_cost = np.array([g.cost for g in self.configs])
        # Price of a unit: its share of its GPU's cost, for choosing where leftover replicas go; GPUs in limited
        # supply count dearer, so that a first plan rarely runs out of them.
        scarce = {name: 1.0 if s.count is None else 1.5 for name, s in problem.supply.items()}
        self.unit_price = np.array([problem.cost[u.model.name] * scarce[u.model.name] * u.compute
                                    for u in self.units])

    def valid(self, fill: Fill) -> bool:
        unit = self.units[fill.unit]
        size = sum(n for _, n in fill.counts)
        if size < 1 or size > unit.replicas:
            return False
        if any(not self.adm[i, fill.unit] or n > self.demand[i] for i, n in fill.counts):
            return False
        if unit.sharing == "time-slicing":
            memory = sum(self.memory[i] * n for i, n in fill.counts)
            compute = sum(self.compute[i] * n for i, n in fill.counts)
            return bool(memory <= unit.memory_gib + EPS and compute <= unit.sum_compute + EPS)
        return True

    def value(self, fill: Fill, pi: np.ndarray) -> float:
        return float(sum(pi[i] * n for i, n in fill.counts))


def _capacity_key(unit: UnitKind) -> tuple[Any, ...]:
    return (unit.sharing, unit.memory_gib, unit.sum_compute, unit.item_memory_gib, unit.item_compute, unit.replicas)


# ---------------------------------------------------------------- the master LP


@dataclass
class Rows:
    """Row layout shared by the LP and the MIP: cover rows, unit rows, availability rows, the ratio row."""

    data: Data

    def __post_init__(self) -> None:
        data = self.data
        n, units = data.n, len(data.units)
        self.unit_row0 = n
        self.avail_row = {name: n + units + k for k, name in enumerate(data.limited)}
        self.over_row: int | None = n + units + len(data.limited) if data.rho is not None else None
        self.count = n + units + len(data.limited) + (1 if self.over_row is not None else 0)
        self.lower = np.concatenate([data.demand.astype(float), np.zeros(units),
                                     [-float(data.problem.supply[name].count or 0) for name in data.limited],
                                     [0.0] if self.over_row is not None else []])

    def add_to(self, h: Any) -> None:
        import highspy

        h.addRows(self.count, self.lower, np.full(self.count, highspy.kHighsInf), 0, np.zeros(1, dtype=np.int32),
                  np.zeros(0, dtype=np.int32), np.zeros(0))

    def config(self, g: Any) -> list[tuple[int, float]]:
        entries = [(self.unit_row0 + u, float(c)) for u, c in g.units]
        if g.model.name in self.avail_row:
            entries.append((self.avail_row[g.model.name], -1.0))
        if self.over_row is not None:
            assert self.data.rho is not None
            entries.append((self.over_row, self.data.rho * g.hardware_units - g.advertised))
        return entries

    def fill(self, fill: Fill) -> list[tuple[int, float]]:
        return [(i, float(c)) for i, c in fill.counts] + [(self.unit_row0 + fill.unit, -1.0)]


def add_columns(h: Any, columns: list[tuple[float, list[tuple[int, float]]]], integer: bool = False) -> None:
    import highspy

    if not columns:
        return
    starts: list[int] = []
    index: list[int] = []
    value: list[float] = []
    for _, entries in columns:
        starts.append(len(index))
        for row, coef in entries:
            index.append(row)
            value.append(coef)
    count = len(columns)
    h.addCols(count, np.array([c[0] for c in columns], dtype=float), np.zeros(count),
              np.full(count, highspy.kHighsInf), len(index), np.array(starts, dtype=np.int32),
              np.array(index, dtype=np.int32), np.array(value, dtype=float))
    if integer:
        first = h.getNumCol() - count
        h.changeColsIntegrality(count, np.arange(first, first + count, dtype=np.int32),
                                np.full(count, highspy.HighsVarType.kInteger))


class Master:
    def __init__(self, data: Data, fills: list[Fill]) -> None:
        self.data = data
        self.rows = Rows(data)
        self.h = highs()
        self.h.setOptionValue("presolve", "off")  # re-solved after every batch of columns: warm starts matter
        self.rows.add_to(self.h)
        self.big = 1e4 * max(max(data.problem.cost.values()), 1.0)
        add_columns(self.h, [(g.cost, self.rows.config(g)) for g in data.configs])
        self.art0 = len(data.configs)
        add_columns(self.h, [(self.big, [(i, 1.0)]) for i in range(data.n)])
        self.fill0 = self.art0 + data.n
        self.fill_col: dict[Fill, int] = {}
        self.fills: list[Fill] = []
        self.add_fills(fills)

    def add_fills(self, fills: list[Fill]) -> int:
        new = [f for f in dict.fromkeys(fills) if f not in self.fill_col]
        for f in new:
            self.fill_col[f] = self.fill0 + len(self.fills)
            self.fills.append(f)
        add_columns(self.h, [(0.0, self.rows.fill(f)) for f in new])
        return len(new)

    def solve(self) -> tuple[float, np.ndarray, np.ndarray]:
        self.h.run()
        status = self.h.modelStatusToString(self.h.getModelStatus())
        if status != "Optimal":
            raise RuntimeError(f"the planner's LP ended {status}")
        solution = self.h.getSolution()
        return (self.h.getInfo().objective_function_value, np.array(solution.col_value),
                np.maximum(np.array(solution.row_dual), 0.0))

    def split_duals(self, duals: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, float], float]:
        n, units = self.data.n, len(self.data.units)
        mu = {name: float(duals[row]) for name, row in self.rows.avail_row.items()}
        sigma = float(duals[self.rows.over_row]) if self.rows.over_row is not None else 0.0
        return duals[:n], duals[n:n + units], mu, sigma


# ---------------------------------------------------------------- pricing


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
            values = _dual_values(data, np.maximum(theta, upper), mu, sigma)
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


def _dual_values(data: Data, theta: np.ndarray, mu: dict[str, float], sigma: float) -> np.ndarray:
    """Left-hand sides of every configuration's dual constraint (each at most its cost when dual feasible)."""
    values = data.config_units @ theta + sigma * data.config_over
    if mu:
        values -= np.array([mu.get(name, 0.0) for name in data.config_model])
    return np.asarray(values)


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


# ---------------------------------------------------------------- the compact bound


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
    assignment = {pair: float(x[first + k]) for k, pair in enumerate(pairs) if x[first + k] > 1e-9}
    if data.problem.demand.objective == "cost":
        value = max(value, _whole_gpus_bound(h, len(data.configs), clock))
    return Compact(value - 1e-6 * max(1.0, abs(value)), assignment)


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
        counts = {u: int(math.floor(v + 1e-9)) for u, v in exact}
        left = demand - sum(counts.values())
        for u, _ in sorted(exact, key=lambda t: -(t[1] - math.floor(t[1] + 1e-9)))[:left]:
            counts[u] += 1
        for u, c in counts.items():
            if c:
                wanted.setdefault(u, {})[i] = c
    return settle(data, pack_kinds(data, wanted), clock)


# ---------------------------------------------------------------- integer plans


def _int_model(data: Data, fills: list[Fill], start: IntSolution | None) -> Any:
    rows = Rows(data)
    h = highs(MIP_NODES)
    rows.add_to(h)
    columns = [(g.cost, rows.config(g)) for g in data.configs] + [(0.0, rows.fill(f)) for f in fills]
    add_columns(h, columns, integer=True)
    if data.problem.demand.objective == "gpus":
        h.setOptionValue("mip_abs_gap", 1.0 - 1e-6)  # objectives are whole numbers of GPUs
    h.setOptionValue("mip_rel_gap", 1e-6)
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
        h.setOptionValue("mip_abs_gap", 1.0 - 1e-6)
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
        fills = _pack_leftovers(data, released, kept, avoid)
    return None


def _pack_leftovers(data: Data, residual: dict[int, int], fills: list[Fill], avoid: set[int] | None = None
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

    order = np.argsort(-(y - np.floor(y + 1e-9)), kind="stable")
    for k in np.flatnonzero(y >= 1 - 1e-9):
        take(fills[k], int(math.floor(y[k] + 1e-9)))
    for k in order:
        if y[k] - math.floor(y[k] + 1e-9) > 1e-9:
            take(fills[k], 1)
    leftover = {i: r for i, r in residual.items() if r > 0}
    if leftover:
        _pack_leftovers(data, leftover, chosen)
    return settle(data, chosen, clock)


# ---------------------------------------------------------------- concrete GPUs and the local search


def realise(data: Data, solution: IntSolution) -> list[Gpu]:
    """GPUs with their units, fills put on units of their kind, surplus replicas taken off."""
    gpus: list[Gpu] = []
    free: dict[int, list[Slot]] = {}
    for g, count in sorted(solution.configs.items()):
        config = data.configs[g]
        for _ in range(count):
            slots = [Slot(u) for u, c in config.units for _ in range(c)]
            gpus.append(Gpu(g, slots))
            for slot in slots:
                free.setdefault(slot.kind, []).append(slot)
    for f, count in sorted(solution.fills.items(), key=lambda kv: -sum(n for _, n in kv[0].counts)):
        for _ in range(count):
            slot = free[f.unit].pop(0)
            for i, n in f.counts:
                slot.items.extend([i] * n)
                slot.memory += data.memory[i] * n
                slot.compute += data.compute[i] * n
    # More copies than replicas: take the surplus off the emptiest GPUs first.
    surplus = {i: -int(d) for i, d in enumerate(data.demand)}
    for gpu in gpus:
        for slot in gpu.slots:
            for i in slot.items:
                surplus[i] += 1
    for gpu in sorted(gpus, key=lambda g: sum(len(s.items) for s in g.slots)):
        for slot in gpu.slots:
            for i in list(slot.items):
                if surplus[i] > 0:
                    slot.items.remove(i)
                    slot.memory -= data.memory[i]
                    slot.compute -= data.compute[i]
                    surplus[i] -= 1
    return gpus


def _over_margin(data: Data, gpus: list[Gpu]) -> float:
    """rho * hardware units - advertised over the fleet; must stay >= 0."""
    if data.rho is None:
        return math.inf
    return sum(data.rho * data.configs[g.config].hardware_units - data.configs[g.config].advertised for g in gpus)


def _fits(data: Data, slot: Slot, i: int) -> bool:
    unit = data.units[slot.kind]
    if not data.adm[i, slot.kind] or len(slot.items) >= unit.replicas:
        return False
    if unit.sharing == "time-slicing":
        return bool(slot.memory + data.memory[i] <= unit.memory_gib + EPS
                    and slot.compute + data.compute[i] <= unit.sum_compute + EPS)
    return True


def _place(data: Data, slot: Slot, i: int) -> None:
    slot.items.append(i)
    slot.memory += data.memory[i]
    slot.compute += data.compute[i]


def _unplace(data: Data, slot: Slot, i: int) -> None:
    slot.items.remove(i)
    slot.memory -= data.memory[i]
    slot.compute -= data.compute[i]


def empty_gpus(data: Data, gpus: list[Gpu], clock: Clock) -> list[Gpu]:
    """Local search: move every replica of a lightly used GPU onto free room elsewhere (best fit), and drop that
    GPU. Lightest GPUs first; a pass ends after EMPTY_TRIES failures in a row, the search when a pass empties none."""
    margin = _over_margin(data, gpus)

    def term(gpu: Gpu) -> float:
        config = data.configs[gpu.config]
        return (data.rho or 0.0) * config.hardware_units - config.advertised

    def drop_ok(gpu: Gpu) -> bool:
        return data.rho is None or margin - term(gpu) >= -EPS

    keep = []
    for gpu in gpus:  # GPUs that ended up empty
        if not any(s.items for s in gpu.slots) and drop_ok(gpu):
            margin -= term(gpu) if data.rho is not None else 0.0
            continue
        keep.append(gpu)
    gpus = keep
    smallest = float(data.memory.min()) if data.n else 0.0
    improved = True
    while improved and not clock.expired():
        improved = False
        room: dict[int, list[tuple[int, Slot]]] = {}
        for k, gpu in enumerate(gpus):
            for slot in gpu.slots:
                unit = data.units[slot.kind]
                if len(slot.items) < unit.replicas and slot.memory + smallest <= unit.memory_gib + EPS:
                    room.setdefault(slot.kind, []).append((k, slot))
        load = [sum(len(s.items) / data.units[s.kind].replicas for s in g.slots) / len(g.slots) for g in gpus]
        removed: set[int] = set()
        failures = 0
        for k in sorted(range(len(gpus)), key=lambda k: (load[k], -data.configs[gpus[k].config].cost)):
            if failures >= EMPTY_TRIES or clock.expired():
                break
            gpu = gpus[k]
            if not drop_ok(gpu):
                continue
            moves: list[tuple[Slot, int]] = []
            # Replicas with the fewest places to go first, then the largest.
            items = sorted((i for s in gpu.slots for i in s.items),
                           key=lambda i: (len(data.item_kinds[i]), -data.memory[i]))
            ok = True
            for i in items:
                target = None
                best_left = math.inf
                for u in data.item_kinds[i]:
                    for other, slot in room.get(int(u), ()):
                        if other == k or other in removed or not _fits(data, slot, i):
                            continue
                        unit = data.units[slot.kind]
                        left = (unit.memory_gib - slot.memory - data.memory[i]) / unit.memory_gib + \
                            (unit.replicas - len(slot.items) - 1) / unit.replicas
                        if left < best_left:
                            best_left, target = left, slot
                if target is None:
                    ok = False
                    break
                _place(data, target, i)
                moves.append((target, i))
            if not ok:
                for slot, i in reversed(moves):
                    _unplace(data, slot, i)
                failures += 1
                continue
            failures = 0
            margin -= term(gpu) if data.rho is not None else 0.0
            removed.add(k)
            improved = True
        gpus = [g for k, g in enumerate(gpus) if k not in removed]
    return gpus


# ---------------------------------------------------------------- the whole solve


def objective_of(data: Data, gpus: list[Gpu]) -> float:
    return float(sum(data.configs[g.config].cost for g in gpus))


def solve(problem: PackProblem, time_limit: float, progress: Progress | None = None,
          data: Data | None = None, compact: Compact | None = None) -> SolveResult:
    """The plan from nothing; `data` and `compact` where the caller has them already (--fleet)."""
    say = progress or (lambda _: None)
    clock = Clock(time_limit)
    data = data or Data(problem)
    stats: dict[str, Any] = {"item_types": data.n, "unit_kinds": len(data.units), "configurations": len(data.configs)}

    say("LP bound: compact relaxation")
    compact = compact or compact_bound(data, clock)
    stats["compact_bound"] = round(compact.bound, 4)
    say("integer plan: rounding the compact relaxation")
    from_compact = compact_plan(data, compact, clock)
    stats["compact_plan"] = from_compact.objective if from_compact else None
    if from_compact is not None and _meets(data, from_compact.objective, compact.bound):
        # Already as good as the bound says any plan can be: nothing left to search for.
        gpus = empty_gpus(data, realise(data, from_compact), clock)
        stats.update(seconds=round(clock.elapsed(), 3), cut_by_time_limit=clock.cut)
        return SolveResult(gpus, objective_of(data, gpus), compact.bound, compact.bound, False, False,
                           "compact-rounding", stats)

    enumerated = enumerate_fills(data, ENUMERATION_LIMIT) if data.n <= ENUMERATION_TYPES else None
    stats["exhaustive"] = enumerated is not None
    if enumerated is not None:
        start_fills = enumerated
    elif from_compact is not None:
        start_fills = list(from_compact.fills)
    else:
        start_fills = _pack_leftovers(data, {i: int(d) for i, d in enumerate(data.demand)}, [])
    master = Master(data, start_fills)
    pricer = Pricer(data)
    say("LP bound: column generation")
    rounds = 0
    converged = False
    priced: list[tuple[np.ndarray, np.ndarray]] = []  # (duals, upper bounds on fill values) priced exactly
    lp_value, x, duals = master.solve()
    while True:
        rounds += 1
        pi, theta, _, _ = master.split_duals(duals)
        out_of_time = rounds > CG_ROUNDS or clock.expired()
        columns = pricer.price(pi, theta)
        if not columns or out_of_time:
            # Nothing found greedily (or no time left): certify, which also gives the bound for these duals.
            exact_columns, upper = pricer.certify(master, duals, clock, full=out_of_time)
            priced.append((duals, upper))
            if not exact_columns and not columns:
                converged = True
                break
            if out_of_time:
                break
            columns += exact_columns
        master.add_fills(columns)
        lp_value, x, duals = master.solve()
        if rounds % 10 == 0:
            say(f"LP bound: {rounds} rounds of column generation, LP {lp_value:.2f}")
    stats.update(cg_rounds=rounds, exact_rounds=len(priced), knapsack_mips=pricer.mip_calls,
                 fill_columns=len(master.fills), lp_seconds=round(clock.elapsed(), 3))
    if converged and x[master.art0:master.fill0].max(initial=0.0) > 1e-6:
        raise Infeasible(proven=True)

    say("integer plan: rounding the LP")
    best = round_lp(data, master.fills, x[master.fill0:], clock)
    method = "lp-rounding"
    proven = False
    fills = list(master.fills)
    if best is not None:
        fills += [f for f in best.fills if f not in master.fill_col]
    if not clock.expired() and data.n <= MIP_TYPES and len(fills) <= MIP_COLUMNS:
        say("integer plan: HiGHS MIP over the generated columns")
        found, optimal, _ = solve_mip(data, fills, clock, best)
        if found is not None and (best is None or found.objective < best.objective - 1e-9):
            best, method = found, "mip"
        # Over every fill there is, the MIP's optimum is the plan's.
        proven = optimal and enumerated is not None
    if from_compact is not None and (best is None or from_compact.objective < best.objective - 1e-9):
        best, method = from_compact, "compact-rounding"
    if best is None:
        raise Infeasible(proven=False)
    say("integer plan: emptying lightly used GPUs")
    gpus = empty_gpus(data, realise(data, best), clock)
    objective = objective_of(data, gpus)
    bounds = [compact.bound] + [max(farley_bound(data, master, d, u), lagrangian_bound(data, master, d, u, objective))
                                for d, u in priced]
    lower = max(bounds)
    stats.update(seconds=round(clock.elapsed(), 3), cut_by_time_limit=clock.cut)
    return SolveResult(gpus, objective, lower, lp_value, converged, proven, method, stats)


def _meets(data: Data, objective: float, bound: float) -> bool:
    if data.problem.demand.objective == "gpus":
        return objective <= math.ceil(bound - 1e-6 * max(1.0, abs(bound))) + 1e-9
    return objective <= bound + 1e-9


def farley_bound(data: Data, master: Master, duals: np.ndarray, upper: np.ndarray) -> float:
    """Raise each unit kind's dual to its best fill value (all fills are then dual feasible), scale the whole
    dual solution down until every configuration is dual feasible again: its objective is a lower bound."""
    pi, theta, mu, sigma = master.split_duals(duals)
    values = _dual_values(data, np.maximum(theta, upper), mu, sigma)
    broken = values > data.config_cost
    scale = float(np.min(data.config_cost[broken] / values[broken])) if broken.any() else 1.0
    objective = float(pi @ data.demand) - sum(mu[name] * (data.problem.supply[name].count or 0) for name in mu)
    return scale * objective


def lagrangian_bound(data: Data, master: Master, duals: np.ndarray, upper: np.ndarray, incumbent: float) -> float:
    """A lower bound on every plan's objective from any duals (see the module docstring)."""
    pi, theta, mu, sigma = master.split_duals(duals)
    problem = data.problem
    bound = float(pi @ data.demand) - sum(mu[name] * (problem.supply[name].count or 0) for name in mu)
    most: dict[str, float] = {}
    for name, supply in problem.supply.items():
        k = math.floor(incumbent / problem.cost[name] + 1e-9)
        most[name] = float(min(k, supply.count) if supply.count is not None else k)
    for u in data.units:
        excess = upper[u.index] - theta[u.index]
        if excess > 0:
            bound -= excess * most[u.model.name] * float(data.per_gpu[u.index])
    values = _dual_values(data, theta, mu, sigma)
    for g in np.flatnonzero(values > data.config_cost):
        bound -= float(values[g] - data.config_cost[g]) * most[data.config_model[g]]
    return bound
