"""The problem as arrays (per replica type, unit kind and configuration), and fills: the replicas on one unit."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpushare.planner.model import EPS, PackProblem


@dataclass(frozen=True)
class Fill:
    """The replicas on one unit: (item type, count) pairs, sorted by item type."""

    unit: int
    counts: tuple[tuple[int, int], ...]


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
