"""`gpushare pack`: from workload demand to per-GPU layouts, time-slicing and MPS replicas and pool sizes, with
the fewest GPUs (or the least cost), a proven lower bound and the gap to it.

Sharing rules the plan keeps (docs/pack.md, docs/safety-rules.md):
- a MIG instance or an exclusive whole GPU runs one replica, and is the only place for an untrusted or a
  latency-sensitive (latency: high) replica;
- time-slicing (a whole GPU, or every MIG instance of a GPU under mig-time-slicing) gives no memory isolation: the
  memory of the replicas on one unit must fit its memory and their compute shares add up to at most the demand's
  compute_budget of the unit's compute; only trusted, latency: low replicas;
- MPS gives each of its `replicas` clients 1/replicas of memory and SMs; never on MIG; never beside time-slicing
  (a GPU has one profile); trusted, latency medium or low;
- a unit's replicas stay within max_shared_replicas (the demand's, and with --env the guardrails' for the unit's
  memory class); with --env the planned fleet's oversubscription (advertised / hardware units) stays within the
  environment's max_oversubscription, only allowed profiles are used, inferred MIG placements are avoided where
  the environment requires exact ones, and the target cluster's mig_strategy decides between MPS (single) and
  multi-profile MIG layouts (mixed).

The model and the solver live in planner/model.py and the planner/solve package; this module builds the problem
from the files, checks the plan independently of the solver and names its profiles; planner/pack_output.py turns
the plan into an environment section (--env-out) or a fleet patch (--fleet).
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare.core.catalog import Catalog, load_catalog
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.guardrails import guardrails_path, load_guardrails
from gpushare.core.loading import Located
from gpushare.core.mig import check_layout, layout_from_counts
from gpushare.core.paths import project_root
from gpushare.core.resolve import resolve_env
from gpushare.core.spec import load_profile_file
from gpushare.core.words import counted
from gpushare.planner.demand import Demand, GpuSupply, load_demand
from gpushare.planner.fleet import FleetChanges, FleetHost, fleet_hosts, no_fleet_error, plan_fleet
from gpushare.planner.model import EPS, GpuConfig, Limits, PackProblem, UnitKind, build_problem, with_replicas
from gpushare.planner.solve import BOUND_MARGIN, Infeasible, Progress, SolveResult, solve

MIN_SOLVE_SECONDS = 0.5  # the solve gets at least this long, however little of --time-limit is left
CHECK_SHARE = 0.03  # the share of --time-limit kept back from the solve for checking the plan and writing it out
OPTIMAL_SLACK = 1e-6  # a plan this close to its lower bound counts as optimal (the bound is a float LP's)
# The independent check allows float sums this far past a unit's memory and compute, and past max_oversubscription.
CAPACITY_SLACK, OVERSUBSCRIPTION_SLACK = 1e-6, 1e-9
PURPOSE = {"online": "inference", "batch": "batch", "dev": "development"}


@dataclass
class PlannedUnit:
    kind: UnitKind
    replicas: list[tuple[int, int]]  # (workload index, replica number)


@dataclass
class PlannedGpu:
    config: GpuConfig
    units: list[PlannedUnit]
    profile: str = ""  # the sharing profile's name in the environment section


@dataclass
class PackPlan:
    problem: PackProblem
    gpus: list[PlannedGpu]
    objective: float
    lower_bound: float
    lp_value: float
    proven_optimal: bool
    converged: bool
    method: str
    seconds: float
    stats: dict[str, Any]
    new_profiles: dict[str, dict[str, Any]] = field(default_factory=dict)
    changes: FleetChanges | None = None  # with --fleet

    # ------------------------------------------------------------ figures

    @property
    def demand(self) -> Demand:
        return self.problem.demand

    @property
    def gpus_used(self) -> int:
        return len(self.gpus)

    @property
    def baseline_gpus(self) -> int:
        """One whole GPU per workload replica."""
        return self.problem.total_replicas

    @property
    def gap(self) -> float:
        return self.objective / self.lower_bound - 1.0 if self.lower_bound > 0 else 0.0

    @property
    def optimal(self) -> bool:
        return self.proven_optimal or self.objective <= self.lower_bound + OPTIMAL_SLACK

    def utilization(self) -> dict[str, float]:
        workloads = self.demand.workloads
        memory = sum(w.memory_gib * w.replicas for w in workloads)
        compute = sum(w.compute * w.replicas for w in workloads)
        gpu_memory = sum(g.config.model.memory_gib for g in self.gpus)
        used = max(1, self.gpus_used)
        return {
            "compute": round(compute / used, 4),
            "memory": round(memory / gpu_memory, 4) if gpu_memory else 0.0,
            "baseline_compute": round(compute / max(1, self.baseline_gpus), 4),
        }

    def oversubscription(self) -> float:
        units = sum(g.config.hardware_units for g in self.gpus)
        return round(sum(g.config.advertised for g in self.gpus) / units, 3) if units else 0.0

    # ------------------------------------------------------------ output

    def assignments(self) -> list[dict[str, Any]]:
        workloads = self.demand.workloads
        out: list[dict[str, Any]] = []
        for g, gpu in enumerate(self.gpus):
            for u, unit in enumerate(gpu.units):
                for w, replica in unit.replicas:
                    out.append({
                        "workload": workloads[w].name, "replica": replica, "tenant": workloads[w].tenant,
                        "gpu": g, "model": gpu.config.model.name, "unit": u,
                        "mig_profile": unit.kind.profile, "sharing": unit.kind.sharing,
                        "unit_replicas": unit.kind.replicas, "shared_with": len(unit.replicas) - 1,
                    })
        out.sort(key=lambda a: (a["workload"], a["replica"]))
        return out

    def gpu_documents(self) -> list[dict[str, Any]]:
        workloads = self.demand.workloads
        docs: list[dict[str, Any]] = []
        for g, gpu in enumerate(self.gpus):
            units: list[dict[str, Any]] = []
            for unit in gpu.units:
                names = [f"{workloads[w].name}/{r}" for w, r in unit.replicas]
                units.append({
                    "mig_profile": unit.kind.profile, "sharing": unit.kind.sharing, "replicas": unit.kind.replicas,
                    "memory_gib": unit.kind.memory_gib,
                    "memory_used_gib": round(sum(workloads[w].memory_gib for w, _ in unit.replicas), 3),
                    "compute_used": round(sum(workloads[w].compute for w, _ in unit.replicas), 4),
                    "workloads": names,
                })
            docs.append({
                "index": g, "model": gpu.config.model.name, "profile": gpu.profile, "sharing": gpu.config.kind,
                "layout": gpu.config.layout_dict, "replicas": gpu.config.replicas,
                "advertised": gpu.config.advertised, "hardware_units": gpu.config.hardware_units,
                "workloads": [n for unit in units for n in unit["workloads"]], "units": units,
            })
        return docs

    def pools(self) -> list[dict[str, Any]]:
        """GPUs grouped by model and profile: what becomes one pool."""
        groups: dict[tuple[Any, ...], list[PlannedGpu]] = {}
        for gpu in self.gpus:
            groups.setdefault(gpu.config.key, []).append(gpu)
        out: list[dict[str, Any]] = []
        for members in groups.values():
            config = members[0].config
            kinds = Counter(self.demand.workloads[w].kind for gpu in members for unit in gpu.units
                            for w, _ in unit.replicas)
            out.append({
                "model": config.model.name, "profile": members[0].profile, "sharing": config.kind,
                "layout": config.layout_dict, "replicas": config.replicas, "gpus": len(members),
                "workload_replicas": sum(len(unit.replicas) for gpu in members for unit in gpu.units),
                "purpose": PURPOSE[kinds.most_common(1)[0][0]] if kinds else "inference",
                "workloads": sorted({self.demand.workloads[w].name for gpu in members for unit in gpu.units
                                     for w, _ in unit.replicas}),
            })
        out.sort(key=lambda p: (str(p["model"]), -int(p["gpus"]), str(p["profile"])))
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": True,
            "objective": self.demand.objective,
            "gpus_used": self.gpus_used,
            "cost": round(self.objective, 6),
            "lower_bound": round(self.lower_bound, 6),
            "gap": round(self.gap, 6),
            "optimal": self.optimal,
            "baseline_gpus": self.baseline_gpus,
            "lp_value": round(self.lp_value, 6),
            "utilization": self.utilization(),
            "oversubscription": self.oversubscription(),
            "max_oversubscription": self.problem.max_oversubscription,
            "environment": self.problem.environment,
            "gpus_by_model": dict(Counter(g.config.model.name for g in self.gpus)),
            "solve": {"seconds": round(self.seconds, 3), "method": self.method, "converged": self.converged,
                      **self.stats},
            "pools": self.pools(),
            "assignments": self.assignments(),
            "gpus": self.gpu_documents(),
            "notes": self.problem.notes,
            "warnings": self.problem.warnings,
            **({"changes": self.changes.as_json()} if self.changes is not None else {}),
        }


# ---------------------------------------------------------------- building the problem from the files


def _project_profiles() -> dict[str, Any]:
    directory = project_root() / "profiles"
    found = {}
    for path in sorted(directory.glob("*.yaml")) if directory.is_dir() else []:
        profile, _ = load_profile_file(path)
        found[profile.name] = profile
    return found


def environment_limits(env: str | None) -> Limits:
    """What `--env` allows: guardrails, the target cluster, allowed profiles, tenants' trust."""
    if env is None:
        return Limits(profiles=_project_profiles())

    fleet = resolve_env(env)
    rails = load_guardrails()
    name = fleet.environment
    limits = rails.environment(name)
    clusters = list(fleet.clusters.values())
    cluster = next((c for c in clusters if c.kind == "bare-metal"), clusters[0])
    notes = [f"pools go to cluster {cluster.name} (mig_strategy {cluster.mig_strategy})"]
    if cluster.mig_strategy == "mixed":
        notes.append(f"MPS is not planned: the device plugin refuses MPS under mig_strategy mixed ({cluster.name})")
    else:
        notes.append(f"MIG layouts have one profile each: mig_strategy single ({cluster.name})")
    if "*" not in limits.allowed_profiles:
        notes.append(f"only the profiles {name} allows: {', '.join(limits.allowed_profiles)}")
    if limits.require_exact_mig_placements:
        notes.append("MIG only on GPU models with exact placements (require_exact_mig_placements)")
    return Limits(
        environment=name,
        max_oversubscription=limits.max_oversubscription,
        replicas_by_memory=lambda memory: rails.max_shared_replicas(name, memory),
        allowed_profiles=None if "*" in limits.allowed_profiles else limits.allows_profile,
        exact_placements_only=limits.require_exact_mig_placements,
        driver_branch=fleet.env.defaults.driver_branch,
        mps_allowed=cluster.mig_strategy == "single",
        multi_profile_mig=cluster.mig_strategy == "mixed",
        tenant_untrusted=frozenset(t.name for t in fleet.tenants if t.trust == "untrusted"),
        cluster=cluster,
        profiles=dict(fleet.profiles),
        notes=notes,
    )


