# One module: every rule registers in RULES here, and waivers and evaluate() judge against that one registry.
"""Guardrail rules: pure functions over the resolved fleet (and, where a rule needs it, the offline plan).

The same rules run in `gpushare check` (CI), in the Pulumi policy pack (`policies/pack`, at preview and up)
and, for what only admission can see, as ValidatingAdmissionPolicies in the cluster. Thresholds come only
from policies/guardrails.yaml; exceptions only from policies/waivers.yaml."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date, timedelta
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, PrivateAttr, field_validator

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.guardrails import (
    EnvironmentGuardrails,
    Guardrails,
    StartsWith,
    guardrails_path,
    load_guardrails,
    non_waivable_at,
)
from gpushare.core.paths import environment_path, project_root
from gpushare.core.resolve import (
    ResolvedFleet,
    ResolvedNode,
    environment_stem,
    resolve,
    resolve_env,
)
from gpushare.core.spec import Strict, invalid, load_model, version_tuple

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
    # The environment promote_from names where the workspace has no file for it (an adopted cluster before its
    # pilot exists): the promotion rule reports it instead of check stopping.
    promotion_missing: str | None = None
    rendered: Mapping[str, str] | None = None
    environment: str | None = None  # the environment as the CLI or the Pulumi stack names it
    stack_config: Mapping[str, Any] | None = None  # the stack file's config (Pulumi.<stack>.yaml), where one names it
    # The environment file that stack deploys, where `gpushare check` judges the environment a stack names: it must
    # be the file judged, or CI passes one file and `pulumi up` applies another.
    deployed: Path | None = None
    # The base of the change under review (`check --base REF`) and the rules non-waivable there: a rule lifted from
    # non_waivable stays unwaivable until that lift has merged on its own.
    base: str | None = None
    base_non_waivable: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """Whose limits apply: the environment the CLI or the stack names, never the file's `name:` alone."""
        return self.environment or self.fleet.environment

    @property
    def limits(self) -> EnvironmentGuardrails:
        return self.guardrails.environment(self.name)

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
    # Where the environment decides the level (`level` is then the strictest): one id, whether it passes or fails.
    level_in: Callable[[Context], Level] | None = None

    def run(self, ctx: Context) -> list[Violation]:
        level = self.level_in(ctx) if self.level_in is not None else self.level
        return [Violation(self.id, level, where, message, self.remediation) for where, message in self.check(ctx)]


RULES: dict[str, Rule] = {}
# Rule ids that were renamed: old id -> (id now, the level the old one reported, or None for any). Waivers and
# non_waivable may still name the old id; a waiver of it covers what the old rule reported, nothing more.
RENAMED: dict[str, tuple[str, Level | None]] = {
    "tenant-quota-above-capacity": ("tenant-quota-within-capacity", "advisory"),
}


def current_id(rule_id: str) -> str:
    """A rule's id now, for an id a waiver or policies/guardrails.yaml may still spell the old way."""
    return RENAMED[rule_id][0] if rule_id in RENAMED else rule_id


def rule(id: str, level: Level, description: str, remediation: str, needs_plan: bool = False,
         level_in: Callable[[Context], Level] | None = None
         ) -> Callable[[Callable[[Context], Iterable[Finding]]], Callable[[Context], Iterable[Finding]]]:
    def register(fn: Callable[[Context], Iterable[Finding]]) -> Callable[[Context], Iterable[Finding]]:
        RULES[id] = Rule(id, description, level, remediation, fn, needs_plan, level_in)
        return fn

    return register


def _shared_nodes(fleet: ResolvedFleet) -> Iterator[ResolvedNode]:
    return (n for n in fleet.nodes if n.sharing in SHARED_KINDS)


def _replicas(fleet: ResolvedFleet, node: ResolvedNode) -> int:
    profile = fleet.profiles[node.profile]
    block = profile.mps if node.sharing == "mps" else profile.time_slicing
    return int(block.replicas)


# ---------------------------------------------------------------- rules over the resolved fleet


@rule("environment-identity", "mandatory",
      "The environment checked is the one the CLI or the Pulumi stack names: the file it loads is named after it "
      "and says the same `name:`, so no environment is judged by another's limits; the stack that deploys it "
      "deploys that same file.",
      "point the stack's gpushare:environment at environments/<stack>.yaml, and keep each file's name: equal to its "
      "file name")
def _identity(ctx: Context) -> Iterator[Finding]:
    fleet = ctx.fleet
    if fleet.environment != ctx.name:
        yield (f"environment {ctx.name}",
               f"{ctx.name} loads {fleet.source}, which is environment {fleet.environment!r}; it is judged with "
               f"{ctx.name}'s limits")
    stem = environment_stem(Path(fleet.source))
    if stem != fleet.environment:
        yield (f"environment {ctx.name}",
               f"{fleet.source} says name: {fleet.environment!r} but its file name says {stem!r}")
    if ctx.deployed is not None and ctx.deployed.resolve() != Path(fleet.source).resolve():
        yield (f"environment {ctx.name}",
               f"Pulumi.{ctx.name}.yaml deploys {ctx.deployed}, but the file judged here is {fleet.source}: "
               "what passes this check is not what `pulumi up` applies")


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
        yield (f"environment {ctx.name}",
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
                       f"{ctx.name} allows {limit}")


@rule("profile-allowed", "mandatory",
      "Pools use only the sharing profiles the environment allows.",
      "use an allowed profile, or add it to allowed_profiles in policies/guardrails.yaml after review")
def _profile_allowed(ctx: Context) -> Iterator[Finding]:
    for node in ctx.fleet.nodes:
        if not ctx.limits.allows_profile(node.profile):
            yield (f"pool {node.pool}" + ("" if node.count != 1 or node.address is None else f", host {node.name}"),
                   f"profile {node.profile} is not allowed in {ctx.name} "
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
      "resource they are guaranteed or may borrow is also served by a time-sliced, MPS or GKE-managed shared pool, "
      "and their Kueue ClusterQueue can neither hold nor borrow from the cohort anything on a shared flavor. On DRA "
      "clusters their claim templates request only MIG or exclusive DeviceClasses (taking every consumable share).",
      "give the tenant MIG or whole-GPU quota and borrowing limits only; set rename_by_default so shared replicas "
      "are advertised as <resource>.shared and a quota can tell them apart")
