# One module: re-planning onto existing hosts is one staged solve; its hints, model and bounds share host classes.
"""`gpushare pack --fleet ENV`: plan onto an environment's existing hosts and GPUs with the fewest disruptive
changes (docs/pack.md, "Re-planning a fleet").

A host's GPUs share its sharing profile (spec.Host.profile overrides the pool's), so a change is a host moved to
another configuration: it is drained, and all its GPUs are reconfigured. Hosts of one GPU model, one current
configuration and one GPU count are interchangeable, so the model counts them per class. The fleet as it is comes
first: where it serves the demand, nothing changes and no MIP runs. Otherwise three MIPs in order (each keeps the
previous optimum as a limit): fewest GPUs added, fewest GPUs reconfigured, fewest GPUs (or least cost) in use, the
last replaced by a greedy trim where the fills are too many to enumerate. Their starts are the fleet as it is and
two plans from nothing mapped onto whole hosts (the compact LP rounded, and the full `gpushare pack` solve). Fill
columns are every fill where there are few enough (the MIP's dual bound on changes is then proven), else first-fit
packings of every replica type on every unit kind the fleet has and those of the starts; the bounds on GPUs added
and on changes come from the same model over the compact relaxation, solved as an LP (and on small inputs as a
MIP), the bound on changes rounded up to a total that whole hosts make.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpushare.core.errors import GpushareError, Problem
from gpushare.planner.model import PackProblem, profile_config
from gpushare.planner.solve import (
    COST_SLACK,
    ENUMERATION_LIMIT,
    ENUMERATION_TYPES,
    Clock,
    Compact,
    Data,
    Fill,
    Gpu,
    Infeasible,
    IntSolution,
    SolveResult,
    add_columns,
    compact_bound,
    compact_plan,
    empty_gpus,
    enumerate_fills,
    gpu_share,
    highs,
    pack_kinds,
    realise,
    size_entries,
    size_rows,
    solve,
    unit_slots,
)

# Nodes (and leaves) per stage MIP: the stages start from the previous stage's plan, and past the root few nodes
# improve it while every node over thousands of fill columns costs.
FLEET_NODES = 50
BOUND_NODES = 500  # for the change bound's MIP over the compact relaxation, on small inputs only
BOUND_MIP_TYPES = 100  # replica types up to which it runs: at 50 it raised 3 to 4, at 500 it took 11 s for the LP's 3
COST_NODES = 5  # for the last stage (fewest GPUs in use): the hosts are settled, only idle GPUs are at stake
ROW_SLACK = 1e-6  # a start meets a row within this: its activity is a float sum
ROUNDING_SLACK = 1e-6  # an LP bound this little above a whole number counts as it before rounding up
ConfigKey = tuple[str, str, tuple[tuple[str, int], ...] | None, int]


@dataclass(frozen=True)
class FleetHost:
    name: str
    pool: str
    model: str
    gpus: int
    profile: str
    config: ConfigKey | None  # what its profile makes of its GPUs; None where the planner cannot express it


@dataclass
class HostClass:
    model: str
    config: int | None  # index into problem.configs
    gpus: int
    hosts: list[FleetHost]


@dataclass
class FleetChanges:
    gpus_reconfigured: int
    nodes_drained: list[str]
    gpus_added: int
    gpus_freed: int
    lower_bound: int  # proven: over every fill, or over the compact relaxation where they are too many
    gpus_added_bound: int = 0  # proven least GPUs added, over the compact relaxation
    moves: list[tuple[FleetHost, int]] = field(default_factory=list)  # (host, new configuration index)
    added: dict[int, int] = field(default_factory=dict)  # configuration index -> GPUs added

    def as_json(self) -> dict[str, Any]:
        return {"gpus_reconfigured": self.gpus_reconfigured, "nodes_drained": self.nodes_drained,
                "gpus_added": self.gpus_added, "gpus_added_bound": self.gpus_added_bound,
                "gpus_freed": self.gpus_freed, "lower_bound": self.lower_bound}


def fleet_hosts(fleet: Any, driver_branch: int | None) -> list[FleetHost]:
    """The environment's bare-metal hosts and what each runs; cloud node pools are not re-planned."""
    hosts = []
    for node in fleet.nodes:
        if node.managed_by != "ansible":
            continue
        found = profile_config(fleet.profiles[node.profile], node.gpu_model, driver_branch)
        config = None if found is None else (node.gpu_model.name, *found)
        hosts.append(FleetHost(node.name, node.pool, node.gpu_model.name, node.gpus_per_node, node.profile, config))
    return sorted(hosts, key=lambda h: h.name)