def plan_demand(demand: Demand, doc: Located | None = None, *, env: str | None = None,
                gpus: list[GpuSupply] | None = None, time_limit: float = 60.0,
                progress: Progress | None = None, fleet: str | None = None,
                max_changes: int | None = None) -> PackPlan:
    """The plan for a demand. `gpus` (from --gpus) replaces the demand's GPU list; a model it names keeps the
    cost the demand file gives it. With `fleet` (an environment), the plan goes onto its existing hosts, and the
    GPU list says which models may be added (see replan_supply)."""
    if fleet is not None:
        if env is not None and env != fleet:
            raise GpushareError(Problem(f"--env {env} and --fleet {fleet} name different environments",
                                        fix="--fleet plans within its own environment's guardrails: drop --env"),
                                exit_code=2)
        env = fleet
    supply = demand.gpus
    from_option = gpus is not None
    if gpus is not None:
        costs = {s.model: s.cost for s in demand.gpus}
        supply = [GpuSupply(model=s.model, count=s.count, cost=costs.get(s.model, s.cost)) for s in gpus]
    if not supply and fleet is None:
        raise GpushareError(Problem("no GPU models to plan with", file=doc.file if doc else None, path="gpus",
                                    fix='list them under gpus: in the demand file, or pass --gpus "MODEL=COUNT,..."'))

    def supply_problem(i: int, catalog: Catalog | None, message: str | None = None) -> Problem:
        query = supply[i].model
        if message is None:
            assert catalog is not None
            try:
                catalog.lookup(query)
                message = f"unknown GPU {query!r}"
            except GpushareError as exc:
                message = exc.problems[0].message
        fix = "use an NVML name, alias, slug or PCI id; `gpushare gpus` lists every model"
        if from_option or doc is None:
            return Problem(message, path=f"--gpus[{i}]", fix=fix)
        return doc.problem(("gpus", i, "model"), message, fix)

    def workload_problem(i: int, message: str) -> Problem:
        name = demand.workloads[i].name
        fix = "lower memory_gib or compute, add a larger GPU model, or relax trust/latency where that is safe"
        text = f"workload {name!r} cannot be served: {message}"
        if doc is None:
            return Problem(text, path=f"workloads[{i}]", fix=fix)
        return doc.problem(("workloads", i), text, fix)

    import time

    start = time.monotonic()
    limits = environment_limits(env)
    if env is None:
        limits.driver_branch = demand.driver_branch
        limits.notes.append(f"MIG profiles and their memory as driver branch R{demand.driver_branch} has them "
                            "(the demand's driver_branch)")
    elif limits.driver_branch != demand.driver_branch and "driver_branch" in demand.model_fields_set:
        limits.notes.append(f"driver branch R{limits.driver_branch} from environment {limits.environment}, not the "
                            f"demand's R{demand.driver_branch}")
    demand = with_context_reserve(demand)
    hosts: list[FleetHost] = []
    addable: dict[str, int | None] = {}
    if fleet is not None:
        resolved = resolve_env(fleet)
        hosts = fleet_hosts(resolved, limits.driver_branch)
        if not hosts:
            raise no_fleet_error(fleet)
        cloud = sorted({n.pool for n in resolved.nodes if n.managed_by != "ansible"})
        if cloud:
            limits.notes.append(f"cloud node pools are not re-planned: {', '.join(cloud)}")
        limits.existing_configs = sorted({h.config for h in hosts if h.config is not None}, key=repr)
        supply, addable = replan_supply(supply, hosts)
    problem = build_problem(demand, supply, limits, supply_problem, workload_problem)
    # The solver's phases end by work limits; the time limit is only a guard (what is left covers the checks).
    budget = max(MIN_SOLVE_SECONDS, time_limit - (time.monotonic() - start) - CHECK_SHARE * time_limit)
    changes = None
    try:
        if fleet is not None:
            result, changes = plan_fleet(problem, hosts, addable, max_changes, budget)
        else:
            result = solve(problem, budget, progress)
    except Infeasible as exc:
        if fleet is not None:
            raise _fleet_short(problem, exc, fleet, max_changes) from None
        raise _short_supply(problem, exc, doc, from_option) from None
    if result.stats.get("cut_by_time_limit"):
        problem.warnings.append(f"the solve reached --time-limit ({time_limit:g} s) and was cut by time, so this "
                                "plan may differ from run to run; raise --time-limit for a reproducible plan")
    plan = _plan(problem, result, fewer_replicas=fleet is None)
    plan.changes = changes
    violations = check_plan(plan)
    if violations:  # the solver and this check are independent; a disagreement is a bug, never a plan
        raise RuntimeError("gpushare pack produced a plan that breaks its rules: " + "; ".join(violations[:5]))
    return plan


