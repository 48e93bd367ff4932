"""The planner's model: what a GPU can become, what a replica can run on, and who may share.

Three levels, each with one source of truth:
- a GPU configuration (`GpuConfig`): a GPU model with one sharing profile kind (exclusive, time-slicing, mps, mig,
  mig-time-slicing), its MIG layout (a multiset that passes the exact check in gpushare.mig) and its replicas;
  it provides hardware units, and advertises schedulable resources;
- a unit kind (`UnitKind`): a whole GPU or a MIG instance, shared in one way (exclusive, time-slicing or MPS), with
  its memory, its compute and how many replicas it takes;
- an item type (`ItemType`): workload replicas that are interchangeable for the planner (same units admit them and,
  where they can be time-sliced, same memory and compute).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from gpushare.core.catalog import GpuModel, MigProfile, load_catalog
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.mig import check_layout, layout_counts, layout_from_counts, parse_layout
from gpushare.core.resolve import generic_layout
from gpushare.planner.demand import Demand, GpuSupply

Sharing = Literal["exclusive", "time-slicing", "mps"]
# Sums of GiB and compute shares are compared with this slack, so that 0.1 + 0.2 fits 0.3.
EPS = 1e-9
MPS_MAX_REPLICAS = 48  # gpushare.spec.MpsSpec


@dataclass(frozen=True)
class UnitKind:
    """A whole GPU or a MIG instance of one model, shared in one way."""

    index: int
    model: GpuModel
    profile: str | None  # the MIG profile; None for the whole GPU
    sharing: Sharing
    replicas: int  # most replicas on one unit (1 when exclusive)
    memory_gib: float  # what the replicas on it may add up to
    compute: float  # the unit's share of its GPU's compute
    item_memory_gib: float  # most one replica may use (MPS: memory / replicas)
    item_compute: float  # most one replica may use (MPS: 1 / replicas)
    sum_compute: float  # what the replicas on it may add up to (time-slicing: budget x compute)

    @property
    def label(self) -> str:
        where = self.profile or "whole GPU"
        if self.sharing == "exclusive":
            return where
        return f"{where} {self.sharing} x{self.replicas}"


@dataclass(frozen=True)
class GpuConfig:
    """What one GPU becomes: the profile kind, the MIG layout and the replicas; the units it provides."""

    index: int
    model: GpuModel
    kind: str  # a gpushare.spec profile kind
    layout: tuple[tuple[str, int], ...] | None  # MIG layout (profile, count) in catalog order; None: MIG off
    replicas: int  # time-slicing or MPS replicas per unit; 1 otherwise
    units: tuple[tuple[int, int], ...]  # (unit kind index, count)
    advertised: int
    hardware_units: int
    cost: float
    profile_name: str | None = None  # an existing sharing profile that resolves to exactly this on this model

    @property
    def layout_dict(self) -> dict[str, int]:
        return dict(self.layout or ())

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.model.name, self.kind, self.layout, self.replicas)

    @property
    def label(self) -> str:
        if self.layout is not None:
            text = ",".join(f"{p}={n}" for p, n in self.layout)
            return f"{self.kind} {text}" + (f" x{self.replicas}" if self.replicas > 1 else "")
        return self.kind + (f" x{self.replicas}" if self.replicas > 1 else "")


@dataclass
class ItemType:
    index: int
    memory_gib: float  # the largest of its members (they are equal where time-slicing admits them)
    compute: float
    demand: int
    members: list[tuple[int, int]]  # (workload index, replicas of it in this type)
    time_sliceable: bool


@dataclass
class PackProblem:
    demand: Demand
    items: list[ItemType]
    units: list[UnitKind]
    configs: list[GpuConfig]
    models: dict[str, GpuModel]
    supply: dict[str, GpuSupply]  # by model name
    cost: dict[str, float]  # objective cost of one GPU, by model name
    admissible: np.ndarray  # (items, units) bool: the item may run on the unit kind, alone
    max_oversubscription: float | None
    untrusted: list[bool]  # per workload
    latency: list[str]  # per workload
    environment: str | None = None
    restricted_profiles: bool = False  # only the environment's allowed, existing profiles
    driver_branch: int | None = None
    cluster: Any = None  # the spec.Cluster the pools go to, with --env
    profiles: dict[str, Any] = field(default_factory=dict)  # sharing profiles by name, for env-out
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def total_replicas(self) -> int:
        return sum(w.replicas for w in self.demand.workloads)


# ---------------------------------------------------------------- MIG layouts


def plain_profiles(model: GpuModel) -> list[MigProfile]:
    """The profiles the planner cuts GPUs into: no media-engine or graphics variants, known memory."""
    return [p for p in model.profiles.values()
            if "+" not in p.name and "-" not in p.name and p.memory_gib is not None]


def valid_layouts(model: GpuModel, driver_branch: int | None) -> list[dict[str, int]]:
    """Every non-empty multiset of plain profiles that passes the exact MIG check, in a stable order."""
    profiles = plain_profiles(model)
    total = model.compute_slices_total
    ranges = [range(min(p.max_count, total // p.compute_slices) + 1) for p in profiles]
    found = []
    for counts in itertools.product(*ranges):
        if not any(counts) or sum(n * p.compute_slices for n, p in zip(counts, profiles, strict=True)) > total:
            continue
        layout = {p.name: n for n, p in zip(counts, profiles, strict=True) if n}
        if check_layout(model, layout_from_counts(layout), driver_branch).ok:
            found.append(layout)
    return found


def maximal(layouts: list[dict[str, int]]) -> list[dict[str, int]]:
    """Layouts to which no further instance can be added (the others only leave slices idle)."""
    def below(a: dict[str, int], b: dict[str, int]) -> bool:
        return a != b and all(n <= b.get(p, 0) for p, n in a.items())

    return [a for a in layouts if not any(below(a, b) for b in layouts)]


def _ordered(model: GpuModel, layout: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    order = {name: i for i, name in enumerate(model.profiles)}
    return tuple(sorted(((p, n) for p, n in layout.items() if n), key=lambda item: order.get(item[0], 99)))


# ---------------------------------------------------------------- existing sharing profiles


def profile_config(profile: Any, model: GpuModel, driver_branch: int | None
                   ) -> tuple[str, tuple[tuple[str, int], ...] | None, int] | None:
    """What an existing sharing profile makes of one GPU of `model`: (kind, layout, replicas), or None where it
    does not apply to the model (MIG on a GPU without MIG, no layout for the model, an invalid layout)."""
    kind = profile.kind
    if kind == "exclusive":
        return kind, None, 1
    if kind == "time-slicing":
        return kind, None, profile.time_slicing.replicas
    if kind == "mps":
        return kind, None, profile.mps.replicas
    if not model.mig_capable:
        return None
    mig = profile.mig
    counts: dict[str, int] | None = None
    if mig.layout is not None:
        counts = generic_layout(model, mig.layout)
    else:
        for key, text in (mig.layouts or {}).items():
            target = load_catalog().find(key)
            if target is not None and target.name == model.name:
                try:
                    counts = layout_counts(parse_layout(text))
                except GpushareError:
                    return None
                break
    if not counts or not check_layout(model, layout_from_counts(counts), driver_branch).ok:
        return None
    replicas = profile.time_slicing.replicas if kind == "mig-time-slicing" else 1
    return kind, _ordered(model, counts), replicas


# ---------------------------------------------------------------- building the problem


@dataclass
class Limits:
    """What the target environment allows (everything, without --env)."""

    environment: str | None = None
    max_oversubscription: float | None = None
    replicas_by_memory: Any = None  # callable(unit memory GiB) -> most shared replicas, or None
    allowed_profiles: Any = None  # callable(profile name) -> bool, or None for any
    exact_placements_only: bool = False
    driver_branch: int | None = None
    mps_allowed: bool = True
    multi_profile_mig: bool = True
    tenant_untrusted: frozenset[str] = frozenset()
    cluster: Any = None
    profiles: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # What existing nodes run (--fleet): (model name, kind, layout, replicas), planned even where not enumerated.
    existing_configs: list[tuple[str, str, tuple[tuple[str, int], ...] | None, int]] = field(default_factory=list)


class _Builder:
    def __init__(self, demand: Demand, supply: list[GpuSupply], limits: Limits,
                 supply_problem: Any) -> None:
        self.demand = demand
        self.limits = limits
        self.units: list[UnitKind] = []
        self._unit_index: dict[tuple[Any, ...], int] = {}
        self.configs: list[GpuConfig] = []
        self._config_keys: set[tuple[Any, ...]] = set()
        self.models: dict[str, GpuModel] = {}
        self.supply: dict[str, GpuSupply] = {}
        self.warnings: list[str] = []
        problems: list[Problem] = []
        catalog = load_catalog()
        for i, s in enumerate(supply):
            model = catalog.find(s.model)
            if model is None:
                problems.append(supply_problem(i, catalog))
                continue
            if model.name in self.supply:
                problems.append(supply_problem(i, None, f"GPU model {model.name} is listed twice"))
                continue
            self.models[model.name] = model
            self.supply[model.name] = s
        if problems:
            raise GpushareError(problems)

    def max_replicas(self, memory_gib: float) -> int:
        cap = self.demand.max_shared_replicas
        if self.limits.replicas_by_memory is not None:
            cap = min(cap, int(self.limits.replicas_by_memory(memory_gib)))
        return cap

    def unit(self, model: GpuModel, profile: MigProfile | None, sharing: Sharing, replicas: int) -> int:
        key = (model.name, profile.name if profile else None, sharing, replicas)
        found = self._unit_index.get(key)
        if found is not None:
            return found
        if profile is None:
            memory, compute = model.memory_gib, 1.0
        else:
            on_driver = profile.memory_gib_on(self.limits.driver_branch)  # the branch's own value where known
            assert on_driver is not None
            memory, compute = on_driver, profile.compute_slices / model.compute_slices_total
        budget = self.demand.compute_budget
        if sharing == "exclusive":
            item_memory, item_compute, sum_compute = memory, compute, compute
        elif sharing == "mps":
            item_memory, item_compute, sum_compute = memory / replicas, compute / replicas, compute
        else:
            item_memory, item_compute, sum_compute = memory, compute * budget, compute * budget
        unit = UnitKind(len(self.units), model, profile.name if profile else None, sharing, replicas, memory,
                        compute, item_memory, item_compute, sum_compute)
        self.units.append(unit)
        self._unit_index[key] = unit.index
        return unit.index

    def add_config(self, model: GpuModel, kind: str, layout: tuple[tuple[str, int], ...] | None, replicas: int,
                   profile_name: str | None) -> None:
        key = (model.name, kind, layout, replicas)
        if key in self._config_keys:
            return
        units: tuple[tuple[int, int], ...]
        if layout is None:
            sharing: Sharing = "exclusive" if kind == "exclusive" else "mps" if kind == "mps" else "time-slicing"
            units = ((self.unit(model, None, sharing, replicas), 1),)
            hardware = 1
        else:
            sharing = "time-slicing" if kind == "mig-time-slicing" else "exclusive"
            units = tuple((self.unit(model, model.profiles[p], sharing, replicas), n) for p, n in layout)
            hardware = sum(n for _, n in layout)
        cost = self.supply[model.name].cost if self.demand.objective == "cost" else 1.0
        self._config_keys.add(key)
        self.configs.append(GpuConfig(len(self.configs), model, kind, layout, replicas, units, hardware * replicas,
                                      hardware, cost, profile_name))

    def named_profiles(self, model: GpuModel) -> dict[tuple[Any, ...], str]:
        """Existing profiles the environment allows, by what they make of this model."""
        named: dict[tuple[Any, ...], str] = {}
        for name, profile in sorted(self.limits.profiles.items()):
            if self.limits.allowed_profiles is not None and not self.limits.allowed_profiles(name):
                continue
            config = profile_config(profile, model, self.limits.driver_branch)
            if config is not None:
                named.setdefault((model.name, *config), name)
        return named

    def build_model(self, model: GpuModel) -> None:
        limits = self.limits
        named = self.named_profiles(model)
        restricted = limits.allowed_profiles is not None
        candidates: list[tuple[str, tuple[tuple[str, int], ...] | None, int]] = []
        if restricted:
            candidates = [(kind, layout, replicas) for (_, kind, layout, replicas) in named]
        else:
            candidates.append(("exclusive", None, 1))
            most = self.max_replicas(model.memory_gib)
            for r in range(2, most + 1):
                if self.useful_replicas(r, most):
                    candidates.append(("time-slicing", None, r))
                if limits.mps_allowed and r <= MPS_MAX_REPLICAS:
                    candidates.append(("mps", None, r))
            candidates += self.mig_candidates(model)
        candidates += [(kind, layout, replicas) for name, kind, layout, replicas in limits.existing_configs
                       if name == model.name]
        for kind, layout, replicas in candidates:
            if not self.allowed(model, kind, layout, replicas):
                continue
            self.add_config(model, kind, layout, replicas, named.get((model.name, kind, layout, replicas)))

    def mig_candidates(self, model: GpuModel) -> list[tuple[str, tuple[tuple[str, int], ...] | None, int]]:
        if not model.mig_capable:
            return []
        # One instance of the whole GPU is a whole GPU with a little less memory: exclusive and time-slicing
        # serve the same replicas, so those layouts are left out.
        layouts = [layout for layout in valid_layouts(model, self.limits.driver_branch)
                   if sum(model.profiles[p].compute_slices * n for p, n in layout.items()) < model.compute_slices_total
                   or sum(layout.values()) > 1]
        if not self.limits.multi_profile_mig:
            layouts = [layout for layout in layouts if len(layout) == 1]
        out: list[tuple[str, tuple[tuple[str, int], ...] | None, int]] = []
        top = maximal(layouts)
        out += [("mig", _ordered(model, layout), 1) for layout in top]
        rho = self.limits.max_oversubscription
        for layout in layouts:
            memory = min(model.profiles[p].memory_gib_on(self.limits.driver_branch) or 0.0 for p in layout)
            most = self.max_replicas(memory)
            for r in range(2, most + 1):
                if not self.useful_replicas(r, most):
                    continue
                # Past the oversubscription limit, fewer instances can be what keeps the fleet within it.
                if layout in top or (rho is not None and r > rho):
                    out.append(("mig-time-slicing", _ordered(model, layout), r))
        return out

    def useful_replicas(self, replicas: int, most: int) -> bool:
        """Without an oversubscription limit, time-slicing with the most replicas serves every set of replicas
        that fewer would, at the same cost; fewer only matter where advertised resources are limited. (MPS is
        different: its replica count sets each client's share.) `gpushare pack` lowers the count afterwards to
        what each pool uses."""
        return self.limits.max_oversubscription is not None or replicas == most

    def allowed(self, model: GpuModel, kind: str, layout: tuple[tuple[str, int], ...] | None, replicas: int) -> bool:
        limits = self.limits
        if kind == "mps" and not limits.mps_allowed:
            return False
        if layout is not None:
            if limits.exact_placements_only and not model.placements_exact:
                return False
            if len(layout) > 1 and not limits.multi_profile_mig:
                return False
            if any(model.profiles[p].memory_gib is None for p, _ in layout):
                return False
        if replicas > 1:
            memories = ([model.profiles[p].memory_gib_on(limits.driver_branch) or 0.0 for p, _ in layout]
                        if layout is not None else [model.memory_gib])
            if replicas > min(self.max_replicas(m) for m in memories):
                return False
        return True


def _admissible(items: Sequence[tuple[float, float, bool, str]], units: list[UnitKind]) -> np.ndarray:
    memory = np.array([i[0] for i in items])[:, None]
    compute = np.array([i[1] for i in items])[:, None]
    own_unit = np.array([i[2] or i[3] == "high" for i in items])[:, None]
    no_slicing = np.array([i[3] == "medium" for i in items])[:, None]
    item_memory = np.array([u.item_memory_gib for u in units])[None, :]
    item_compute = np.array([u.item_compute for u in units])[None, :]
    exclusive = np.array([u.sharing == "exclusive" for u in units])[None, :]
    slicing = np.array([u.sharing == "time-slicing" for u in units])[None, :]
    fits = (memory <= item_memory + EPS) & (compute <= item_compute + EPS)
    return np.asarray(fits & (exclusive | ~own_unit) & ~(slicing & no_slicing))


def build_problem(demand: Demand, supply: list[GpuSupply], limits: Limits, supply_problem: Any,
                  workload_problem: Any) -> PackProblem:
    """Enumerate configurations, unit kinds and item types; fail with the workloads nothing can serve."""
    builder = _Builder(demand, supply, limits, supply_problem)
    for model in builder.models.values():
        builder.build_model(model)
        if model.mig_capable and any(p.memory_gib is None for p in model.profiles.values()):
            builder.warnings.append(f"{model.name}: MIG profiles without a known memory size are not planned")
    units = builder.units

    untrusted = [w.trust == "untrusted" or w.tenant in limits.tenant_untrusted for w in demand.workloads]
    latency: list[str] = [w.latency_class for w in demand.workloads]
    # Every replica is planned with its CUDA context's memory on top of its own.
    reserve = demand.context_reserve_gib
    raw = [(w.memory_gib + reserve, w.compute, untrusted[i], latency[i]) for i, w in enumerate(demand.workloads)]
    adm_workloads = _admissible(raw, units) if units else np.zeros((len(raw), 0), dtype=bool)

    problems = [workload_problem(i, _why_not(demand, i, untrusted[i], latency[i], builder))
                for i in range(len(raw)) if not adm_workloads[i].any()]
    if problems:
        raise GpushareError(problems)

    # Replicas are interchangeable when the same units admit them and, where time-slicing sums their sizes,
    # their sizes are equal: merging them keeps the model exact and makes it smaller.
    slicing = np.array([u.sharing == "time-slicing" for u in units], dtype=bool)
    groups: dict[tuple[Any, ...], ItemType] = {}
    for i, w in enumerate(demand.workloads):
        row = adm_workloads[i]
        sliceable = bool((row & slicing).any())
        key = (row.tobytes(), (w.memory_gib, w.compute) if sliceable else None)
        item = groups.get(key)
        if item is None:
            item = groups[key] = ItemType(len(groups), w.memory_gib + reserve, w.compute, 0, [], sliceable)
        item.demand += w.replicas
        item.memory_gib = max(item.memory_gib, w.memory_gib + reserve)
        item.compute = max(item.compute, w.compute)
        item.members.append((i, w.replicas))
    items = list(groups.values())
    first_member = [item.members[0][0] for item in items]
    admissible = adm_workloads[first_member]

    cost = {name: (s.cost if demand.objective == "cost" else 1.0) for name, s in builder.supply.items()}
    return PackProblem(
        demand=demand, items=items, units=units, configs=builder.configs, models=builder.models,
        supply=builder.supply, cost=cost, admissible=admissible,
        max_oversubscription=limits.max_oversubscription, untrusted=untrusted, latency=latency,
        environment=limits.environment, restricted_profiles=limits.allowed_profiles is not None,
        driver_branch=limits.driver_branch, cluster=limits.cluster,
        profiles=limits.profiles,
        notes=list(limits.notes), warnings=builder.warnings,
    )


def _why_not(demand: Demand, index: int, untrusted: bool, latency: str, builder: _Builder) -> str:
    w = demand.workloads[index]
    need = w.memory_gib + demand.context_reserve_gib
    needs = f"{w.memory_gib:g} GiB + {demand.context_reserve_gib:g} GiB CUDA context (context_reserve_gib)"
    if not builder.configs:
        return "no GPU configuration is available (no GPU model, or the environment allows no profile for them)"
    biggest = max(builder.units, key=lambda u: u.item_memory_gib)
    if need > biggest.item_memory_gib + EPS:
        return (f"needs {needs} per replica, more than any available GPU offers "
                f"({biggest.model.name}: {biggest.item_memory_gib:g} GiB)")
    own = [u for u in builder.units if u.sharing == "exclusive"]
    if untrusted or latency == "high":
        why = "is untrusted" if untrusted else "is latency-sensitive (latency: high)"
        if not own:
            return (f"{why}, so it needs a MIG instance or a whole GPU of its own, and no available GPU model "
                    "and allowed profile offers one")
        fitting = [u for u in own if need <= u.item_memory_gib + EPS]
        if not fitting:
            best = max(own, key=lambda u: u.item_memory_gib)
            return (f"{why}, so it needs a MIG instance or a whole GPU of its own, and none has "
                    f"{needs} (largest: {best.label} on {best.model.name}, {best.item_memory_gib:g} GiB)")
    return (f"needs {needs} and {w.compute:g} of a GPU's compute per replica (latency: {latency}), "
            "and no available unit offers both under the allowed sharing")


def with_replicas(problem: PackProblem, config: GpuConfig, replicas: int) -> GpuConfig:
    """The same GPU configuration with fewer time-slicing or MPS replicas per unit (each MPS client then gets
    more): what a pool that never uses all its replicas should advertise."""
    kinds = []
    for u, count in config.units:
        unit = problem.units[u]
        share = unit.sum_compute / unit.compute if unit.compute else 1.0
        if unit.sharing == "mps":
            item_memory, item_compute = unit.memory_gib / replicas, unit.compute / replicas
        else:
            item_memory, item_compute = unit.item_memory_gib, unit.item_compute
        kind = UnitKind(len(problem.units), unit.model, unit.profile, unit.sharing, replicas, unit.memory_gib,
                        unit.compute, item_memory, item_compute, unit.compute * share)
        problem.units.append(kind)
        kinds.append((kind.index, count))
    name = None
    for profile_name, profile in sorted(problem.profiles.items()):
        if profile_config(profile, config.model, problem.driver_branch) == (config.kind, config.layout, replicas):
            name = profile_name
            break
    return GpuConfig(len(problem.configs) + 10_000, config.model, config.kind, config.layout, replicas,
                     tuple(kinds), config.hardware_units * replicas, config.hardware_units, config.cost, name)
