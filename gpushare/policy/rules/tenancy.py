"""Rules over tenants: untrusted tenants get only hardware-isolated GPUs (quota, queues, DRA claims) and only
behind enforcing admission; every tenant has a Kueue queue in the cohort and a GPU quota within the pools'
capacity. The claim, DeviceClass and ClusterQueue findings read any object, gpushare's or the plan's."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from gpushare.core import dra
from gpushare.core.mappings import dig
from gpushare.core.resolve import ResolvedFleet
from gpushare.core.tenancy import fleet_tenancy
from gpushare.policy.registry import Context, Finding, rule


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
            if r.cluster in (name, "-") and dig(r.inputs, "metadata", "name") in isolated:
                yield from device_class_findings(r.inputs)


def _claim_requests(template: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every device request of a ResourceClaimTemplate: `exactly` ones and each firstAvailable alternative."""
    requests = dig(template, "spec", "spec", "devices", "requests") or []
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
        took = dig(request, "capacity", "requests", "shares")
        if device_class not in isolated:
            yield where, (f"ResourceClaimTemplate {meta.get('name')} in untrusted tenant {tenant}'s namespace "
                          f"requests DeviceClass {device_class}, which is not a hardware-isolated gpushare class "
                          "(MIG or exclusive)")
        elif shares is not None and str(took) != str(shares):
            yield where, (f"ResourceClaimTemplate {meta.get('name')} of untrusted tenant {tenant} takes {took} of the "
                          f"{shares} consumable shares of its device: time-sliced claims could share that GPU")


def device_class_findings(device_class: Mapping[str, Any]) -> Iterator[Finding]:
    """A DeviceClass gpushare counts as hardware-isolated carries no time-slicing or MPS sharing config."""
    name = dig(device_class, "metadata", "name")
    for entry in dig(device_class, "spec", "config") or []:
        strategy = dig(entry, "opaque", "parameters", "sharing", "strategy")
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
    owners = {dig(meta, "labels", "gpushare.io/tenant"),
              dig(spec, "namespaceSelector", "matchLabels", "gpushare.io/tenant"),
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


@rule("tenant-has-queue", "mandatory",
      "Every tenant namespace, in every cluster the tenant uses, has a Kueue LocalQueue pointing at a ClusterQueue in "
      "the cohort, so batch work waits for GPUs instead of being rejected.",
      "keep the Tenancy component in the program (gpushare/tenancy.py makes the queues)", needs_plan=True)
def _queued(ctx: Context) -> Iterator[Finding]:
    local = {(r.cluster, dig(r.inputs, "metadata", "namespace")): r
             for r in ctx.plan_of("kueue.x-k8s.io/v1beta2:LocalQueue")}
    cluster_queues = {(r.cluster, dig(r.inputs, "metadata", "name")): r
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
            target = dig(lq.inputs, "spec", "clusterQueue")
            cq = cluster_queues.get((cluster, target))
            if cq is None or not dig(cq.inputs, "spec", "cohortName"):
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