def host_classes(problem: PackProblem, hosts: list[FleetHost]) -> list[HostClass]:
    index = {(g.model.name, g.kind, g.layout, g.replicas): g.index for g in problem.configs}
    classes: dict[tuple[Any, ...], HostClass] = {}
    for host in hosts:
        config = index.get(host.config) if host.config is not None else None
        key = (host.model, config, host.gpus)
        classes.setdefault(key, HostClass(host.model, config, host.gpus, [])).hosts.append(host)
    return list(classes.values())


@dataclass
class Scratch:
    """The plan from nothing: GPUs per configuration and its fills, a start for the fleet MIP."""

    gpus: dict[int, int]
    fills: dict[Fill, int]


def kind_fills(data: Data, classes: list[HostClass]) -> list[Fill]:
    """First-fit packings of every replica type on every unit kind the fleet has."""
    fills: list[Fill] = []
    kinds = sorted({u for c in classes if c.config is not None for u, _ in data.configs[c.config].units})
    for u in kinds:
        wanted = {int(i): int(data.demand[i]) for i in np.flatnonzero(data.adm[:, u])}
        if wanted:
            fills += pack_kinds(data, {u: wanted})
    return fills


def scratch_plans(data: Data, clock: Clock, compact: Compact) -> list[Scratch]:
    """Plans from nothing, each a start for the fleet MIP: the compact LP rounded and emptied (well under a second),
    then the full `gpushare pack` solve (column generation). Neither maps onto whole hosts better every time: at
    500 inference-heavy workloads the first led to 5 GPUs added where the second alone led to 9."""
    plans: list[Scratch] = []
    rounded = compact_plan(data, compact, clock)
    if rounded is not None:
        plans.append(_scratch(empty_gpus(data, realise(data, rounded), clock)))
    try:
        limit = max(1.0, clock.limit - clock.elapsed()) / 2
        plans.append(_scratch(solve(data.problem, limit, data=data, compact=compact).gpus))
    except Infeasible:
        pass
    return plans


def _scratch(gpus: list[Gpu]) -> Scratch:
    scratch = Scratch({}, {})
    for gpu in gpus:
        scratch.gpus[gpu.config] = scratch.gpus.get(gpu.config, 0) + 1
        for slot in gpu.slots:
            counts: dict[int, int] = {}
            for i in slot.items:
                counts[i] = counts.get(i, 0) + 1
            if counts:
                fill = Fill(slot.kind, tuple(sorted(counts.items())))
                scratch.fills[fill] = scratch.fills.get(fill, 0) + 1
    return scratch


@dataclass
class Hint:
    """A whole plan in the fleet model's terms: hosts kept per class, hosts changed per (class, configuration),
    GPUs added and used per configuration, and fills."""

    keep: dict[int, int]
    change: dict[tuple[int, int], int]
    add: dict[int, int]
    fills: dict[Fill, int]
    used: dict[int, int] = field(default_factory=dict)


def current_hint(data: Data, classes: list[HostClass], adds: list[int]) -> Hint | None:
    """Every host as it is; the demand packed onto its units, GPUs added only for what does not fit."""
    keep = {k: len(c.hosts) for k, c in enumerate(classes) if c.config is not None}
    return _complete(data, classes, adds, Hint(keep, {}, {}, {}))


