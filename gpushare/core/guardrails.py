"""policies/guardrails.yaml: the thresholds reviewed in Git. One source for every policy number."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.loading import Strict, invalid, load_model
from gpushare.core.paths import check_inside_workspace, project_root
from gpushare.core.reading import parse_yaml
from gpushare.core.revision import Revision
from gpushare.core.spec import VERSION_PATTERN, version_tuple

Version = Annotated[str, Field(pattern=VERSION_PATTERN)]


class MemoryClass(Strict):
    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]*$")]
    max_gib: float = Field(gt=0, description="Largest unit memory (GiB) in this class.")


class CveFix(Strict):
    cve: str
    fixed_in: Version


# A config.toml setting by its dotted path: `nvidia-container-cli.no-cgroups` is no-cgroups in that table.
TomlKey = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")]


class StartsWith(Strict):
    """A string setting that must start with a prefix (ldconfig: `@` runs the host's ldconfig, not the image's)."""

    prefix: Annotated[str, Field(min_length=1)]


class ToolkitPolicy(Strict):
    min_version: Version
    fixes: list[CveFix] = Field(default_factory=list)
    hardened: dict[TomlKey, bool | StartsWith] = Field(
        default_factory=dict, description="config.toml settings by dotted path (table.key) and what they must be: "
        "a boolean, or {prefix: ...} for a string that must start with it. A missing setting fails."
    )

    @field_validator("hardened", mode="before")
    @classmethod
    def _one_form_each(cls, value: Any) -> Any:
        # One clear message instead of pydantic's per-union-member errors.
        for key, want in (value.items() if isinstance(value, dict) else []):
            prefix = want.get("prefix") if isinstance(want, dict) else None
            if not isinstance(want, bool) and not (isinstance(want, dict) and set(want) == {"prefix"}
                                                   and isinstance(prefix, str) and prefix):
                raise invalid(f"toolkit.hardened.{key} is {want!r}: a hardened setting is true, false or "
                              "{prefix: <text>}", f"write {key}: false, or {key}: {{prefix: \"@\"}}")
        return value

    @model_validator(mode="after")
    def _floor_covers_every_fix(self) -> ToolkitPolicy:
        newest = max((version_tuple(f.fixed_in) for f in self.fixes), default=())
        if version_tuple(self.min_version) < newest:
            raise invalid(f"min_version {self.min_version} is below a listed fix ({'.'.join(map(str, newest))})",
                          "raise min_version to the newest fixed_in")
        return self

    def unfixed(self, version: str) -> list[CveFix]:
        """The listed CVEs a toolkit version is still exposed to."""
        v = version_tuple(version)
        return [f for f in self.fixes if v < version_tuple(f.fixed_in)]


class PriorityClassPolicy(Strict):
    value: int = Field(ge=0, le=1_000_000_000)
    preemption_policy: Literal["PreemptLowerPriority", "Never"]


Quantity = Annotated[str, Field(pattern=r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti)?$")]


class HostResources(Strict):
    cpu: Quantity
    memory: Quantity


class ContainerDefaults(Strict):
    request: HostResources
    limit: HostResources
    max: HostResources


class TenancyPolicy(Strict):
    priority_classes: dict[Literal["online", "batch"], PriorityClassPolicy]
    container_defaults: ContainerDefaults

    @model_validator(mode="after")
    def _online_above_batch(self) -> TenancyPolicy:
        classes = self.priority_classes
        if set(classes) != {"online", "batch"}:
            raise invalid("tenancy.priority_classes needs online and batch", "define both")
        if classes["online"].value <= classes["batch"].value:
            raise invalid("the online priority must be above the batch priority", "raise online's value")
        return self


class EnvironmentGuardrails(Strict):
    max_oversubscription: float = Field(ge=1.0, le=64.0)
    max_shared_replicas: dict[str, Annotated[int, Field(ge=2, le=64)]]
    allowed_profiles: list[str] = Field(min_length=1, description='Profile names, or "*" for any.')
    require_fail_requests_greater_than_one: bool = False
    require_exact_mig_placements: bool = False
    promote_from: str | None = Field(None, description="Environment whose profiles and versions this one may use.")
    non_waivable: list[str] = Field(
        default_factory=list, description="Rule ids that no waiver may cover in this environment.")

    quota_above_capacity: Literal["error", "warning"] = Field(
        "warning", description="Tenants guaranteed more of a GPU resource than their cluster advertises, or a "
        "tenant whose borrowing limit takes its ResourceQuota above it: an error (validate, plan and the Pulumi "
        "program refuse) or a warning.")

    def allows_profile(self, name: str) -> bool:
        return "*" in self.allowed_profiles or name in self.allowed_profiles


# A Prometheus duration as rules and subqueries take it (one unit: 90s, 15m, 12h, 7d).
Duration = Annotated[str, Field(pattern=r"^[1-9][0-9]*(s|m|h|d|w)$")]
Ratio = Annotated[float, Field(gt=0, lt=1)]


def duration_seconds(text: str) -> int:
    """Seconds of a Duration ("15m" -> 900)."""
    return int(text[:-1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[text[-1]]


class MonitoringPolicy(Strict):
    """Alert thresholds of the rendered PrometheusRule."""

    critical_xids: list[Annotated[int, Field(ge=1, le=1000)]] = Field(min_length=1)
    gpu_temperature_celsius: float = Field(gt=40, lt=120)
    memory_temperature_celsius: float = Field(gt=40, lt=120)
    temperature_for: Duration
    thermal_throttle_ratio: Ratio
    thermal_throttle_for: Duration
    memory_full_ratio: Ratio
    memory_full_for: Duration
    pool_underused_ratio: Ratio
    pool_underused_for: Duration
    contended_pending_workloads: int = Field(ge=1)
    queue_wait_seconds: float = Field(gt=0)
    contended_for: Duration
    absent_for: Duration
    # Shared GPUs, from the per-process exporter (role gpu_process_exporter). Defaults, so that policies written
    # before these alerts existed still load.
    noisy_neighbour_share: Ratio = Field(0.8, description="Share of a time-sliced or MPS GPU's used SM time that "
                                         "one tenant's pods take while another tenant's pod is active.")
    noisy_neighbour_active_ratio: Ratio = Field(0.02, description="SM share above which a pod counts as active.")
    noisy_neighbour_for: Duration = "15m"
    idle_allocation_ratio: Ratio = Field(0.01, description="SM share below which a pod holding a GPU share is "
                                         "idle.")
    idle_allocation_for: Duration = "3d"


class CapacityPolicy(Strict):
    """Targets of `gpushare capacity` (limits stay with the environments)."""

    start_ratio: float = Field(ge=1.0, le=64.0)
    target_utilization: Ratio
    max_p95_utilization: Ratio
    memory_headroom: float = Field(ge=0, lt=1)
    min_coverage: Ratio
    step: Duration

    @model_validator(mode="after")
    def _target_below_peak(self) -> CapacityPolicy:
        if self.target_utilization > self.max_p95_utilization:
            raise invalid("capacity.target_utilization is above capacity.max_p95_utilization",
                          "a mean cannot exceed the 95th percentile it sits under: lower target_utilization")
        return self


# Prometheus answers a range query with at most this many points per series.
MAX_RANGE_POINTS = 11_000


class PromotionPolicy(Strict):
    """Gates of `gpushare promote`: how long and how well the promotion source ran what the target would run."""

    min_days: int = Field(ge=1, le=180, description="Days every profile, layout, driver and toolkit must have run.")
    utilization_baseline: Ratio = Field(description="Busy share of whole dedicated GPUs before sharing.")
    min_utilization_uplift: float = Field(gt=1.0, le=10.0, description="Shared pools' utilization / baseline.")
    max_queue_p95_seconds: float = Field(gt=0, description="Kueue admission wait, 95th percentile over the window.")
    ignored_xids: list[Annotated[int, Field(ge=1, le=1000)]] = Field(
        default_factory=list, description="Application XIDs (e.g. 13, 31, 43) that do not fail the health gate.")
    step: Duration = Field(description="Resolution of the run-time and utilization series.")
    min_coverage: Ratio = Field(description="Share of the window's steps every expected node must report in; a "
                                "health gate with less is no evidence.")

    @model_validator(mode="after")
    def _reachable(self) -> PromotionPolicy:
        if self.utilization_baseline * self.min_utilization_uplift > 1:
            raise invalid(f"promotion.utilization_baseline x min_utilization_uplift is "
                          f"{self.utilization_baseline * self.min_utilization_uplift:.2f}, above 1: no pool can pass",
                          "lower min_utilization_uplift or utilization_baseline")
        step = duration_seconds(self.step)
        if step > 86400 or 86400 % step:
            raise invalid(f"promotion.step {self.step} does not divide a day",
                          "use a step such as 5m, 15m, 1h or 1d")
        if 2 * self.min_days * 86400 // step > MAX_RANGE_POINTS:
            raise invalid(f"promotion.step {self.step} over 2 x min_days ({2 * self.min_days} d) is more than "
                          f"Prometheus' {MAX_RANGE_POINTS} points per series", "use a longer step, e.g. 1h")
        if len(set(self.ignored_xids)) != len(self.ignored_xids):
            raise invalid("promotion.ignored_xids lists an XID twice", "list each XID once")
        return self


# Memory each replica's CUDA context takes beside its own: an estimate, not an NVIDIA figure (docs/pack.md).
DEFAULT_CONTEXT_RESERVE_GIB = 0.5


class PlannerPolicy(Strict):
    """Defaults of `gpushare pack` that a demand file may override."""

    context_reserve_gib: float = Field(
        DEFAULT_CONTEXT_RESERVE_GIB, ge=0, le=16,
        description="GPU memory one replica's CUDA context takes beside its memory_gib (a demand file's own "
        "context_reserve_gib wins). Default 0.5: an estimate, see docs/pack.md.")


class Guardrails(Strict):
    version: int | None = Field(None, ge=1, le=1, description="The older form of apiVersion: 1 is gpushare.io/v1.")
    max_waiver_matches: int = Field(
        1, ge=1, le=100, description="Most objects (violation locations, pools, hosts, tenants...) one waiver's "
        "`where` may match; a glob with no literal character (`*`) is never accepted.")
    max_waiver_days: int = Field(90, ge=1, le=366, description="Latest expiry of a waiver, in days after today.")
    memory_classes: list[MemoryClass] = Field(min_length=1)
    toolkit: ToolkitPolicy
    tenancy: TenancyPolicy
    monitoring: MonitoringPolicy
    capacity: CapacityPolicy
    promotion: PromotionPolicy
    planner: PlannerPolicy = Field(default_factory=lambda: PlannerPolicy.model_validate({}))
    environments: dict[str, EnvironmentGuardrails]

    @model_validator(mode="after")
    def _classes_cover_limits(self) -> Guardrails:
        names = [c.name for c in self.memory_classes]
        bounds = [c.max_gib for c in self.memory_classes]
        if bounds != sorted(bounds) or len(set(bounds)) != len(bounds):
            raise invalid("memory_classes must be listed by increasing max_gib", "reorder them")
        for env, limits in self.environments.items():
            if limits.promote_from is not None and limits.promote_from not in self.environments:
                raise invalid(f"environments.{env}.promote_from names unknown environment {limits.promote_from!r}",
                              f"use one of: {', '.join(self.environments)}")
            if set(limits.max_shared_replicas) != set(names):
                raise invalid(f"environments.{env}.max_shared_replicas must give every memory class "
                              f"({', '.join(names)})", "add the missing classes or remove unknown ones")
        hardware = sorted(set(self.promotion.ignored_xids) & set(self.monitoring.critical_xids))
        if hardware:
            raise invalid(f"promotion.ignored_xids lists {', '.join(map(str, hardware))}, which "
                          "monitoring.critical_xids calls hardware faults", "ignore only application XIDs (13, 31, 43)")
        return self

    def memory_class(self, memory_gib: float) -> str:
        for c in self.memory_classes:
            if memory_gib <= c.max_gib:
                return c.name
        return self.memory_classes[-1].name

    def environment(self, name: str) -> EnvironmentGuardrails:
        try:
            return self.environments[name]
        except KeyError:
            raise GpushareError(Problem(f"policies/guardrails.yaml has no limits for environment {name!r}",
                                        path=f"environments.{name}",
                                        fix="add the environment to guardrails.yaml")) from None

    def max_shared_replicas(self, environment: str, memory_gib: float) -> int:
        return self.environment(environment).max_shared_replicas[self.memory_class(memory_gib)]


def guardrails_path() -> Path:
    return project_root() / "policies" / "guardrails.yaml"


class GuardrailsEnvironments(Strict):
    """A file of policies/guardrails.d/: limits of environments the main file does not name (`gpushare import`
    writes one per adopted cluster, so it never edits policies/guardrails.yaml)."""

    environments: dict[str, EnvironmentGuardrails] = Field(min_length=1)


FRAGMENTS_DIR = "guardrails.d"


def fragment_paths(path: Path) -> list[Path]:
    """The environment files beside the guardrails file (policies/guardrails.d/*.yaml), in name order."""
    folder = path.parent / FRAGMENTS_DIR
    return sorted(folder.glob("*.yaml")) if folder.is_dir() else []


@cache
def _load(path: Path, fragments: tuple[tuple[Path, float], ...]) -> Guardrails:
    main = load_model(path, Guardrails, "Guardrails", "guardrails file", "policies/guardrails.yaml")[0]
    merged = dict(main.environments)
    origin = {env: path.name for env in merged}
    names = [c.name for c in main.memory_classes]
    problems: list[Problem] = []
    for fragment, _ in fragments:
        loaded, doc = load_model(fragment, GuardrailsEnvironments, "Guardrails", "guardrails file",
                                 "a file gpushare import wrote in policies/guardrails.d/")
        for env, limits in loaded.environments.items():
            if env in merged:
                problems.append(doc.problem(("environments", env), f"environment {env!r} has limits in "
                                            f"{origin[env]} already", "keep one set of limits per environment: "
                                            "remove this one"))
                continue
            elif set(limits.max_shared_replicas) != set(names):
                problems.append(doc.problem(("environments", env, "max_shared_replicas"), "max_shared_replicas "
                                            f"must give every memory class ({', '.join(names)})",
                                            "add the missing classes or remove unknown ones"))
            merged[env] = limits
            origin[env] = f"{FRAGMENTS_DIR}/{fragment.name}"
    for fragment, _ in fragments:
        for env, limits in load_model(fragment, GuardrailsEnvironments, "Guardrails", "guardrails file", "")[0
                                      ].environments.items():
            if limits.promote_from is not None and limits.promote_from not in merged:
                problems.append(Problem(f"environments.{env}.promote_from names unknown environment "
                                        f"{limits.promote_from!r}", file=str(fragment),
                                        path=f"environments.{env}.promote_from",
                                        fix=f"use one of: {', '.join(merged)}"))
    if problems:
        raise GpushareError(problems)
    return main.model_copy(update={"environments": merged}) if fragments else main


def load_guardrails(path: Path | None = None) -> Guardrails:
    """policies/guardrails.yaml with the environments of policies/guardrails.d/*.yaml added (each environment's
    limits in one file only)."""
    path = path or guardrails_path()
    check_inside_workspace(path, "guardrails file")  # before resolve(): the cache is keyed by the real path
    real = path.resolve()
    # Keyed by the fragments and their times too: an import adds one, and a later check in the same process sees it.
    fragments = tuple((f.resolve(), f.stat().st_mtime) for f in fragment_paths(path.absolute()))
    return _load(real, fragments)


# ---------------------------------------------------------------- the base of a change


def guardrails_text_at(ref: str, path: Path | None = None) -> tuple[str, str] | None:
    """(where, text) of policies/guardrails.yaml as Git has it at revision `ref`, symbolic links inside the tree
    followed; None where the file did not exist there."""
    path = path or guardrails_path()
    revision = Revision.of(ref, path.absolute().parent)
    rel = revision.relative(path)
    if rel is None:
        raise GpushareError(Problem(f"{path} is not inside the Git work tree {revision.top}", path="--base",
                                    fix="keep policies/ in the repository"), exit_code=2)
    found = revision.resolve(rel)
    text = revision.read(rel)
    if found is None or text is None:
        return None
    return f"{ref}:{found[2]}", text


def non_waivable_at(ref: str, environment: str, path: Path | None = None) -> tuple[str, ...]:
    """The rules policies/guardrails.yaml made non-waivable in `environment` at revision `ref` (the base branch of a
    change). Read leniently: the base passed its own review, and only this one list is needed from it."""
    found = guardrails_text_at(ref, path)
    if found is None:
        return ()
    where, text = found

    data = parse_yaml(text, where)
    envs = data.get("environments") if isinstance(data, dict) else None
    limits = envs.get(environment) if isinstance(envs, dict) else None
    rules = limits.get("non_waivable") if isinstance(limits, dict) else None
    return tuple(r for r in rules if isinstance(r, str)) if isinstance(rules, list) else ()