def _untrusted(ctx: Context) -> Iterator[Finding]:
    isolation = _resource_isolation(ctx.fleet)
    untrusted = {t.name for t in ctx.fleet.tenants if t.trust == "untrusted"}
    for tenant in ctx.fleet.tenants:
        if tenant.name not in untrusted:
            continue
        for resource in sorted(set(tenant.quota) | set(tenant.borrowing_limit)):
            amount, borrow = tenant.quota.get(resource, 0), tenant.borrowing_limit.get(resource, 0)
            if amount == 0 and borrow == 0:
                continue
            shared = sorted(pool for c in tenant.clusters for pool, iso in isolation.get((c, resource), set())
                            if iso != "hardware")
            if shared:
                what = f"quota {resource}" if amount else f"borrowing_limit {resource}"
                yield (f"tenant {tenant.name}, {what}",
                       f"untrusted tenant {tenant.name} has {what.replace(' ', ' on ', 1)} ({amount} guaranteed, "
                       f"{borrow} borrowable), which shared pool(s) {', '.join(shared)} also advertise (no memory "
                       "or fault isolation)")
    if not untrusted:
        return
    # What the queues really give: gpushare's own tenancy objects, and the plan's ClusterQueues where there is one.
    from gpushare.core.tenancy import fleet_tenancy

    seen: set[str] = set()
    queues: list[tuple[str, Mapping[str, Any], str]] = [
        (c, obj, "gpushare's") for c, ct in fleet_tenancy(ctx.fleet, ctx.guardrails, refuse=False).items()
        for obj in ct.objects if obj.get("kind") == "ClusterQueue"]
    queues += [(r.cluster, r.inputs, "the plan's") for r in ctx.plan_of("kueue.x-k8s.io/v1beta2:ClusterQueue")]
    clusters = {p.cluster for p in ctx.fleet.pools}
    for cluster, queue, source in queues:
        # A plan resource's cluster is its provider's name, which the program names after the cluster.
        pools = {p.name: p.isolation for p in ctx.fleet.pools if p.cluster == cluster or cluster not in clusters}
        for where, message in cluster_queue_findings(queue, pools, untrusted):
            if where not in seen:
                seen.add(where)
                yield where, f"{source} {message}"
    yield from _untrusted_claims(ctx, untrusted)


def _untrusted_claims(ctx: Context, untrusted: set[str]) -> Iterator[Finding]:
    """DRA clusters: what untrusted tenants' claim templates request, in gpushare's objects and the plan's."""
    from gpushare.core import dra

    seen: set[str] = set()
    for name, cluster in ctx.fleet.clusters.items():
        if not dra.is_dra(cluster):
            continue
        plans = dra.class_plans(ctx.fleet, name)
        isolated = {p.name for p in plans if p.hardware_isolated}
        shares = dra.consumable_shares(ctx.fleet, name)
        tenants = [t for t in ctx.fleet.tenants if t.name in untrusted and name in t.clusters]
        namespaces = {t.namespace: t.name for t in tenants}
        templates: list[tuple[Mapping[str, Any], str]] = [
            (obj, "gpushare's") for t in tenants for obj in dra.claim_templates(ctx.fleet, name, t)]
        templates += [(r.inputs, "the plan's") for r in ctx.plan_of("resource.k8s.io/v1:ResourceClaimTemplate")
                      if r.cluster in (name, "-")]
        for template, source in templates:
            for where, message in claim_template_findings(template, isolated, shares, namespaces):
                if where not in seen:
                    seen.add(where)
                    yield where, f"{source} {message}"
        for r in ctx.plan_of("resource.k8s.io/v1:DeviceClass"):
            if r.cluster in (name, "-") and (r.inputs.get("metadata") or {}).get("name") in isolated:
                yield from device_class_findings(r.inputs)