def with_context_reserve(demand: Demand) -> Demand:
    """The demand with the guardrails' planner.context_reserve_gib where the demand file sets none."""
    if "context_reserve_gib" in demand.model_fields_set or not guardrails_path().is_file():
        return demand
    reserve = load_guardrails().planner.context_reserve_gib
    return demand.model_copy(update={"context_reserve_gib": reserve})


def replan_supply(supply: list[GpuSupply], hosts: list[FleetHost]) -> tuple[list[GpuSupply], dict[str, int | None]]:
    """With --fleet: every model the fleet has, at its count plus what the demand's GPU list allows to add (a model
    it lists without a count: as many as needed); models the list leaves out are not added to."""
    catalog = load_catalog()
    existing: dict[str, int] = {}
    for h in hosts:
        existing[h.model] = existing.get(h.model, 0) + h.gpus
    out: list[GpuSupply] = []
    addable: dict[str, int | None] = {}
    for s in supply:
        model = catalog.find(s.model)
        name = model.name if model is not None else s.model
        have = existing.pop(name, 0)
        addable[name] = s.count
        out.append(GpuSupply(model=s.model, count=None if s.count is None else have + s.count, cost=s.cost))
    out += [GpuSupply(model=name, count=count, cost=1.0) for name, count in sorted(existing.items())]
    return out, addable


