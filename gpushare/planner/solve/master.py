"""The master LP of column generation: configuration and fill columns over the cover, unit, availability and
oversubscription rows (the row layout the compact LP and the integer programs reuse)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpushare.planner.solve.data import Data, Fill
from gpushare.planner.solve.engine import highs


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


def dual_values(data: Data, theta: np.ndarray, mu: dict[str, float], sigma: float) -> np.ndarray:
    """Left-hand sides of every configuration's dual constraint (each at most its cost when dual feasible)."""
    values = data.config_units @ theta + sigma * data.config_over
    if mu:
        values -= np.array([mu.get(name, 0.0) for name in data.config_model])
    return np.asarray(values)