def _claim_requests(template: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every device request of a ResourceClaimTemplate: `exactly` ones and each firstAvailable alternative."""
    requests = ((((template.get("spec") or {}).get("spec") or {}).get("devices") or {}).get("requests") or [])
    out: list[Mapping[str, Any]] = []
    for request in requests:
        if isinstance(request, Mapping):
            out += [request["exactly"]] if request.get("exactly") else list(request.get("firstAvailable") or [])
    return out


def claim_template_findings(template: Mapping[str, Any], isolated: set[str], shares: int | None,
                            namespaces: Mapping[str, str]) -> Iterator[Finding]:
    """An untrusted tenant's ResourceClaimTemplate requests only gpushare's hardware-isolated DeviceClasses, and
    where the cluster's devices take consumable shares, all of them: a claim taking fewer lets shared claims join."""
    meta = template.get("metadata") or {}
    tenant = namespaces.get(str(meta.get("namespace")))
    if tenant is None:
        return
    where = f"tenant {tenant}, ResourceClaimTemplate {meta.get('name')}"
    for request in _claim_requests(template):
        device_class = request.get("deviceClassName")
        took = ((request.get("capacity") or {}).get("requests") or {}).get("shares")
        if device_class not in isolated:
            yield where, (f"ResourceClaimTemplate {meta.get('name')} in untrusted tenant {tenant}'s namespace "
                          f"requests DeviceClass {device_class}, which is not a hardware-isolated gpushare class "
                          "(MIG or exclusive)")
        elif shares is not None and str(took) != str(shares):
            yield where, (f"ResourceClaimTemplate {meta.get('name')} of untrusted tenant {tenant} takes {took} of the "
                          f"{shares} consumable shares of its device: time-sliced claims could share that GPU")


def device_class_findings(device_class: Mapping[str, Any]) -> Iterator[Finding]:
    """A DeviceClass gpushare counts as hardware-isolated carries no time-slicing or MPS sharing config."""
    name = (device_class.get("metadata") or {}).get("name")
    for entry in (device_class.get("spec") or {}).get("config") or []:
        params = ((entry or {}).get("opaque") or {}).get("parameters") or {}
        strategy = (params.get("sharing") or {}).get("strategy") if isinstance(params, Mapping) else None
        if strategy in ("TimeSlicing", "MPS"):
            yield (f"DeviceClass {name}",
                   f"DeviceClass {name} is one untrusted tenants may claim, but its config shares the device "
                   f"({strategy})")


def _quantity(value: Any) -> float | None:
    """A Kueue quota as a number (ints, floats, "4", "500m"); None where it cannot be read."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)(m?)\s*", str(value))
    if match is None:
        return None
    return float(match.group(1)) / (1000 if match.group(2) else 1)


def cluster_queue_findings(queue: Mapping[str, Any], pool_isolation: Mapping[str, str], untrusted: set[str]
                           ) -> Iterator[Finding]:
    """An untrusted tenant's ClusterQueue must get nothing, guaranteed or borrowed from the cohort, on a flavor that
    is not a hardware-isolated pool. A missing borrowingLimit lets Kueue borrow without limit."""
    meta = queue.get("metadata") or {}
    spec = queue.get("spec") or {}
    name = str(meta.get("name", ""))
    owners = {(meta.get("labels") or {}).get("gpushare.io/tenant"),
              ((spec.get("namespaceSelector") or {}).get("matchLabels") or {}).get("gpushare.io/tenant"),
              name.removeprefix("tenant-") if name.startswith("tenant-") else None}
    tenants = sorted(t for t in owners if isinstance(t, str) and t in untrusted)
    if not tenants:
        return
    for group in spec.get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            flavor_name = str(flavor.get("name", ""))
            isolation = pool_isolation.get(flavor_name)
            if isolation == "hardware":
                continue
            for entry in flavor.get("resources") or []:
                nominal = _quantity(entry.get("nominalQuota", 0))
                borrow = _quantity(entry["borrowingLimit"]) if "borrowingLimit" in entry else None
                if nominal == 0 and borrow == 0:
                    continue
                gets = (f"nominal {entry.get('nominalQuota', 0)} and borrowing limit "
                        f"{entry['borrowingLimit'] if 'borrowingLimit' in entry else 'unlimited (absent)'}")
                kind = f"pool isolation {isolation}" if isolation else "not a gpushare pool"
                for tenant in tenants:
                    yield (f"tenant {tenant}, ClusterQueue {name}, flavor {flavor_name}",
                           f"ClusterQueue {name} gives untrusted tenant {tenant} {gets} of {entry.get('name')} on "
                           f"flavor {flavor_name} ({kind}): it can run on or borrow shared GPUs")


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
                                             f"requests above one replica in {ctx.name}"


# A version inside a toolkit version or an image tag: 1.18.2, v1.17.0-ubuntu20.04 and 1.17.8-1 each name theirs.
_VERSION_IN_TAG = re.compile(r"([0-9]+)\.([0-9]+)(?:\.([0-9]+))?")  # ASCII digits only, as spec.VERSION_PATTERN
TOOLKIT_IMAGE = "container-toolkit"  # the repository name of NVIDIA's toolkit image (nvcr.io/nvidia/k8s/...)
OPERATOR_VALUES_KEY = "gpushare:operatorValues"


def toolkit_version_of(tag: str) -> str | None:
    """The toolkit version a version string or image tag names, or None where it names none (`latest`)."""
    match = _VERSION_IN_TAG.search(tag)
    return ".".join(g for g in match.groups() if g is not None) if match else None


def image_tag(image: str) -> str:
    """The tag of an image reference ("" when it has none, e.g. only a digest): registry ports are not tags."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else ""


@cache
def gpu_operator_chart_values() -> dict[str, Any]:
    """The pinned GPU Operator chart's values.yaml (gpushare/data), for the defaults the operator falls back on."""
    from gpushare.core.paths import package_data

    data = yaml.safe_load(package_data("gpu-operator-values.yaml").read_text())
    assert isinstance(data, dict)
    return data


def _fields_named(node: Any, key: str, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, Mapping):
        for k, v in node.items():
            where = f"{path}.{k}" if path else str(k)
            if k == key and v is not None:
                yield where, v
            else:
                yield from _fields_named(v, key, where)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _fields_named(v, key, f"{path}[{i}]")


def _stack_mapping(ctx: Context, key: str) -> Mapping[str, Any]:
    """A `gpushare:*` object setting of the stack ({} where it is absent or not an object)."""
    raw = (ctx.stack_config or {}).get(key) or {}
    if isinstance(raw, str):  # Pulumi config may hold an object as its JSON text
        try:
            raw = json.loads(raw)
        except ValueError:
            return {}
    return raw if isinstance(raw, Mapping) else {}


def _site_operator_values(ctx: Context) -> Mapping[str, Any]:
    return _stack_mapping(ctx, OPERATOR_VALUES_KEY)


def _container_images(node: Any) -> Iterator[str]:
    """Every container image in a resource's inputs (a mapping with a name and a string image)."""
    if isinstance(node, Mapping):
        if isinstance(node.get("image"), str) and "name" in node:
            yield node["image"]
        for v in node.values():
            yield from _container_images(v)
    elif isinstance(node, list):
        for v in node:
            yield from _container_images(v)


def toolkit_versions(ctx: Context) -> list[tuple[str, str]]:
    """(where, version or tag) for every source of a toolkit version: the environment file (defaults, and any pool or
    host that sets one), the resolved nodes, the stack's operator values, the GPU Operator releases in the plan (their
    toolkit.version, or the chart's default where the toolkit operand runs) and every toolkit image the plan sets."""
    out: list[tuple[str, str]] = [(w, str(v)) for w, v in _fields_named(ctx.fleet.env.model_dump(), "toolkit_version")]
    declared = {v for _, v in out}
    for node in ctx.fleet.nodes:
        if node.toolkit_version and node.toolkit_version not in declared:
            out.append((f"pool {node.pool}, host {node.name}", node.toolkit_version))
    site = (_site_operator_values(ctx).get("toolkit") or {})
    if isinstance(site, Mapping) and site.get("version") is not None:
        out.append((f"{OPERATOR_VALUES_KEY}.toolkit.version", str(site["version"])))
    chart = gpu_operator_chart_values()["toolkit"]
    for release, values in _operator_values(ctx):
        toolkit = values.get("toolkit") or {}
        if toolkit.get("version") is not None:
            out.append((f"release {release}, toolkit.version", str(toolkit["version"])))
        elif toolkit.get("enabled", chart["enabled"]):
            out.append((f"release {release}, toolkit.version (chart default)", str(chart["version"])))
    for r in ctx.plan or []:
        if r.type.endswith("helm.sh/v3:Release"):
            continue
        for image in _container_images(r.inputs):
            if TOOLKIT_IMAGE in image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]:
                out.append((f"{r.type.rsplit(':', 1)[-1]} {r.name}, image {image}", image_tag(image)))
    return out


@rule("toolkit-cve-floor", "mandatory",
      "Every NVIDIA Container Toolkit version the environment, the stack or the plan sets (defaults, pools, hosts, "
      "GPU Operator values, toolkit images) is at or above the CVE floor.",
      "raise the named version (defaults.toolkit_version, the operator's toolkit.version, the image tag) to the floor "
      "in policies/guardrails.yaml or newer")