def _fleet_short(problem: PackProblem, exc: Infeasible, fleet: str, max_changes: int | None) -> GpushareError:
    limit = f" with at most {counted(max_changes, 'GPU')} reconfigured" if max_changes is not None else ""
    proven = "proven over every fill" if exc.proven else "none found by the planner"
    return GpushareError(Problem(
        f"the hosts of {fleet} cannot serve all {problem.total_replicas} workload replicas{limit}, and the demand's "
        f"gpus: allow no more GPUs to fix that ({proven})",
        fix="list the GPU models that may be added under gpus: in the demand file (no count: as many as needed)"
            + (", or raise --max-changes" if max_changes is not None else "")))


def _short_supply(problem: PackProblem, exc: Infeasible, doc: Located | None, from_option: bool) -> GpushareError:
    counts = ", ".join(f"{name}={s.count}" for name, s in problem.supply.items() if s.count is not None)
    where = "--gpus" if from_option else "gpus"
    if exc.proven:
        message = (f"the available GPUs ({counts}) cannot serve all {problem.total_replicas} workload replicas, "
                   "even with every allowed way of sharing them (proven by the LP bound)")
        fix = (f"raise the counts in {where}, add a GPU model, or leave a count out for as many as needed; "
               "more time cannot help")
    else:
        message = (f"the planner found no plan within the available GPUs ({counts}) for {problem.total_replicas} "
                   "workload replicas, and could not prove that none exists")
        fix = (f"raise the counts in {where} or leave a count out; where the counts must stay, raise --time-limit "
               "only if this run said it was cut by time")
    return GpushareError(Problem(message, file=doc.file if doc and not from_option else None, path=where, fix=fix))


