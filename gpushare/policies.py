"""Guardrail rules: pure functions over the resolved fleet (and, where a rule needs it, the offline plan).

The same rules run in `gpushare check` (CI), in the Pulumi policy pack (`policies/pack`, at preview and up)
and, for what only admission can see, as ValidatingAdmissionPolicies in the cluster. Thresholds come only
from policies/guardrails.yaml; exceptions only from policies/waivers.yaml."""

from __future__ import annotations

import fnmatch
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator

from gpushare.errors import GpushareError
from gpushare.guardrails import EnvironmentGuardrails, Guardrails, load_guardrails
from gpushare.resolve import ResolvedFleet, ResolvedNode, project_root, resolve_env
from gpushare.spec import Strict, invalid, read_yaml, validation_problems, version_tuple

Level = Literal["mandatory", "advisory"]
SHARED_KINDS = ("time-slicing", "mps", "mig-time-slicing")


@dataclass(frozen=True)
class PlanResource:
    """One resource of the offline plan (or of a stack under `pulumi preview`): type token, name, inputs."""

    type: str
    name: str
    inputs: Mapping[str, Any]
    cluster: str = "-"  # the Kubernetes provider (one per cluster) the resource goes through


@dataclass(frozen=True)
class Violation:
    rule: str
    level: Level
    where: str
    message: str
    fix: str

    def as_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "level": self.level, "where": self.where, "message": self.message, "fix": self.fix}


@dataclass
class Context:
    fleet: ResolvedFleet
    guardrails: Guardrails
    plan: list[PlanResource] | None = None
    promotion_source: ResolvedFleet | None = None
    rendered: Mapping[str, str] | None = None

    @property
    def limits(self) -> EnvironmentGuardrails:
        return self.guardrails.environment(self.fleet.environment)

    def plan_of(self, type_suffix: str) -> list[PlanResource]:
        return [r for r in self.plan or [] if r.type.endswith(type_suffix)]


Finding = tuple[str, str]  # (where, message)


@dataclass(frozen=True)
class Rule:
    id: str
    description: str
    level: Level
    remediation: str
    check: Callable[[Context], Iterable[Finding]]
    needs_plan: bool = False

    def run(self, ctx: Context) -> list[Violation]:
        return [Violation(self.id, self.level, where, message, self.remediation) for where, message in self.check(ctx)]


RULES: dict[str, Rule] = {}


def rule(id: str, level: Level, description: str, remediation: str, needs_plan: bool = False
         ) -> Callable[[Callable[[Context], Iterable[Finding]]], Callable[[Context], Iterable[Finding]]]:
    def register(fn: Callable[[Context], Iterable[Finding]]) -> Callable[[Context], Iterable[Finding]]:
        RULES[id] = Rule(id, description, level, remediation, fn, needs_plan)
        return fn

    return register


def _shared_nodes(fleet: ResolvedFleet) -> Iterator[ResolvedNode]:
    return (n for n in fleet.nodes if n.sharing in SHARED_KINDS)


def _replicas(fleet: ResolvedFleet, node: ResolvedNode) -> int:
    profile = fleet.profiles[node.profile]
    block = profile.mps if node.sharing == "mps" else profile.time_slicing
    return int(block.replicas)


# ---------------------------------------------------------------- rules over the resolved fleet


@rule("oversubscription-limit", "mandatory",
      "The environment-wide oversubscription ratio (schedulable GPU resources / hardware units) stays within "
      "the environment's limit.",
      "lower time-slicing or MPS replicas, or raise max_oversubscription in policies/guardrails.yaml with "
      "utilization evidence from `gpushare capacity`")
def _oversubscription(ctx: Context) -> Iterator[Finding]:
    limit = ctx.limits.max_oversubscription
    t = ctx.fleet.totals
    if t.oversubscription > limit:
        shared = sorted({p.name for p in ctx.fleet.pools if p.totals.oversubscription > 1})
        yield (f"environment {ctx.fleet.environment}",
               f"oversubscription {t.oversubscription:.2f} ({t.advertised_total} schedulable / {t.hardware_units} "
               f"hardware units) is above the limit {limit:.2f}; shared pools: {', '.join(shared)}")


@rule("shared-replicas-limit", "mandatory",
      "Time-slicing and MPS replicas per shared unit stay within the limit for the unit's memory class.",
      "lower the profile's replicas, or move the pool to GPUs (or MIG instances) of a larger memory class")
