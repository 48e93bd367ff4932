"""The whole solve: the compact bound and its rounding, column generation with exact pricing rounds, integer plans,
the local search, and the best lower bound of all."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpushare.planner.model import PackProblem
from gpushare.planner.solve.bound import Compact, compact_bound
from gpushare.planner.solve.data import Data
from gpushare.planner.solve.engine import Clock
from gpushare.planner.solve.local_search import Gpu, empty_gpus, realise
from gpushare.planner.solve.master import Master, dual_values
from gpushare.planner.solve.pricing import Pricer, enumerate_fills
from gpushare.planner.solve.rounding import compact_plan, pack_leftovers, round_lp, solve_mip
from gpushare.planner.solve.tuning import BOUND_MARGIN, COST_SLACK, INTEGRALITY

Progress = Callable[[str], None]

# Per time-slicing unit kind, enumerate every fill when there are at most this many: the MIP is then exact.
ENUMERATION_LIMIT = 4000
ENUMERATION_TYPES = 40  # tried only up to this many replica types: past them the fills nearly always exceed the limit
# The MIP over generated columns pays off on small models only; on large ones HiGHS spends long in root cuts.
MIP_TYPES, MIP_COLUMNS = 120, 4000
CG_ROUNDS = 120  # rounds of column generation before the bound is certified from the last duals
UNCOVERED = 1e-6  # an artificial column above this in the converged LP: demand no configuration covers


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
        start_fills = pack_leftovers(data, {i: int(d) for i, d in enumerate(data.demand)}, [])
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
    if converged and x[master.art0:master.fill0].max(initial=0.0) > UNCOVERED:
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
        if found is not None and (best is None or found.objective < best.objective - COST_SLACK):
            best, method = found, "mip"
        # Over every fill there is, the MIP's optimum is the plan's.
        proven = optimal and enumerated is not None
    if from_compact is not None and (best is None or from_compact.objective < best.objective - COST_SLACK):
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
        return objective <= math.ceil(bound - BOUND_MARGIN * max(1.0, abs(bound))) + COST_SLACK
    return objective <= bound + COST_SLACK


def farley_bound(data: Data, master: Master, duals: np.ndarray, upper: np.ndarray) -> float:
    """Raise each unit kind's dual to its best fill value (all fills are then dual feasible), scale the whole
    dual solution down until every configuration is dual feasible again: its objective is a lower bound."""
    pi, theta, mu, sigma = master.split_duals(duals)
    values = dual_values(data, np.maximum(theta, upper), mu, sigma)
    broken = values > data.config_cost
    scale = float(np.min(data.config_cost[broken] / values[broken])) if broken.any() else 1.0
    objective = float(pi @ data.demand) - sum(mu[name] * (data.problem.supply[name].count or 0) for name in mu)
    return scale * objective


def lagrangian_bound(data: Data, master: Master, duals: np.ndarray, upper: np.ndarray, incumbent: float) -> float:
    """A lower bound on every plan's objective from any duals (see gpushare.planner.solve's docstring)."""
    pi, theta, mu, sigma = master.split_duals(duals)
    problem = data.problem
    bound = float(pi @ data.demand) - sum(mu[name] * (problem.supply[name].count or 0) for name in mu)
    most: dict[str, float] = {}
    for name, supply in problem.supply.items():
        k = math.floor(incumbent / problem.cost[name] + INTEGRALITY)
        most[name] = float(min(k, supply.count) if supply.count is not None else k)
    for u in data.units:
        excess = upper[u.index] - theta[u.index]
        if excess > 0:
            bound -= excess * most[u.model.name] * float(data.per_gpu[u.index])
    values = dual_values(data, theta, mu, sigma)
    for g in np.flatnonzero(values > data.config_cost):
        bound -= float(values[g] - data.config_cost[g]) * most[data.config_model[g]]
    return bound