def plan_file(path: Path, **options: Any) -> PackPlan:
    demand, doc = load_demand(path)
    return plan_demand(demand, doc, **options)


def _plan(problem: PackProblem, result: SolveResult, fewer_replicas: bool = True) -> PackPlan:
    # Each item type's replicas, handed out in workload order.
    queues: list[list[tuple[int, int]]] = []
    for item in problem.items:
        queue = []
        for w, count in item.members:
            queue += [(w, r) for r in range(count)]
        queues.append(queue[::-1])
    gpus = []
    for gpu in result.gpus:
        config = problem.configs[gpu.config]
        units = [PlannedUnit(problem.units[slot.kind], [queues[i].pop() for i in slot.items]) for slot in gpu.slots]
        gpus.append(PlannedGpu(config, units))
    gpus.sort(key=lambda g: (g.config.model.name, g.config.kind, g.config.layout or (), g.config.replicas))
    if any(queues):
        raise RuntimeError("gpushare pack left workload replicas unplaced")
    lower = result.lower_bound
    if problem.demand.objective == "gpus":
        lower = max(0.0, math.ceil(lower - BOUND_MARGIN * max(1.0, abs(lower))))
    else:
        lower = max(0.0, math.floor(lower * 1e6) / 1e6)
    lower = min(lower, result.objective)
    if result.proven_optimal:
        lower = result.objective  # the exact MIP over every fill proved no plan is cheaper: that is the bound
    plan = PackPlan(problem, gpus, result.objective, lower, result.lp_value, result.proven_optimal,
                    result.converged, result.method, float(result.stats.get("seconds", 0.0)), result.stats)
    if problem.restricted_profiles is False and fewer_replicas:
        _fewer_replicas(plan)
    name_profiles(plan)
    return plan