def _replicas_limit(ctx: Context) -> Iterator[Finding]:
    seen: set[tuple[str, str]] = set()
    for node in _shared_nodes(ctx.fleet):
        replicas = _replicas(ctx.fleet, node)
        units = ([(node.gpu_model.name, node.gpu_model.memory_gib)] if node.mig_layout is None else
                 [(f"{node.gpu_model.name} {p}", node.gpu_model.profiles[p].memory_gib or 0.0)
                  for p in node.mig_layout])
        for unit, memory in units:
            cls = ctx.guardrails.memory_class(memory)
            limit = ctx.limits.max_shared_replicas[cls]
            if replicas > limit and (node.pool, unit) not in seen:
                seen.add((node.pool, unit))
                yield (f"pool {node.pool}",
                       f"profile {node.profile} shares each {unit} ({memory:g} GiB, class {cls}) {replicas} ways; "
                       f"{ctx.fleet.environment} allows {limit}")


@rule("profile-allowed", "mandatory",
      "Pools use only the sharing profiles the environment allows.",
      "use an allowed profile, or add it to allowed_profiles in policies/guardrails.yaml after review")
def _profile_allowed(ctx: Context) -> Iterator[Finding]:
    for node in ctx.fleet.nodes:
        if not ctx.limits.allows_profile(node.profile):
            yield (f"pool {node.pool}" + ("" if node.count != 1 or node.address is None else f", host {node.name}"),
                   f"profile {node.profile} is not allowed in {ctx.fleet.environment} "
                   f"(allowed: {', '.join(ctx.limits.allowed_profiles)})")


def _resource_isolation(fleet: ResolvedFleet) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """(cluster, resource) -> {(pool, isolation)} for every advertised resource."""
    out: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for node in fleet.nodes:
        for resource in node.advertised:
            out.setdefault((node.cluster, resource), set()).add((node.pool, node.isolation))
    return out


@rule("untrusted-tenants-hardware-isolated", "mandatory",
      "Untrusted tenants get quota only on hardware-isolated resources (MIG instances or whole GPUs): no "
      "resource name they can use is also served by a time-sliced, MPS or GKE-managed shared pool.",
      "give the tenant MIG or whole-GPU quota only; set rename_by_default so shared replicas are advertised as "
      "<resource>.shared and a quota can tell them apart")
def _untrusted(ctx: Context) -> Iterator[Finding]:
    isolation = _resource_isolation(ctx.fleet)
    for tenant in ctx.fleet.tenants:
        if tenant.trust != "untrusted":
            continue
        for resource, amount in tenant.quota.items():
            if amount == 0:
                continue
            shared = sorted(pool for c in tenant.clusters for pool, iso in isolation.get((c, resource), set())
                            if iso != "hardware")
            if shared:
                yield (f"tenant {tenant.name}, quota {resource}",
                       f"untrusted tenant {tenant.name} has quota on {resource}, which shared pool(s) "
                       f"{', '.join(shared)} also advertise (no memory or fault isolation)")


@rule("shared-replicas-renamed", "mandatory",
      "Wherever GPU replicas are shared through the device plugin, they are advertised as <resource>.shared "
      "(renameByDefault), so quotas and admission can tell them from exclusive GPUs.",
      "set rename_by_default: true in the profile's time_slicing or mps block")
def _renamed(ctx: Context) -> Iterator[Finding]:
    done: set[str] = set()
    for node in _shared_nodes(ctx.fleet):
        if node.managed_by == "gke" or node.profile in done:
            continue  # GKE's own plugin cannot rename; its pools are tainted instead
        profile = ctx.fleet.profiles[node.profile]
        block = profile.mps if node.sharing == "mps" else profile.time_slicing
        if not block.rename_by_default:
            done.add(node.profile)
            yield f"profile {node.profile}", f"profile {node.profile} (pool {node.pool}) shares replicas without " \
                                             "rename_by_default: they are advertised as nvidia.com/gpu"


@rule("fail-requests-greater-than-one", "mandatory",
      "Where the environment requires it, time-slicing refuses pods asking for more than one replica (they would "
      "get no more compute, only starve others).",
      "set fail_requests_greater_than_one: true in the profile's time_slicing block")
def _fail_requests(ctx: Context) -> Iterator[Finding]:
    if not ctx.limits.require_fail_requests_greater_than_one:
        return
    done: set[str] = set()
    for node in _shared_nodes(ctx.fleet):
        if node.sharing == "mps" or node.profile in done:
            continue
        if not ctx.fleet.profiles[node.profile].time_slicing.fail_requests_greater_than_one:
            done.add(node.profile)
            yield f"profile {node.profile}", f"time-slicing profile {node.profile} (pool {node.pool}) allows " \
                                             f"requests above one replica in {ctx.fleet.environment}"