def _toolkit_floor(ctx: Context) -> Iterator[Finding]:
    floor = ctx.guardrails.toolkit.min_version
    seen: set[str] = set()
    for where, text in toolkit_versions(ctx):
        if where in seen:
            continue
        seen.add(where)
        version = toolkit_version_of(text)
        if version is None:
            yield where, f"toolkit {text or '(no tag)'} names no version, so the floor {floor} cannot be shown"
        elif version_tuple(version) < version_tuple(floor):
            cves = ", ".join(f"{f.cve} (fixed in {f.fixed_in})" for f in ctx.guardrails.toolkit.unfixed(version))
            yield where, f"toolkit {text} is below the floor {floor}; exposed to {cves}"


def _toml_setting(data: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _hardened_value(want: bool | StartsWith) -> str:
    return f"a string starting with {want.prefix!r}" if isinstance(want, StartsWith) else str(want).lower()


@rule("toolkit-hardened", "mandatory",
      "The rendered nvidia-container-runtime config.toml carries every hardened setting policies/guardrails.yaml "
      "lists (toolkit.hardened, nested tables by dotted path); a missing setting fails.",
      "render with gpushare's template (gpushare/templates/nvidia-container-toolkit-config.toml.j2) unchanged")
def _toolkit_hardened(ctx: Context) -> Iterator[Finding]:
    where = "nvidia-container-toolkit/config.toml"
    rendered = ctx.rendered
    if rendered is None:
        from gpushare.render.fleet import render_fleet

        rendered = render_fleet(ctx.fleet).files
    text = rendered.get(where)
    if text is None:
        yield where, "the toolkit config.toml was not rendered"
        return
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        yield where, f"the rendered config.toml is not TOML: {exc}"
        return
    for key, want in ctx.guardrails.toolkit.hardened.items():
        present, value = _toml_setting(data, key)
        if isinstance(want, StartsWith):
            ok = present and isinstance(value, str) and value.startswith(want.prefix)
        else:
            ok = present and isinstance(value, bool) and value is want
        if not ok:
            found = f"is {json.dumps(value)}" if present else "is missing"
            yield where, f"{key} {found}; it must be {_hardened_value(want)}"


# The env the GPU Operator's device-plugin DaemonSet starts from (gpu-operator assets/state-device-plugin/
# 0500_daemonset.yaml @ a22dbf6). Note DEVICE_LIST_STRATEGY=envvar: only CDI or devicePlugin.env replaces it.
DEVICE_PLUGIN_ASSET_ENV = {
    "PASS_DEVICE_SPECS": "true",
    "FAIL_ON_INIT_ERROR": "true",
    "DEVICE_LIST_STRATEGY": "envvar",
    "DEVICE_ID_STRATEGY": "uuid",
    "NVIDIA_VISIBLE_DEVICES": "all",
    "NVIDIA_DRIVER_CAPABILITIES": "all",
    "MPS_ROOT": "/run/nvidia/mps",
}
# What the operator sets with cdi.enabled (controllers/object_controls.go transformDevicePluginCtrForCDI @ a22dbf6).
OPERATOR_CDI_DEVICE_LIST = "cdi-annotations,cdi-cri"
DEVICE_LIST_ENV = "DEVICE_LIST_STRATEGY"
DEVICE_LIST_FLAG = "device-list-strategy"
# Strategies under which a container's NVIDIA_VISIBLE_DEVICES cannot widen what the plugin allocated.
SAFE_DEVICE_LIST_STRATEGIES = ("cdi-annotations", "cdi-cri", "volume-mounts")


def effective_device_plugin_env(values: Mapping[str, Any]) -> dict[str, str]:
    """The device plugin container's env the way the GPU Operator builds it: the asset's env, then MIG_STRATEGY from
    mig.strategy, then the CDI settings when cdi.enabled, then devicePlugin.env, which wins."""
    chart = gpu_operator_chart_values()
    env = dict(DEVICE_PLUGIN_ASSET_ENV)
    strategy = (values.get("mig") or {}).get("strategy", chart["mig"]["strategy"])
    if strategy:
        env["MIG_STRATEGY"] = str(strategy)
    if (values.get("cdi") or {}).get("enabled", chart["cdi"]["enabled"]):
        env[DEVICE_LIST_ENV] = OPERATOR_CDI_DEVICE_LIST
    for item in (values.get("devicePlugin") or {}).get("env") or []:
        env[str(item["name"])] = str(item.get("value", ""))
    return env


def device_list_strategies(value: Any) -> list[str]:
    """A strategy setting in any form the plugin takes (a string, a comma list with spaces, a YAML list), normalised."""
    items = value if isinstance(value, list | tuple) else [value]
    return [s.strip().lower() for item in items for s in str(item).split(",") if s.strip()]


def flag_from_args(args: Iterable[Any], name: str) -> list[str] | None:
    """The values a flag takes in the plugin's args, in every spelling its flag parser takes (-x or --x, =value or
    the value as the next item, one item holding both); a repeated flag adds up. None when the args do not set it."""
    tokens = [token for arg in args for token in str(arg).split()]
    found: list[str] | None = None
    i = 0
    while i < len(tokens):
        token = tokens[i]
        flag, eq, value = token.lstrip("-").partition("=")
        if token.startswith("-") and flag.lower() == name:
            if not eq:
                value = tokens[i + 1] if i + 1 < len(tokens) else ""
                i += 1
            found = (found or []) + [value]
        i += 1
    return found


def device_list_from_args(args: Iterable[Any]) -> list[str] | None:
    """--device-list-strategy from the plugin's args (flag_from_args), normalised."""
    found = flag_from_args(args, DEVICE_LIST_FLAG)
    return None if found is None else [s for value in found for s in device_list_strategies(value)]


def effective_device_list_strategy(config: Mapping[str, Any], operator_values: Mapping[str, Any] | None
                                   ) -> list[str]:
    """What the device plugin really uses. Its flags override its config file, and under the GPU Operator the
    DEVICE_LIST_STRATEGY env is always set (envvar, CDI's pair, or devicePlugin.env's value, which wins); args given
    in devicePlugin.args beat the env (docs/nvidia-stack.md)."""
    flags = (config.get("flags") or {}).get("plugin") or {}
    result = device_list_strategies(flags.get("deviceListStrategy", "envvar"))
    if operator_values is not None:
        result = device_list_strategies(effective_device_plugin_env(operator_values)[DEVICE_LIST_ENV])
        from_args = device_list_from_args((operator_values.get("devicePlugin") or {}).get("args") or [])
        if from_args is not None:
            result = from_args
    return result


def _operator_values(ctx: Context) -> list[tuple[str, Mapping[str, Any]]]:
    out = []
    for r in ctx.plan_of("helm.sh/v3:Release"):
        chart = str(r.inputs.get("chart", ""))
        if chart.endswith("gpu-operator"):
            out.append((r.name, r.inputs.get("values", {}) or {}))
    return out


def _unsafe_strategy(effective: list[str]) -> str | None:
    if not effective:
        return "the effective deviceListStrategy is empty"
    unsafe = [s for s in effective if s not in SAFE_DEVICE_LIST_STRATEGIES]
    if unsafe:
        return (f"the effective deviceListStrategy is {','.join(effective)}; only "
                f"{', '.join(SAFE_DEVICE_LIST_STRATEGIES)} keep NVIDIA_VISIBLE_DEVICES from reaching other GPUs")
    return None


@rule("device-list-strategy-not-envvar", "mandatory",
      "The device plugin's effective device list strategy (its config file, then the GPU Operator's env, "
      "devicePlugin.env and devicePlugin.args, in every spelling) is CDI or volume-mounts, never envvar: with envvar a "
      "container that sets NVIDIA_VISIBLE_DEVICES reaches GPUs it was not allocated.",
      "enable CDI in the cluster (cdi: true), and set no envvar DEVICE_LIST_STRATEGY in devicePlugin.env nor "
      "--device-list-strategy in devicePlugin.args")
def _device_list(ctx: Context) -> Iterator[Finding]:
    for name, cfg in sorted(ctx.fleet.device_plugin_configs.items()):
        problem = _unsafe_strategy(effective_device_list_strategy(cfg.content, None))
        if problem:
            yield f"config {name}", problem
    values_by_source = [(f"release {rel}", values) for rel, values in _operator_values(ctx)]
    site = _site_operator_values(ctx)
    if site.get("devicePlugin") or site.get("cdi"):
        values_by_source.append((OPERATOR_VALUES_KEY, site))
    for where, values in values_by_source:
        plugin = values.get("devicePlugin") or {}
        if where == OPERATOR_VALUES_KEY:
            # The site's additions alone: judged for what they say, not with the defaults they would merge into.
            said = [device_list_strategies(e.get("value", "")) for e in plugin.get("env") or []
                    if str(e.get("name", "")).upper() == DEVICE_LIST_ENV]
            from_args = device_list_from_args(plugin.get("args") or [])
            for effective in [*said, *([from_args] if from_args is not None else [])]:
                problem = _unsafe_strategy(effective)
                if problem:
                    yield where, problem.replace("the effective", "the site's")
            continue
        problem = _unsafe_strategy(effective_device_list_strategy({}, values))
        if problem:
            yield where, problem
        for item in plugin.get("env") or []:
            spelt = str(item.get("name", ""))
            if spelt != DEVICE_LIST_ENV and spelt.upper().replace("-", "_") == DEVICE_LIST_ENV:
                yield (f"{where}, devicePlugin.env {spelt}",
                       f"devicePlugin.env sets {spelt}={item.get('value', '')!r}, a spelling of {DEVICE_LIST_ENV} the "
                       "plugin does not read: remove it so the setting that applies is the one reviewed")


# Device-plugin settings that decide which names GPUs are advertised under. gpushare derives those names from the
# environment file (the cluster's mig_strategy, the profiles' rename_by_default), and tenants' quotas are checked
# against them; set in the GPU Operator's values they would rename GPUs past every quota and isolation rule.
RENAMING_FLAGS = ("mig-strategy", "config-file")  # single names MIG instances nvidia.com/gpu; another config file
RENAMING_ENV = ("MIG_STRATEGY", "CONFIG_FILE")  # the same flags as the plugin reads them from its environment
RENAMING_FIX = ("set the device plugin through the environment file (the cluster's mig_strategy and cdi, the "
                "profiles' rename_by_default), where quotas follow it, and drop the setting from "
                f"{OPERATOR_VALUES_KEY}")


def renaming_findings(values: Mapping[str, Any], mig_strategy: str | None, site: bool = False
                      ) -> list[tuple[str, str]]:
    """(value path, why) for each GPU Operator value that would change the resource names the device plugin
    advertises. `mig_strategy`: the cluster's (None: any mig.strategy is refused). `site`: the values are the stack's
    own additions, where gpushare's device-plugin config (devicePlugin.config) may not be touched at all."""
    found: list[tuple[str, str]] = []
    plugin = values.get("devicePlugin") or {}
    plugin = plugin if isinstance(plugin, Mapping) else {}
    strategy = (values.get("mig") or {}).get("strategy") if isinstance(values.get("mig"), Mapping) else None
    if strategy is not None and strategy != mig_strategy:
        found.append(("mig.strategy", f"mig.strategy {strategy!r} renames MIG instances (single advertises each as "
                      "nvidia.com/gpu) apart from the cluster's mig_strategy, which quotas are checked against"))
    args = plugin.get("args") or []
    for flag in RENAMING_FLAGS:
        if flag_from_args(args if isinstance(args, list) else [args], flag) is not None:
            found.append(("devicePlugin.args", f"devicePlugin.args sets --{flag}, which changes the names the "
                          "device plugin advertises GPUs under past every quota"))
    env = plugin.get("env") or []
    for item in env if isinstance(env, list) else []:
        spelt = str(item.get("name", "")) if isinstance(item, Mapping) else ""
        if spelt.upper().replace("-", "_") in RENAMING_ENV:
            found.append((f"devicePlugin.env {spelt}", f"devicePlugin.env sets {spelt}, which changes the names the "
                          "device plugin advertises GPUs under past every quota"))
    config = plugin.get("config") or {}
    if isinstance(config, Mapping) and (config if site else config.get("data")):
        found.append(("devicePlugin.config", "devicePlugin.config replaces gpushare's device-plugin configs "
                      "(resources, renameByDefault), whose names quotas are checked against"))
    sandbox = values.get("sandboxWorkloads") or {}
    if isinstance(sandbox, Mapping) and sandbox.get("enabled"):
        found.append(("sandboxWorkloads.enabled", "sandboxWorkloads.enabled advertises passthrough GPUs as "
                      "nvidia.com/<device name>, a resource no quota lists"))
    return found


@rule("operator-values-keep-resource-names", "mandatory",
      f"Nothing in the GPU Operator's values ({OPERATOR_VALUES_KEY} and the plan's releases) changes the names the "
      "device plugin advertises GPUs under: no mig.strategy other than the cluster's, no --mig-strategy or "
      "--config-file in devicePlugin.args (or their env), no other devicePlugin.config, no sandbox workloads.",
      RENAMING_FIX)
def _resource_names(ctx: Context) -> Iterator[Finding]:
    site = _site_operator_values(ctx)
    for path, why in renaming_findings(site, None, site=True):
        yield f"{OPERATOR_VALUES_KEY}.{path}", why
    for r in ctx.plan_of("helm.sh/v3:Release"):
        if str(r.inputs.get("chart", "")).endswith("gpu-operator"):
            cluster = ctx.fleet.clusters.get(r.cluster)
            for path, why in renaming_findings(r.inputs.get("values", {}) or {},
                                               cluster.mig_strategy if cluster else None):
                yield f"release {r.name}, {path}", why


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


@rule("tenant-quota-within-capacity", "mandatory",
      "Tenants are guaranteed no more of a GPU resource than their cluster's pools advertise, and no tenant's "
      "ResourceQuota (guaranteed plus borrowing limit) is above it: Kueue cannot admit a guarantee the pools cannot "
      "meet, so a tenant counting on it waits, and a quota above the cluster bounds nothing. Mandatory where the "
      "environment refuses the excess (quota_above_capacity: error), as validate and plan do; advisory where they "
      "only warn (quota_above_capacity: warning, the default).",
      "lower the tenants' quota or borrowing limits to what the pools advertise, or add GPUs; `gpushare plan` shows "
      "both",
      level_in=lambda ctx: "mandatory" if ctx.limits.quota_above_capacity == "error" else "advisory")
def _quota_within_capacity(ctx: Context) -> Iterator[Finding]:
    from gpushare.core.tenancy import fleet_tenancy

    for ct in fleet_tenancy(ctx.fleet, ctx.guardrails, refuse=False).values():
        for problem in ct.over_capacity:
            yield f"{problem.path}", problem.message


@rule("tenant-has-quota", "mandatory",
      "Every tenant namespace has a GPU quota.",
      "give the tenant a quota in the environment file")
def _tenant_quota(ctx: Context) -> Iterator[Finding]:
    for tenant in ctx.fleet.tenants:
        if not tenant.quota:
            yield f"tenant {tenant.name}", f"tenant {tenant.name} (namespace {tenant.namespace}) has no GPU quota"


DEPLOYER_KEY = "gpushare:deployer"
# Groups Kubernetes puts every identity of a kind in (every signed-in user, every ServiceAccount, every kubelet): a
# deployer named by one exempts all of them from the tenant namespace policies. system:masters (the default) is not
# one: only break-glass credentials carry it, and they bypass authorization anyway.
BROAD_GROUPS = ("system:authenticated", "system:unauthenticated", "system:serviceaccounts", "system:nodes",
                "system:bootstrappers")
BROAD_GROUP_PREFIXES = ("system:serviceaccounts:", "system:bootstrappers:")
SERVICE_ACCOUNT_USER = "system:serviceaccount:"


def deployer_findings(users: Iterable[str], groups: Iterable[str], tenant_namespaces: Iterable[str]
                      ) -> list[tuple[str, str]]:
    """(setting, why) for each deployer identity that is not gpushare's own: a group every identity of a kind is in,
    the anonymous user, a kubelet, or a ServiceAccount in a tenant's namespace (whose pods could then relabel their
    own namespace trusted). The Pulumi program refuses these too (gpushare/program/main.py)."""
    tenants = set(tenant_namespaces)
    found = []
    for i, group in enumerate(groups):
        if group in BROAD_GROUPS or group.startswith(BROAD_GROUP_PREFIXES):
            found.append((f"groups[{i}]", f"group {group!r} is one Kubernetes gives every identity of a kind, so all "
                          "of them would be exempt from the tenant namespace policies"))
    for i, user in enumerate(users):
        if user == "system:anonymous":
            found.append((f"users[{i}]", "user 'system:anonymous' is every unauthenticated request"))
        elif user.startswith("system:node:"):
            found.append((f"users[{i}]", f"user {user!r} is a kubelet, on a node tenants' pods run on"))
        elif user.startswith(SERVICE_ACCOUNT_USER):
            namespace = user[len(SERVICE_ACCOUNT_USER):].partition(":")[0]
            if namespace in tenants:
                found.append((f"users[{i}]", f"user {user!r} is a ServiceAccount in tenant namespace {namespace!r}: "
                              "the tenant's own pods could change their namespace's trust and Pod Security labels"))
    return found


DEPLOYER_FIX = ("name gpushare's own deployer in gpushare:deployer: its CI ServiceAccount as a user "
                "(system:serviceaccount:<ns>:<name>, in a namespace no tenant has) or a group only it is in")


@rule("deployer-identity-narrow", "mandatory",
      "The deployer identity (gpushare:deployer, the one the tenant namespace policies exempt) is gpushare's own: "
      "no group Kubernetes gives every user, ServiceAccount or node, no anonymous user or kubelet, and no "
      "ServiceAccount in a tenant's namespace.", DEPLOYER_FIX)
def _deployer(ctx: Context) -> Iterator[Finding]:
    from gpushare.policy.admission import DEFAULT_DEPLOYER_GROUPS

    deployer = _stack_mapping(ctx, DEPLOYER_KEY)
    users = [str(u) for u in deployer.get("users") or []]
    groups = [str(g) for g in deployer.get("groups", DEFAULT_DEPLOYER_GROUPS) or []]
    for setting, why in deployer_findings(users, groups, (t.namespace for t in ctx.fleet.tenants)):
        yield f"{DEPLOYER_KEY}.{setting}", why


@rule("promotion-from-pilot", "mandatory",
      "An environment promoted from another (prod from pilot) runs only profiles, MIG layouts, driver branches and "
      "toolkit versions that the other already runs.",
      "run the change in pilot first; `gpushare promote` checks how long and how well it ran there")
def _promotion(ctx: Context) -> Iterator[Finding]:
    source = ctx.promotion_source
    if source is None:
        if ctx.promotion_missing:
            yield (f"environment {ctx.name}", f"{ctx.name} is promoted from {ctx.promotion_missing} "
                   f"(policies/guardrails.yaml environments.{ctx.name}.promote_from), which has no environment file "
                   f"here: nothing shows {ctx.name}'s profiles, layouts, driver branches and toolkit ran there. Make "
                   f"environments/{ctx.promotion_missing}.yaml (gpushare import or init), or waive this until it "
                   "exists")
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


@rule("adoption-staged", "advisory",
      "An adopted cluster (the environment's adoption: block) keeps some of gpushare's guards staged so its first "
      "rollout breaks no running work; each is a reviewed step to take.",
      "once `gpushare diff --env ENV --kubeconfig ...` lists no running workload the step would break, set the field "
      "to its strict value (admission: deny, pod_security: enforce, shared_gpu_taint: true, host_defaults: true); "
      "docs/adoption.md walks the steps")
def _adoption_staged(ctx: Context) -> Iterator[Finding]:
    adoption = ctx.fleet.env.adoption
    for fieldname, what in adoption.staged() if adoption else []:
        yield f"environment {ctx.name}, adoption.{fieldname}", what


@rule("untrusted-tenants-need-enforced-admission", "mandatory",
      "Untrusted tenants are guarded by admission that refuses (adoption.admission: deny) and an enforced Pod "
      "Security level (adoption.pod_security: enforce): a guard that only warns isolates nobody.",
      "mark the tenant trusted until the cluster's guards enforce (what the cluster did before the import), or "
      "take the adoption steps first (admission: deny, pod_security: enforce)")
def _untrusted_need_enforcement(ctx: Context) -> Iterator[Finding]:
    adoption = ctx.fleet.env.adoption
    if adoption is None:
        return
    staged = [f for f, _ in adoption.staged() if f in ("admission", "pod_security")]
    for t in ctx.fleet.tenants:
        if t.trust != "trusted" and staged:
            yield f"tenant {t.name}", f"untrusted tenant {t.name} while adoption.{' and adoption.'.join(staged)} " \
                "only warn"


# ---------------------------------------------------------------- waivers


class Waiver(Strict):
    rule: str
    environment: str
    where: str = Field(description="Glob over the one violation location it covers, e.g. 'pool h200-inference'.")
    reason: Annotated[str, Field(min_length=10)]
    expires: Annotated[date, Field(strict=False)]  # YAML gives the date as text (gpushare.files)
    approved_by: str | None = None

    @field_validator("rule")
    @classmethod
    def _known_rule(cls, value: str) -> str:
        if value not in RULES and value not in RENAMED:  # an old id still reads
            raise invalid(f"no rule named {value!r}", f"use one of: {', '.join(sorted(RULES))}")
        return value

    # Where it was read ("file: waivers[i]"), for waivers read from several files; set by load_waivers.
    _location: str | None = PrivateAttr(None)

    @property
    def rule_id(self) -> str:
        """The rule's id now (the waiver may spell an old one)."""
        return current_id(self.rule)

    def covers(self, environment: str, violation: Violation) -> bool:
        level = RENAMED[self.rule][1] if self.rule in RENAMED else None
        return (self.rule_id == violation.rule and level in (None, violation.level)
                and self.environment == environment and fnmatch.fnmatchcase(violation.where, self.where))


class Waivers(Strict):
    waivers: list[Waiver] = Field(default_factory=list)


def waivers_path() -> Path:
    return project_root() / "policies" / "waivers.yaml"


def load_waivers(path: Path | None = None, guardrails: Guardrails | None = None) -> tuple[list[Waiver], str]:
    """The waivers and the file they came from. The default file may be absent; a file named explicitly may not.
    Every waiver names an environment policies/guardrails.yaml knows (expired or not: a misspelt one waives nothing
    and would never be reported as expired)."""
    if path is not None and not path.exists():
        raise GpushareError(Problem("waivers file not found", file=str(path),
                                    fix="check the --waivers path, or leave --waivers out to use "
                                        "policies/waivers.yaml (which may be absent)"), exit_code=2)
    files = [path] if path is not None else [waivers_path(), *waiver_fragment_paths()]
    known = (guardrails or load_guardrails()).environments
    waivers: list[Waiver] = []
    problems: list[Problem] = []
    first = str(files[0])
    for file in files:
        if not file.exists():
            continue
        loaded, doc = load_model(file, Waivers, "Waivers", "waivers file",
                                 "the commented waivers.yaml that `gpushare init` writes", empty={})
        if file == files[0]:
            first = doc.file
        for i, w in enumerate(loaded.waivers):
            w._location = f"{doc.file}: waivers[{i}]"
            if w.environment not in known:
                problems.append(doc.problem(("waivers", i, "environment"), f"waiver of {w.rule} names environment "
                                            f"{w.environment!r}, which policies/guardrails.yaml does not know",
                                            f"use one of: {', '.join(known)}"))
        waivers.extend(loaded.waivers)
    if problems:
        raise GpushareError(problems)
    return waivers, first


def waiver_fragment_paths() -> list[Path]:
    """policies/waivers.d/*.yaml: waivers kept apart from waivers.yaml (`gpushare import` writes an adopted
    cluster's there, dated), read with it unless --waivers names one file."""
    folder = project_root() / "policies" / "waivers.d"
    return sorted(folder.glob("*.yaml")) if folder.is_dir() else []


# The violations about waivers themselves: (description, remediation).
WAIVER_RULES: dict[str, tuple[str, str]] = {
    "waiver-expired": ("A waiver in policies/waivers.yaml has expired.",
                       "fix what it waived, or renew it with a new reason and expiry after review"),
    "waiver-refused": ("A waiver in policies/waivers.yaml cannot be accepted: it covers a non-waivable rule (now, or "
                       "at the base of the change under review), matches more than max_waiver_matches objects (or "
                       "everything), or expires more than max_waiver_days ahead.",
                       "narrow the waiver to one object and a nearer expiry, or fix what it waives"),
}


def waiver_targets(ctx: Context) -> set[str]:
    """The locations a waiver's `where` can name: every object of the fleet, as the rules spell locations."""
    fleet = ctx.fleet
    out = {f"environment {ctx.name}", "defaults.toolkit_version", "nvidia-container-toolkit/config.toml"}
    out |= {f"cluster {c}" for c in fleet.clusters}
    out |= {f"profile {p}" for p in fleet.profiles}
    out |= {f"config {c}" for c in fleet.device_plugin_configs}
    for pool in fleet.pools:
        out.add(f"pool {pool.name}")
        out |= {f"pool {pool.name}, host {n.name}" for n in pool.nodes}
    for t in fleet.tenants:
        out.add(f"tenant {t.name}")
        out |= {f"tenant {t.name}, cluster {c}" for c in t.clusters}
        out |= {f"tenant {t.name}, quota {r}" for r in t.quota}
        out |= {f"tenant {t.name}, borrowing_limit {r}" for r in t.borrowing_limit}
    return out


def _matches_everything(glob: str) -> bool:
    """A glob with no literal character (`*`, `**`, `[a-z]*`) matches whatever a rule reports."""
    return not re.sub(r"\[[^]]*\]|[*?]", "", glob).strip()


def waiver_refusal(ctx: Context, waiver: Waiver, today: date, targets: set[str]) -> tuple[str, str] | None:
    """Why a waiver cannot be accepted, with the fix; None when it can."""
    g = ctx.guardrails
    if waiver.rule_id in {current_id(r) for r in ctx.limits.non_waivable}:
        return (f"{waiver.rule} cannot be waived in {ctx.name} (policies/guardrails.yaml "
                f"environments.{ctx.name}.non_waivable)", f"fix what {waiver.rule} reports and remove the waiver")
    if waiver.rule_id in {current_id(r) for r in ctx.base_non_waivable}:
        return (f"{waiver.rule} is non-waivable in {ctx.name} at {ctx.base} (policies/guardrails.yaml "
                f"environments.{ctx.name}.non_waivable): this change lifts it from non_waivable and waives it at once",
                "propose the change to non_waivable on its own; once it has merged, the waiver can follow in a "
                "review of its own")
    latest = today + timedelta(days=g.max_waiver_days)
    if waiver.expires > latest:
        return (f"the waiver of {waiver.rule} expires on {waiver.expires.isoformat()}, more than "
                f"{g.max_waiver_days} days after {today.isoformat()}",
                f"set expires to {latest.isoformat()} or earlier, and renew it after review")
    if _matches_everything(waiver.where):
        return (f"the waiver of {waiver.rule} has where {waiver.where!r}, which matches everything",
                "name the one object it covers, e.g. where: 'pool h200-inference'")
    matched = sorted(t for t in targets if fnmatch.fnmatchcase(t, waiver.where))
    if len(matched) > g.max_waiver_matches:
        shown = ", ".join(matched[:5]) + (", ..." if len(matched) > 5 else "")
        return (f"the waiver of {waiver.rule} has where {waiver.where!r}, which matches {len(matched)} objects "
                f"({shown}); at most {g.max_waiver_matches} may be waived at once",
                "narrow where to the one object it covers, or fix the others")
    return None


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


def load_checked_guardrails(path: Path | None = None) -> Guardrails:
    """policies/guardrails.yaml, with the rule ids it names (non_waivable) checked against the rules here."""
    guardrails = load_guardrails(path)
    problems = [Problem(f"environments.{env}.non_waivable names unknown rule(s) {', '.join(unknown)}",
                        file=str(path or guardrails_path()), path=f"environments.{env}.non_waivable",
                        fix=f"use rule ids of `gpushare check`: {', '.join(sorted(RULES))}")
                for env, limits in guardrails.environments.items()
                if (unknown := [r for r in limits.non_waivable if r not in RULES and r not in RENAMED])]
    if problems:
        raise GpushareError(problems)
    return guardrails


def evaluate(ctx: Context, waivers: list[Waiver], today: date, waivers_file: str = "policies/waivers.yaml",
             rules: Iterable[Rule] | None = None) -> Report:
    env = ctx.name
    report = Report(env)
    found: list[Violation] = []
    for r in rules if rules is not None else RULES.values():
        if r.needs_plan and ctx.plan is None:
            report.skipped.append(r.id)
            continue
        found.extend(r.run(ctx))
    targets = waiver_targets(ctx)
    active: list[Waiver] = []
    for i, w in enumerate(waivers):
        if w.environment != env:
            continue
        where = w._location or f"{waivers_file}: waivers[{i}]"
        if w.expires < today:
            description, fix = WAIVER_RULES["waiver-expired"]
            report.violations.append(Violation(
                "waiver-expired", "mandatory", where,
                f"the waiver of {w.rule} for {w.where} expired on {w.expires.isoformat()}", fix))
            continue
        refusal = waiver_refusal(ctx, w, today, targets | {v.where for v in found if v.rule == w.rule_id})
        if refusal is not None:
            report.violations.append(Violation("waiver-refused", "mandatory", where, *refusal))
        else:
            active.append(w)
    for violation in found:
        waiver = next((w for w in active if w.covers(env, violation)), None)
        if waiver is None:
            report.violations.append(violation)
        else:
            report.waived.append((violation, waiver))
    return report


def stack_settings(env: str) -> dict[str, Any] | None:
    """The config of the Pulumi stack that deploys this environment (Pulumi.<stack>.yaml), where one does."""
    from gpushare.core.stacks import stack_config

    if not env.endswith((".yaml", ".yml")) and os.sep not in env and not (project_root() / f"Pulumi.{env}.yaml"
                                                                          ).exists():
        return None
    _, config, notes = stack_config(env)
    return None if notes else config


def context_for(env: str, plan: list[PlanResource] | None = None, guardrails: Guardrails | None = None,
                base: str | None = None) -> Context:
    """The rules' input for `--env ENV`: the environment is the one ENV names (its file name), whatever it says.
    `base`: the Git revision the change under review merges into; the rules non-waivable there stay so."""
    path = environment_path(env)
    fleet = resolve(path)
    named = environment_stem(path)
    g = guardrails or load_checked_guardrails()
    limits = g.environment(named)
    source, missing = None, None
    if limits.promote_from:
        try:
            path_of_source = environment_path(limits.promote_from)
        except GpushareError:  # no such file: the promotion rule says so, with its fix
            missing = limits.promote_from
        else:
            source = resolve_env(str(path_of_source))
    config = stack_settings(env)
    from gpushare.core.stacks import ENVIRONMENT_KEY, environment_file

    deployed = environment_file(config[ENVIRONMENT_KEY]) if config and config.get(ENVIRONMENT_KEY) else None
    return Context(fleet=fleet, guardrails=g, plan=plan, promotion_source=source, promotion_missing=missing,
                   environment=named,
                   stack_config=config, deployed=deployed, base=base,
                   base_non_waivable=non_waivable_at(base, named) if base else ())