def _fewer_replicas(plan: PackPlan) -> None:
    """Each pool of shared GPUs advertises only as many replicas per unit as its fullest unit holds (at least
    2): fewer resources for pods the plan did not place, a lower oversubscription, larger MPS shares."""
    groups: dict[tuple[Any, ...], list[PlannedGpu]] = {}
    for gpu in plan.gpus:
        if gpu.config.replicas > 1:
            groups.setdefault(gpu.config.key, []).append(gpu)
    for members in groups.values():
        config = members[0].config
        used = max(2, max(len(unit.replicas) for gpu in members for unit in gpu.units))
        if used >= config.replicas:
            continue
        smaller = with_replicas(plan.problem, config, used)
        kinds = [plan.problem.units[u] for u, count in smaller.units for _ in range(count)]
        for gpu in members:
            gpu.config = smaller
            for unit, kind in zip(gpu.units, kinds, strict=True):
                unit.kind = kind


# ---------------------------------------------------------------- an independent check of the plan


def check_plan(plan: PackPlan) -> list[str]:
    """Every rule, checked from the workloads and the catalog, not from the solver's own bookkeeping."""
    problem = plan.problem
    demand = problem.demand
    workloads = demand.workloads
    driver = problem.driver_branch
    out: list[str] = []
    seen: Counter[tuple[int, int]] = Counter()
    per_model: Counter[str] = Counter()
    for g, gpu in enumerate(plan.gpus):
        config = gpu.config
        model = config.model
        per_model[model.name] += 1
        expected = [u for u, c in config.units for _ in range(c)]
        if [unit.kind.index for unit in gpu.units] != expected:
            out.append(f"GPU {g}: its units do not match its configuration")
        if config.layout is not None:
            check = check_layout(model, layout_from_counts(config.layout_dict), driver)
            if not check.ok:
                out.append(f"GPU {g}: MIG layout {config.label} fails the exact check: {'; '.join(check.errors)}")
        elif config.kind in ("mig", "mig-time-slicing"):
            out.append(f"GPU {g}: {config.kind} without a layout")
        for u, unit in enumerate(gpu.units):
            kind = unit.kind
            where = f"GPU {g} unit {u} ({kind.label} on {model.name})"
            if len(unit.replicas) > kind.replicas:
                out.append(f"{where}: {len(unit.replicas)} replicas, more than {kind.replicas}")
            if kind.sharing != "exclusive":
                limit = demand.max_shared_replicas
                if problem.environment is not None:
                    limit = min(limit, load_guardrails().max_shared_replicas(problem.environment, kind.memory_gib))
                if kind.replicas > limit:
                    out.append(f"{where}: {kind.replicas} shared replicas, above the limit {limit}")
            reserve = demand.context_reserve_gib  # each replica's CUDA context
            memory = sum(workloads[w].memory_gib + reserve for w, _ in unit.replicas)
            compute = sum(workloads[w].compute for w, _ in unit.replicas)
            for w, r in unit.replicas:
                seen[(w, r)] += 1
                wl = workloads[w]
                own = problem.untrusted[w] or problem.latency[w] == "high"
                if own and kind.sharing != "exclusive":
                    out.append(f"{where}: {wl.name} needs a unit of its own but shares by {kind.sharing}")
                if problem.latency[w] == "medium" and kind.sharing == "time-slicing":
                    out.append(f"{where}: {wl.name} (latency medium) is time-sliced")
                if wl.memory_gib + reserve > kind.item_memory_gib + EPS or wl.compute > kind.item_compute + EPS:
                    out.append(f"{where}: {wl.name} needs more than one replica's share")
            if kind.sharing == "exclusive" and len(unit.replicas) > 1:
                out.append(f"{where}: an exclusive unit holds {len(unit.replicas)} replicas")
            if kind.sharing == "time-slicing":
                if memory > kind.memory_gib + CAPACITY_SLACK:
                    out.append(f"{where}: {memory:g} GiB on {kind.memory_gib:g} GiB")
                if compute > kind.sum_compute + CAPACITY_SLACK:
                    out.append(f"{where}: compute {compute:g} above {kind.sum_compute:g}")
        if problem.environment is not None:
            allowed = _allowed(problem)
            if allowed is not None and not (gpu.profile and allowed(gpu.profile)):
                out.append(f"GPU {g}: profile {gpu.profile!r} is not allowed in {problem.environment}")
    for (w, r), count in seen.items():
        if count != 1:
            out.append(f"{workloads[w].name}/{r} is placed {count} times")
    missing = sum(wl.replicas for wl in workloads) - len(seen)
    if missing:
        out.append(f"{missing} workload replicas are not placed")
    for name, count in per_model.items():
        supply = problem.supply[name]
        if supply.count is not None and count > supply.count:
            out.append(f"{counted(count, 'GPU')} of {name}, only {supply.count} available")
    if problem.max_oversubscription is not None and plan.gpus:
        advertised = sum(g.config.advertised for g in plan.gpus)
        units = sum(g.config.hardware_units for g in plan.gpus)
        if advertised > problem.max_oversubscription * units + OVERSUBSCRIPTION_SLACK:
            out.append(f"oversubscription {advertised}/{units} above {problem.max_oversubscription}")
    return out