@rule("toolkit-cve-floor", "mandatory",
      "The NVIDIA Container Toolkit version is at or above the CVE floor.",
      "raise defaults.toolkit_version to the floor in policies/guardrails.yaml or newer")
def _toolkit_floor(ctx: Context) -> Iterator[Finding]:
    versions = {n.toolkit_version for n in ctx.fleet.nodes if n.managed_by == "ansible"}
    versions.add(ctx.fleet.env.defaults.toolkit_version)
    floor = ctx.guardrails.toolkit.min_version
    for version in sorted(versions):
        if version_tuple(version) < version_tuple(floor):
            cves = ", ".join(f"{f.cve} (fixed in {f.fixed_in})" for f in ctx.guardrails.toolkit.unfixed(version))
            yield "defaults.toolkit_version", f"toolkit {version} is below the floor {floor}; exposed to {cves}"


@rule("toolkit-hardened", "mandatory",
      "The rendered nvidia-container-runtime config.toml carries the hardened settings.",
      "render with gpushare's template (templates/nvidia-container-toolkit-config.toml.j2) unchanged")
def _toolkit_hardened(ctx: Context) -> Iterator[Finding]:
    rendered = ctx.rendered
    if rendered is None:
        from gpushare.render import render_fleet

        rendered = render_fleet(ctx.fleet).files
    text = rendered.get("nvidia-container-toolkit/config.toml")
    if text is None:
        yield "nvidia-container-toolkit/config.toml", "the toolkit config.toml was not rendered"
        return
    data = tomllib.loads(text)
    for key, value in ctx.guardrails.toolkit.hardened.items():
        if data.get(key) != value:
            yield ("nvidia-container-toolkit/config.toml",
                   f"{key} is {data.get(key)!r}; it must be {str(value).lower()}")


def effective_device_list_strategy(config: Mapping[str, Any], operator_values: Mapping[str, Any] | None
                                   ) -> list[str]:
    """What the device plugin really uses: the GPU Operator's env vars override the config file, and
    devicePlugin.env is applied last (DESIGN: facts that bite)."""
    strategy = config.get("flags", {}).get("plugin", {}).get("deviceListStrategy", "envvar")
    result = [strategy] if isinstance(strategy, str) else list(strategy)
    if operator_values is not None:
        if operator_values.get("cdi", {}).get("enabled", True):
            result = ["cdi-annotations", "cdi-cri"]
        for item in operator_values.get("devicePlugin", {}).get("env", []) or []:
            if item.get("name") == "DEVICE_LIST_STRATEGY":
                result = [s.strip() for s in str(item.get("value", "")).split(",") if s.strip()]
    return result


def _operator_values(ctx: Context) -> list[tuple[str, Mapping[str, Any]]]:
    out = []
    for r in ctx.plan_of("helm.sh/v3:Release"):
        chart = str(r.inputs.get("chart", ""))
        if chart.endswith("gpu-operator"):
            out.append((r.name, r.inputs.get("values", {}) or {}))
    return out


@rule("device-list-strategy-not-envvar", "mandatory",
      "The device plugin's effective device list strategy (after the GPU Operator's env overrides) is CDI or "
      "volume-mounts, never envvar: with envvar a container that sets NVIDIA_VISIBLE_DEVICES reaches GPUs it "
      "was not allocated.",
      "enable CDI in the cluster (cdi: true) or remove an envvar DEVICE_LIST_STRATEGY from devicePlugin.env")
def _device_list(ctx: Context) -> Iterator[Finding]:
    releases = _operator_values(ctx) if ctx.plan is not None else []
    for name, cfg in sorted(ctx.fleet.device_plugin_configs.items()):
        candidates: list[tuple[str, Mapping[str, Any] | None]] = [(f"config {name}", None)]
        candidates += [(f"config {name} under release {rel}", values) for rel, values in releases]
        for where, values in candidates:
            effective = effective_device_list_strategy(cfg.content, values)
            if "envvar" in effective:
                yield where, f"effective deviceListStrategy is {','.join(effective)}"


@rule("exact-mig-placements", "mandatory",
      "Where the environment requires it, MIG layouts run only on GPU models whose placements in the catalog "
      "come from real driver output (placement_confidence exact), unless waived.",
      "confirm the model's placements with scripts/gpu_check.py on a real GPU, or waive with a reason and expiry")