def scratch_hint(data: Data, classes: list[HostClass], adds: list[int], scratch: Scratch) -> Hint | None:
    """The plan from nothing mapped onto whole hosts: hosts already in a configuration it wants kept, then hosts
    of the same model changed to it (whole hosts while a whole host is wanted, then one host per remainder), then
    GPUs added; fills that find no unit are repacked onto spare units, then onto added GPUs."""
    keep: dict[int, int] = {}
    change: dict[tuple[int, int], int] = {}
    free = [len(c.hosts) for c in classes]
    need = dict(scratch.gpus)

    def take(k: int, g: int, n: int) -> None:
        if n <= 0:
            return
        if classes[k].config == g:
            keep[k] = keep.get(k, 0) + n
        else:
            change[(k, g)] = change.get((k, g), 0) + n
        free[k] -= n
        need[g] -= n * classes[k].gpus

    model_of = data.config_model
    for k, c in enumerate(classes):
        if c.config is not None and need.get(c.config, 0) > 0:
            take(k, c.config, min(free[k], need[c.config] // c.gpus))
    for g in sorted(need, key=lambda g: (-need[g], g)):
        for k, c in enumerate(classes):
            if c.model == model_of[g] and need[g] > 0:
                take(k, g, min(free[k], need[g] // c.gpus))
    for g in sorted(need, key=lambda g: (-need[g], g)):
        while need[g] > 0:
            same = [k for k, c in enumerate(classes) if free[k] and c.model == model_of[g]]
            if not same:
                break
            take(min(same, key=lambda k: (classes[k].config != g, k)), g, 1)
    add = {g: n for g, n in need.items() if n > 0 and g in adds}
    for k, c in enumerate(classes):
        if free[k] and c.config is not None:
            keep[k] = keep.get(k, 0) + free[k]
    return _complete(data, classes, adds, Hint(keep, change, add, dict(scratch.fills)))


def _complete(data: Data, classes: list[HostClass], adds: list[int], hint: Hint) -> Hint | None:
    """Fit the hint's fills onto its units; repack what does not fit onto spare units, then onto added GPUs (None
    where no GPU that may be added takes it); then use as few of the GPUs as hold the fills."""
    avail = np.zeros(len(data.configs), dtype=np.int64)
    for k, n in hint.keep.items():
        avail[classes[k].config] += n * classes[k].gpus  # kept classes have a config
    for (k, g), n in hint.change.items():
        avail[g] += n * classes[k].gpus
    for g, n in hint.add.items():
        avail[g] += n
    free = avail @ data.config_units
    placed: dict[Fill, int] = {}
    residual: dict[int, int] = {i: int(d) for i, d in enumerate(data.demand)}
    for f, count in sorted(hint.fills.items(), key=lambda e: (e[0].unit, e[0].counts)):
        n = min(count, int(free[f.unit]))
        if n:
            placed[f], free[f.unit] = n, free[f.unit] - n
            for i, c in f.counts:
                residual[i] -= c * n
    residual = _repack(data, free, {i: c for i, c in residual.items() if c > 0}, placed)
    if residual:
        kinds = {u for g in adds for u, _ in data.configs[g].units}
        wanted: dict[int, dict[int, int]] = {}
        for i, count in sorted(residual.items()):
            allowed = [int(u) for u in data.item_kinds[i] if int(u) in kinds]
            if not allowed:
                return None
            best = min(allowed, key=lambda u: (gpu_share(data, data.units[u], i), u))
            wanted.setdefault(best, {})[i] = count
        for f in pack_kinds(data, wanted):
            placed[f] = placed.get(f, 0) + 1
            free[f.unit] -= 1
        for u in sorted({int(u) for u in np.flatnonzero(free < 0)}):
            if free[u] >= 0:  # GPUs added for an earlier kind had units of this one
                continue
            g = max((g for g in adds if data.config_units[g, u] > 0), key=lambda g: (data.config_units[g, u], -g))
            n = math.ceil(-free[u] / data.config_units[g, u])
            hint.add[g] = hint.add.get(g, 0) + n
            avail[g] += n
            free += n * data.config_units[g]
    hint.fills = placed
    hint.used = _trim(data, avail, placed)
    return hint


def _repack(data: Data, free: np.ndarray, residual: dict[int, int], placed: dict[Fill, int]) -> dict[int, int]:
    """Replicas onto spare units (each type on the admitting kind with spare units where it takes the least share
    of a GPU), first-fit decreasing; a few passes, each moving what overflowed to kinds that still have room."""
    for _ in range(4):
        wanted: dict[int, dict[int, int]] = {}
        for i, count in sorted(residual.items()):
            kinds = [int(u) for u in data.item_kinds[i] if free[u] >= 1]
            if kinds:
                best = min(kinds, key=lambda u: (gpu_share(data, data.units[u], i), -free[u], u))
                wanted.setdefault(best, {})[i] = count
        if not wanted:
            break
        for f in pack_kinds(data, wanted):
            if free[f.unit] >= 1:
                placed[f] = placed.get(f, 0) + 1
                free[f.unit] -= 1
                for i, c in f.counts:
                    residual[i] -= c
        residual = {i: c for i, c in residual.items() if c > 0}
    return residual


def _trim(data: Data, avail: np.ndarray, fills: dict[Fill, int]) -> dict[int, int]:
    """GPUs in use per configuration: enough of those available to hold the fills, greedily by configuration."""
    need = np.zeros(len(data.units))
    for f, n in fills.items():
        need[f.unit] += n
    used: dict[int, int] = {}
    for g in map(int, np.flatnonzero(avail)):
        row = data.config_units[g]
        wanted = [math.ceil(need[u] / row[u]) for u in np.flatnonzero(row) if need[u] > 0]
        n = min(int(avail[g]), max(wanted, default=0))
        if n:
            used[g] = n
            need = np.maximum(need - n * row, 0)
    return used


class FleetModel:
    """The MIP over whole hosts kept or changed, GPUs added, GPUs used and fill columns; or, without fills, its
    relaxation with replicas assigned to unit kinds in aggregate (the compact LP's rows), whose dual bound on
    changes holds for every plan."""

    def __init__(self, data: Data, classes: list[HostClass], fills: list[Fill] | None, addable: dict[str, int | None],
                 max_changes: int | None) -> None:
        import highspy

        self.data, self.classes = data, classes
        self.fills = fills or []
        self.start: np.ndarray | None = None  # the last stage's plan
        self.hint: np.ndarray | None = None  # a heuristic first plan, checked against every row before it is given
        self.runs = 0  # stage MIPs run
        configs = data.configs
        units = len(data.units)
        self.h = h = highs(FLEET_NODES)
        # Columns: used GPUs per configuration, kept hosts per class, changed hosts per (class, configuration),
        # added GPUs per configuration of an addable model, then fills.
        self.used = list(range(len(configs)))
        self.keep = [len(configs) + k for k in range(len(classes))]
        self.changes = [(k, g.index) for k, c in enumerate(classes) for g in configs
                        if g.model.name == c.model and g.index != c.config]
        self.change0 = len(configs) + len(classes)
        self.adds = [g.index for g in configs if g.model.name in addable]
        self.add0 = self.change0 + len(self.changes)
        self.fill0 = self.add0 + len(self.adds)
        rows: list[tuple[float, float]] = []  # (lower, upper)
        entries: dict[int, list[tuple[int, float]]] = {}

        def row(lower: float, upper: float = highspy.kHighsInf) -> int:
            rows.append((lower, upper))
            return len(rows) - 1

        def put(col: int, r: int, value: float) -> None:
            entries.setdefault(col, []).append((r, value))

        cover = [row(float(d)) for d in data.demand]
        unit_rows = [row(0.0) for _ in range(units)]
        avail = [row(0.0) for _ in configs]  # GPUs in a configuration - those used >= 0
        slots = unit_slots(data) if fills is None else np.ones(units)
        for g in configs:
            put(self.used[g.index], avail[g.index], -1.0)
            for u, count in g.units:
                put(self.used[g.index], unit_rows[u], float(count * slots[u]))
        for k, c in enumerate(classes):
            r = row(-float(len(c.hosts)))
            put(self.keep[k], r, -1.0)
            if c.config is not None:
                put(self.keep[k], avail[c.config], float(c.gpus))
        self.change_row = row(-float(max_changes) if max_changes is not None else -highspy.kHighsInf)
        self.add_row = row(-highspy.kHighsInf)
        for j, (k, target) in enumerate(self.changes):
            c = classes[k]
            put(self.change0 + j, avail[target], float(c.gpus))
            put(self.change0 + j, self.change_row, -float(c.gpus))
            put(self.change0 + j, self.keep_row(k), -1.0)
        by_model: dict[str, int] = {}
        for name, most in sorted(addable.items()):
            if most is not None:
                by_model[name] = row(-float(most))
        for j, target in enumerate(self.adds):
            put(self.add0 + j, avail[target], 1.0)
            put(self.add0 + j, self.add_row, -1.0)
            model = configs[target].model.name
            if model in by_model:
                put(self.add0 + j, by_model[model], -1.0)
        if data.rho is not None:
            self._oversubscription(row, put)
        for j, f in enumerate(self.fills):
            for i, count in f.counts:
                put(self.fill0 + j, cover[i], float(count))
            put(self.fill0 + j, unit_rows[f.unit], -1.0)
        pairs = 0 if fills is not None else self._assignments(row, put, cover, unit_rows)
        count = len(rows)
        h.addRows(count, np.array([r[0] for r in rows]), np.array([r[1] for r in rows]), 0,
                  np.zeros(1, dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(0))
        total = self.fill0 + len(self.fills)
        upper = {self.keep[k]: float(len(c.hosts)) for k, c in enumerate(classes)}
        self.row_lower, self.row_upper = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
        self.entries, self.col_upper = entries, upper
        add_columns(h, [(0.0, entries.get(col, [])) for col in range(total)], integer=True)
        add_columns(h, [(0.0, entries.get(col, [])) for col in range(total, total + pairs)])
        self.total = total + pairs
        for col, ub in upper.items():
            h.changeColBounds(col, 0.0, ub)

    def _assignments(self, row: Any, put: Any, cover: list[int], unit_rows: list[int]) -> int:
        """The compact relaxation's replica side: size rows per time-sliced unit kind, and one continuous column
        per (replica type, unit kind) that admits it. Returns the number of columns."""
        data = self.data
        extra = size_rows(data)
        created = [row(0.0) for _ in extra]  # consecutive rows
        first = created[0] if created else 0
        by_unit: dict[int, list[int]] = {}
        for k, (u, *_rest) in enumerate(extra):
            by_unit.setdefault(u, []).append(k)
        for g in data.configs:
            for u, count in g.units:
                for k in by_unit.get(u, ()):
                    put(self.used[g.index], first + k, count * extra[k][3])
        col = self.fill0
        for i in range(data.n):
            for u in map(int, data.item_kinds[i]):
                put(col, cover[i], 1.0)
                put(col, unit_rows[u], -1.0)
                for r, value in size_entries(data, i, extra, by_unit.get(u, ()), first):
                    put(col, r, value)
                col += 1
        return col - self.fill0

    def vector(self, hint: Hint) -> np.ndarray | None:
        """The hint as a column vector, or None where it does not meet every row (HiGHS would reject it)."""
        x = np.zeros(self.total)
        change_col = {key: self.change0 + j for j, key in enumerate(self.changes)}
        add_col = {g: self.add0 + j for j, g in enumerate(self.adds)}
        fill_col = {f: self.fill0 + j for j, f in enumerate(self.fills)}
        if not (set(hint.change) <= set(change_col) and set(hint.add) <= set(add_col)
                and set(hint.fills) <= set(fill_col)):
            return None
        for k, n in hint.keep.items():
            x[self.keep[k]] = n
        for key, n in hint.change.items():
            x[change_col[key]] = n
        for g, n in hint.add.items():
            x[add_col[g]] = n
        for g, n in hint.used.items():
            x[self.used[g]] = n
        for f, n in hint.fills.items():
            x[fill_col[f]] = n
        return x if self.feasible(x) else None

    def trimmed(self, x: np.ndarray) -> np.ndarray:
        """The plan with GPUs in use cut to what holds its fills, greedily by configuration (hosts, additions and
        fills unchanged): the last stage where a MIP root over thousands of fill columns costs more than it gains."""
        avail = np.zeros(len(self.data.configs), dtype=np.int64)
        for k, col in enumerate(self.keep):
            if self.classes[k].config is not None:
                avail[self.classes[k].config] += int(x[col]) * self.classes[k].gpus
        for j, (k, g) in enumerate(self.changes):
            avail[g] += int(x[self.change0 + j]) * self.classes[k].gpus
        for j, g in enumerate(self.adds):
            avail[g] += int(x[self.add0 + j])
        fills = {f: int(x[self.fill0 + j]) for j, f in enumerate(self.fills) if x[self.fill0 + j] >= 1}
        trimmed = x.copy()
        trimmed[self.used] = 0
        for g, n in _trim(self.data, avail, fills).items():
            trimmed[self.used[g]] = n
        return trimmed if self.feasible(trimmed) and self.score(trimmed) <= self.score(x) else x

    def feasible(self, x: np.ndarray) -> bool:
        activity = np.zeros(len(self.row_lower))
        for col in map(int, np.flatnonzero(x)):
            for r, value in self.entries.get(col, ()):
                activity[r] += value * x[col]
        within = all(x[col] <= ub for col, ub in self.col_upper.items()) and bool(np.all(x >= 0))
        return within and bool(np.all(activity >= self.row_lower - ROW_SLACK)
                               and np.all(activity <= self.row_upper + ROW_SLACK))

    def score(self, x: np.ndarray) -> tuple[int, int, float]:
        """(GPUs added, GPUs reconfigured, cost of the GPUs used): the order the stages minimise."""
        added = int(round(sum(x[self.add0 + j] for j in range(len(self.adds)))))
        changed = int(round(sum(x[col] * cost for col, cost in self.change_costs().items())))
        return added, changed, round(float(sum(x[self.used[g.index]] * g.cost for g in self.data.configs)), 6)

    def change_costs(self) -> dict[int, float]:
        """GPUs reconfigured: each host changed counts all its GPUs."""
        return {self.change0 + j: float(self.classes[k].gpus) for j, (k, _) in enumerate(self.changes)}

    def keep_row(self, k: int) -> int:
        """The row `-kept - changed >= -hosts` of class k (rows: cover, units, configurations, then classes)."""
        return self.data.n + len(self.data.units) + len(self.data.configs) + k

    def _oversubscription(self, row: Any, put: Any) -> None:
        """Advertised within rho x hardware units over every GPU the fleet has, idle ones in their current
        configuration included (they still advertise)."""
        data = self.data
        term = data.config_over
        constant = sum(len(c.hosts) * c.gpus * term[c.config] for c in self.classes if c.config is not None)
        r = row(-float(constant))
        for j, (k, g) in enumerate(self.changes):
            c = self.classes[k]
            before = term[c.config] if c.config is not None else 0.0
            put(self.change0 + j, r, float(c.gpus * (term[g] - before)))
        for j, g in enumerate(self.adds):
            put(self.add0 + j, r, float(term[g]))

    def stage(self, costs: dict[int, float], clock: Clock, give_start: bool = True
              ) -> tuple[np.ndarray | None, float]:
        """Minimise these column costs: (solution or None, the MIP's dual bound). Without `give_start` HiGHS gets
        no MIP start, and the previous plan is kept where it is no worse."""
        total = self.total
        cost = np.zeros(total)
        for col, value in costs.items():
            cost[col] = value
        self.h.changeColsCost(total, np.arange(total, dtype=np.int32), cost)
        hint = self.start if self.start is not None else self.hint
        if hint is not None and give_start:  # set after the change: changing the model drops a start given before
            self.h.setSolution(total, np.arange(total, dtype=np.int32), hint)
        clock.run(self.h)
        self.runs += 1
        info = self.h.getInfo()
        bound = float(info.mip_dual_bound) if math.isfinite(info.mip_dual_bound) else -math.inf
        if info.primal_solution_status != 2:
            return self.start, bound  # the previous stage's plan still meets every limit set since
        found = np.round(np.array(self.h.getSolution().col_value))
        if self.start is None or float(cost @ found) < float(cost @ self.start) - COST_SLACK:
            self.start = found
        return self.start, bound

    def lower(self, costs: dict[int, float], clock: Clock) -> float:
        """The optimum of the model solved as an LP (every column made continuous first); -inf (no bound) where it
        was not solved to optimality."""
        import highspy

        total = self.total
        cost = np.zeros(total)
        for col, value in costs.items():
            cost[col] = value
        self.h.changeColsCost(total, np.arange(total, dtype=np.int32), cost)
        clock.run(self.h)
        if self.h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return -math.inf
        return float(self.h.getInfo().objective_function_value)

    def nodes(self, most: int) -> None:
        self.h.setOptionValue("mip_max_nodes", most)
        self.h.setOptionValue("mip_max_leaves", most)

    def limit(self, r: int, upper: float) -> None:
        import highspy

        self.h.changeRowBounds(r, -upper, highspy.kHighsInf)
        self.row_lower[r] = -upper


def plan_fleet(problem: PackProblem, hosts: list[FleetHost], addable: dict[str, int | None],
               max_changes: int | None, time_limit: float) -> tuple[SolveResult, FleetChanges]:
    clock = Clock(time_limit)
    data = Data(problem)
    classes = host_classes(problem, hosts)
    adds = [g.index for g in data.configs if g.model.name in addable]
    enumerated = enumerate_fills(data, ENUMERATION_LIMIT) if data.n <= ENUMERATION_TYPES else None
    exhaustive = enumerated is not None
    fills = enumerated if enumerated is not None else kind_fills(data, classes)
    current = current_hint(data, classes, adds)
    model, x = _as_it_is(data, classes, fills, current, addable, max_changes)
    bounds = Bounds(data, classes, addable, max_changes, clock)
    compact = compact_bound(data, clock)
    change_bound: float = 0.0
    if model is None or x is None:  # the fleet as it is does not serve the demand: the MIPs decide
        scratches = [] if exhaustive else scratch_plans(data, clock, compact)
        fills = [f for sc in scratches for f in sc.fills] + fills
        hints = [current, *(scratch_hint(data, classes, adds, sc) for sc in scratches)]
        found = [h for h in hints if h is not None]
        fills = list(dict.fromkeys(fills + [f for h in found for f in h.fills]))
        model = FleetModel(data, classes, fills, addable, max_changes)
        # The trivial plans that meet every row, best first: the MIPs start from the best and never end worse.
        starts = sorted((v for v in map(model.vector, found) if v is not None), key=model.score)
        model.hint = starts[0] if starts else None
        x, change_bound = _stages(model, data, exhaustive, bounds, clock)
        x = min([x, *starts], key=model.score)
    added, changed, _ = model.score(x)
    used = {g: int(x[model.used[g]]) for g in range(len(data.configs)) if x[model.used[g]] >= 1}
    chosen = {f: int(x[model.fill0 + j]) for j, f in enumerate(model.fills) if x[model.fill0 + j] >= 1}
    gpus = realise(data, IntSolution(used, chosen, sum(data.configs[g].cost * k for g, k in used.items())))
    objective = float(sum(data.configs[g.config].cost for g in gpus))
    if not exhaustive and changed > 0:
        change_bound = bounds.changes(added, changed)
    lower = host_sum_at_least(classes, change_bound - ROUNDING_SLACK) if changed > 0 else 0
    stats = {"item_types": data.n, "configurations": len(data.configs), "fill_columns": len(model.fills),
             "exhaustive": exhaustive, "stage_mips": model.runs, "seconds": round(clock.elapsed(), 3),
             "cut_by_time_limit": clock.cut}
    # The compact LP bounds every plan on these GPUs, re-planned or not.
    bound = compact.bound
    result = SolveResult(gpus, objective, bound, bound, False, False, "fleet-mip", stats)
    changes = _changes(model, x, hosts, min(lower, changed))
    changes.gpus_added_bound = min(added, bounds.added() if added > 0 else 0)
    return result, changes


def _as_it_is(data: Data, classes: list[HostClass], fills: list[Fill], current: Hint | None,
              addable: dict[str, int | None], max_changes: int | None) -> tuple[FleetModel | None, np.ndarray | None]:
    """Where the fleet as it is serves the demand (nothing added, every row met), that plan and its model: zero
    changes, and no plan from nothing or MIP is needed."""
    if current is None or current.add:
        return None, None
    model = FleetModel(data, classes, list(dict.fromkeys(fills + list(current.fills))), addable, max_changes)
    return model, model.vector(current)


class Bounds:
    """Proven lower bounds from the fleet model over the compact relaxation (replicas assigned to unit kinds in
    aggregate), which holds every plan, solved as one LP: GPUs added, then GPUs reconfigured among plans adding no
    more, each rounded up to what whole hosts can make."""

    def __init__(self, data: Data, classes: list[HostClass], addable: dict[str, int | None],
                 max_changes: int | None, clock: Clock) -> None:
        self.args = (data, classes, addable, max_changes)
        self.clock = clock
        self.model: FleetModel | None = None
        self.add_lp: float | None = None

    def _lp(self) -> FleetModel:
        if self.model is None:
            lp = self.model = FleetModel(*self.args[:2], None, *self.args[2:])
            lp.h.changeColsIntegrality(lp.total, np.arange(lp.total, dtype=np.int32), np.zeros(lp.total, np.uint8))
        return self.model

    def _mip_bound(self, added: int) -> float:
        """The same model with whole hosts and GPUs (BOUND_NODES nodes): its dual bound on GPUs reconfigured, on
        small inputs only, where it is cheap and can be higher than the LP's; -inf elsewhere."""
        if self.args[0].n > BOUND_MIP_TYPES:
            return -math.inf
        mip = FleetModel(*self.args[:2], None, *self.args[2:])
        mip.nodes(BOUND_NODES)
        mip.limit(mip.add_row, added)
        return mip.stage(mip.change_costs(), self.clock)[1]

    def added(self) -> int:
        """The least number of GPUs added, rounded up from the LP (a fraction of a MIP root's time). The MIP's dual
        bound is not tried: at 50 inference-heavy workloads (500 nodes, 1 s) it stayed at the LP's 18."""
        if self.add_lp is None:
            lp = self._lp()
            self.add_lp = lp.lower({lp.add0 + j: 1.0 for j in range(len(lp.adds))}, self.clock)
        return _rounded(self.add_lp)

    def changes(self, added: int, plan: int) -> int:
        """The least GPUs reconfigured among plans adding at most `added` GPUs: the LP's optimum (or on small inputs,
        where that is below the plan's `plan`, the MIP's dual bound where higher) rounded up to the least sum of
        whole hosts' GPU counts that reaches it. On the 500-workload mixed benchmark (6 GPUs added) the MIP (500 nodes)
        proved the same 3 in 11 s as the LP in 0.5 s."""
        lp = self._lp()
        lp.limit(lp.add_row, added)
        value = lp.lower(lp.change_costs(), self.clock)
        if host_sum_at_least(self.args[1], value - ROUNDING_SLACK) < plan:
            value = max(value, self._mip_bound(added))
        return host_sum_at_least(self.args[1], value - ROUNDING_SLACK) if math.isfinite(value) else 0


def _rounded(value: float) -> int:
    return max(0, math.ceil(value - ROUNDING_SLACK)) if math.isfinite(value) else 0


def host_sum_at_least(classes: list[HostClass], value: float) -> int:
    """The least total of GPU counts over some whole hosts that is at least `value`: every change moves whole
    hosts, so no plan reconfigures fewer GPUs (a bitset of reachable totals; 0 where value <= 0)."""
    if value <= 0:
        return 0
    reach = 1  # bit t set: some hosts hold t GPUs in all
    for c in classes:
        left, step = len(c.hosts), 1
        while left > 0:  # binary splitting of the class's hosts: totals of any number of them
            take = min(step, left)
            reach |= reach << (take * c.gpus)
            left, step = left - take, step * 2
    reach >>= math.ceil(value)
    return math.ceil(value) + (reach & -reach).bit_length() - 1 if reach else math.ceil(value)


def _stages(model: FleetModel, data: Data, exhaustive: bool, bounds: Bounds, clock: Clock
            ) -> tuple[np.ndarray, float]:
    """The three MIPs in order, each limited by the previous optimum and started from the best trivial plan:
    (plan, dual bound on GPUs reconfigured). The first is not run where that plan adds no more GPUs than the
    proven bound; the last (fewest GPUs in use) gets COST_NODES nodes, and where the fills were not all enumerated
    it is replaced by trimming the GPUs in use to what holds the second's fills."""
    add_costs = {model.add0 + j: 1.0 for j in range(len(model.adds))}
    if model.hint is not None and model.score(model.hint)[0] <= bounds.added():
        model.start = model.hint
    x: np.ndarray | None = model.start
    if x is None:
        x, _ = model.stage(add_costs, clock)
    if x is None:
        raise Infeasible(proven=exhaustive)
    model.limit(model.add_row, model.score(x)[0])
    # No MIP start here: on the 500-workload mixed benchmark HiGHS took 27 s with it and 9 s without, same plan.
    x, change_bound = model.stage(model.change_costs(), clock, give_start=False)
    assert x is not None  # the previous stage's plan is still feasible
    if not exhaustive:
        return model.trimmed(x), change_bound
    model.limit(model.change_row, model.score(x)[1])
    model.nodes(COST_NODES)
    x, _ = model.stage({model.used[g.index]: g.cost for g in data.configs}, clock)
    assert x is not None
    return x, change_bound


def _changes(model: FleetModel, x: np.ndarray, hosts: list[FleetHost], lower: int) -> FleetChanges:
    """Which hosts move (the first by name in each class), GPUs added, and GPUs left idle."""
    moves: list[tuple[FleetHost, int]] = []
    for j, (k, g) in enumerate(model.changes):
        c = model.classes[k]
        taken = {h.name for h, _ in moves}
        free = [h for h in c.hosts if h.name not in taken]
        moves += [(h, g) for h in free[:int(x[model.change0 + j])]]
    added = {g: int(x[model.add0 + j]) for j, g in enumerate(model.adds) if x[model.add0 + j] >= 1}
    used = int(sum(x[col] for col in model.used))
    existing = sum(h.gpus for h in hosts)
    return FleetChanges(
        gpus_reconfigured=sum(h.gpus for h, _ in moves), nodes_drained=sorted(h.name for h, _ in moves),
        gpus_added=sum(added.values()), gpus_freed=max(0, existing + sum(added.values()) - used),
        lower_bound=lower, moves=sorted(moves, key=lambda m: m[0].name), added=added)


def no_fleet_error(env: str) -> GpushareError:
    return GpushareError(Problem(f"environment {env} has no bare-metal hosts to re-plan",
                                 fix="use --env to plan a new fleet within its guardrails, or add hosts to a pool"))