def _allowed(problem: PackProblem) -> Any:
    assert problem.environment is not None
    limits = load_guardrails().environment(problem.environment)
    return None if "*" in limits.allowed_profiles else limits.allows_profile


# ---------------------------------------------------------------- naming the plan's profiles


def _profile_document(config: GpuConfig, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": name, "kind": config.kind,
                           "description": f"planned by gpushare pack for {config.model.name}"}
    if config.layout is not None:
        doc["mig"] = {"layouts": {config.model.name: ",".join(f"{p}={n}" for p, n in config.layout)}}
    if config.kind in ("time-slicing", "mig-time-slicing"):
        doc["time_slicing"] = {"replicas": config.replicas}
    if config.kind == "mps":
        doc["mps"] = {"replicas": config.replicas}
    return doc


def name_profiles(plan: PackPlan) -> None:
    """Each GPU's profile: an existing one that resolves to exactly its configuration, or a new `plan-*` one."""
    taken = set(plan.problem.profiles) | set(plan.new_profiles)
    by_key: dict[tuple[Any, ...], str] = {}
    for gpu in plan.gpus:
        config = gpu.config
        if config.profile_name is not None:
            gpu.profile = config.profile_name
            continue
        name = by_key.get(config.key)
        if name is None:
            if config.kind == "exclusive":
                base = "plan-exclusive"
            elif config.kind in ("time-slicing", "mps"):
                base = f"plan-{'ts' if config.kind == 'time-slicing' else 'mps'}{config.replicas}"
            else:
                digest = hashlib.sha256(repr(config.key).encode()).hexdigest()[:6]
                prefix = "plan-mig" if config.kind == "mig" else f"plan-migts{config.replicas}"
                base = f"{prefix}-{digest}"
            name = base
            k = 2
            while name in taken:
                name = f"{base}-{k}"
                k += 1
            taken.add(name)
            by_key[config.key] = name
            plan.new_profiles[name] = _profile_document(config, name)
        gpu.profile = name