def _exact_placements(ctx: Context) -> Iterator[Finding]:
    if not ctx.limits.require_exact_mig_placements:
        return
    seen: set[tuple[str, str]] = set()
    for node in ctx.fleet.nodes:
        model = node.gpu_model
        if node.mig_layout and not model.placements_exact and (node.pool, model.name) not in seen:
            seen.add((node.pool, model.name))
            yield (f"pool {node.pool}",
                   f"MIG on {model.name}, whose placements are {model.placement_confidence} in the catalog")


@rule("gpu-pools-monitored", "mandatory",
      "Every cluster with GPU pools runs dcgm-exporter (the GPU Operator's, or a host exporter where DCGM runs on "
      "the hosts) and carries gpushare's PrometheusRule, so no pool goes unwatched.",
      "keep dcgmExporter enabled in the operator values and the Monitoring component in the program", needs_plan=True)
def _monitored(ctx: Context) -> Iterator[Finding]:
    clusters = sorted({p.cluster for p in ctx.fleet.pools})
    operators = {r.cluster: r for r in ctx.plan_of("helm.sh/v3:Release")
                 if str(r.inputs.get("chart", "")).endswith("gpu-operator")}
    rules = {r.cluster for r in ctx.plan_of("monitoring.coreos.com/v1:PrometheusRule")}
    for cluster in clusters:
        release = operators.get(cluster)
        if release is None:
            yield f"cluster {cluster}", "no GPU Operator release, so no dcgm-exporter"
        elif (release.inputs.get("values", {}) or {}).get("dcgmExporter", {}).get("enabled", True) is False:
            yield f"cluster {cluster}", f"dcgm-exporter is disabled in release {release.name}"
        if cluster not in rules:
            yield f"cluster {cluster}", "no gpushare PrometheusRule (GPU health and sharing alerts)"


@rule("tenant-has-queue", "mandatory",
      "Every tenant namespace, in every cluster the tenant uses, has a Kueue LocalQueue pointing at a ClusterQueue in "
      "the cohort, so batch work waits for GPUs instead of being rejected.",
      "keep the Tenancy component in the program (gpushare/tenancy.py makes the queues)", needs_plan=True)
def _queued(ctx: Context) -> Iterator[Finding]:
    local = {(r.cluster, (r.inputs.get("metadata") or {}).get("namespace")): r
             for r in ctx.plan_of("kueue.x-k8s.io/v1beta2:LocalQueue")}
    cluster_queues = {(r.cluster, (r.inputs.get("metadata") or {}).get("name")): r
                      for r in ctx.plan_of("kueue.x-k8s.io/v1beta2:ClusterQueue")}
    gpu_clusters = {p.cluster for p in ctx.fleet.pools}
    for t in ctx.fleet.tenants:
        for cluster in t.clusters:
            if cluster not in gpu_clusters:
                continue
            lq = local.get((cluster, t.namespace))
            if lq is None:
                yield f"tenant {t.name}, cluster {cluster}", f"namespace {t.namespace} has no Kueue LocalQueue"
                continue
            target = (lq.inputs.get("spec") or {}).get("clusterQueue")
            cq = cluster_queues.get((cluster, target))
            if cq is None or not (cq.inputs.get("spec") or {}).get("cohortName"):
                yield (f"tenant {t.name}, cluster {cluster}",
                       f"LocalQueue of {t.namespace} points at {target!r}, which is not a ClusterQueue in a cohort")


@rule("tenant-has-quota", "mandatory",
      "Every tenant namespace has a GPU quota.",
      "give the tenant a quota in the environment file")
def _tenant_quota(ctx: Context) -> Iterator[Finding]:
    for tenant in ctx.fleet.tenants:
        if not tenant.quota:
            yield f"tenant {tenant.name}", f"tenant {tenant.name} (namespace {tenant.namespace}) has no GPU quota"


@rule("promotion-from-pilot", "mandatory",
      "An environment promoted from another (prod from pilot) runs only profiles, MIG layouts, driver branches and "
      "toolkit versions that the other already runs.",
      "run the change in pilot first; `gpushare promote` checks how long and how well it ran there")
def _promotion(ctx: Context) -> Iterator[Finding]:
    source = ctx.promotion_source
    if source is None:
        return
    theirs = {
        "profile": {n.profile for n in source.nodes},
        "MIG layout": set(source.mig_configs),
        "driver branch": {f"R{n.driver_branch} on {n.gpu_model.name}" for n in source.nodes},
        "toolkit version": {source.env.defaults.toolkit_version} | {n.toolkit_version for n in source.nodes},
        "device-plugin config": {k for k, v in source.device_plugin_configs.items()},
    }
    ours = {
        "profile": {n.profile: n.pool for n in ctx.fleet.nodes},
        "MIG layout": {n.mig_config: n.pool for n in ctx.fleet.nodes if n.mig_config and n.mig_config in
                       ctx.fleet.mig_configs},
        "driver branch": {f"R{n.driver_branch} on {n.gpu_model.name}": n.pool for n in ctx.fleet.nodes},
        "toolkit version": {ctx.fleet.env.defaults.toolkit_version: "defaults"},
        "device-plugin config": {n.device_plugin_config: n.pool for n in ctx.fleet.nodes if n.device_plugin_config},
    }
    for what, used in ours.items():
        for value, pool in sorted(used.items()):
            if value not in theirs[what]:
                yield (f"pool {pool}" if pool != "defaults" else "defaults.toolkit_version",
                       f"{what} {value} does not run in {source.environment}")


# ---------------------------------------------------------------- waivers


class Waiver(Strict):
    rule: str
    environment: str
    where: str = Field("*", description="Glob over the violation's location, e.g. 'pool h200-*'.")
    reason: Annotated[str, Field(min_length=10)]
    expires: date
    approved_by: str | None = None

    @field_validator("rule")
    @classmethod
    def _known_rule(cls, value: str) -> str:
        if value not in RULES:
            raise invalid(f"no rule named {value!r}", f"use one of: {', '.join(sorted(RULES))}")
        return value

    def covers(self, environment: str, violation: Violation) -> bool:
        return (self.rule == violation.rule and self.environment == environment
                and fnmatch.fnmatchcase(violation.where, self.where))


class Waivers(Strict):
    waivers: list[Waiver] = Field(default_factory=list)


def waivers_path() -> Path:
    return project_root() / "policies" / "waivers.yaml"


def load_waivers(path: Path | None = None) -> tuple[list[Waiver], str]:
    path = path or waivers_path()
    if not path.exists():
        return [], str(path)
    doc = read_yaml(path)
    try:
        return Waivers.model_validate(doc.data or {}).waivers, doc.file
    except ValidationError as exc:
        raise GpushareError(validation_problems(exc, doc, Waivers)) from None


# ---------------------------------------------------------------- running the rules


@dataclass
class Report:
    environment: str
    violations: list[Violation] = field(default_factory=list)
    waived: list[tuple[Violation, Waiver]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # rules that need the offline plan when there is none

    @property
    def ok(self) -> bool:
        return not any(v.level == "mandatory" for v in self.violations)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "environment": self.environment,
            "violations": [v.as_dict() for v in self.violations],
            "waived": [{**v.as_dict(), "reason": w.reason, "expires": w.expires.isoformat()} for v, w in self.waived],
            "skipped": self.skipped,
        }


def evaluate(ctx: Context, waivers: list[Waiver], today: date, waivers_file: str = "policies/waivers.yaml",
             rules: Iterable[Rule] | None = None) -> Report:
    report = Report(ctx.fleet.environment)
    env = ctx.fleet.environment
    active = [w for w in waivers if w.expires >= today]
    for i, w in enumerate(waivers):
        if w.environment == env and w.expires < today:
            report.violations.append(Violation(
                "waiver-expired", "mandatory", f"{waivers_file}: waivers[{i}]",
                f"the waiver of {w.rule} for {w.where} expired on {w.expires.isoformat()}",
                "fix what it waived, or renew it with a new reason and expiry after review"))
    for r in rules if rules is not None else RULES.values():
        if r.needs_plan and ctx.plan is None:
            report.skipped.append(r.id)
            continue
        for violation in r.run(ctx):
            waiver = next((w for w in active if w.covers(env, violation)), None)
            if waiver is None:
                report.violations.append(violation)
            else:
                report.waived.append((violation, waiver))
    return report


def context_for(env: str, plan: list[PlanResource] | None = None, guardrails: Guardrails | None = None) -> Context:
    fleet = resolve_env(env)
    g = guardrails or load_guardrails()
    limits = g.environment(fleet.environment)
    source = resolve_env(limits.promote_from) if limits.promote_from else None
    return Context(fleet=fleet, guardrails=g, plan=plan, promotion_source=source)

