"""Tenancy and queueing from the resolved fleet: per cluster, the tenant namespaces with their GPU quotas and
host defaults, priority classes, and Kueue flavors, cluster queues in one cohort, and local queues; the tenant roles
(gpushare-tenant-developer, gpushare-tenant-admin) and, where a tenant names its people, their RoleBindings.

One source of numbers: a tenant's quota in the environment file is its Kueue nominalQuota; its namespace
ResourceQuota is nominal plus the borrowing limit, so workloads Kueue admits on borrowed quota are not then
rejected by the API server. Tenant namespaces carry the tenant's Pod Security level (enforce, audit, warn) pinned to
the cluster's Kubernetes minor. Every GPU resource the cluster advertises appears in every tenant's ResourceQuota
(0 where the tenant has none): a resource missing from a quota would be unlimited. On DRA clusters the quota also
counts devices per DeviceClass (the class's resource limit; 0 for the driver's own classes), and Kueue counts claims
through `device_class_mappings` against the same resource names as on device-plugin clusters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpushare.core import dra
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.guardrails import Guardrails
from gpushare.core.loading import format_path, read_yaml
from gpushare.core.namespaces import PRIORITY_CLASSES, tenant_namespace_labels
from gpushare.core.resolve import ResolvedFleet, ResolvedPool, ResolvedTenant
from gpushare.core.spec import USER_PREFIX, Tenant

KUEUE_API = "kueue.x-k8s.io/v1beta2"
COHORT = "gpushare"
SPARE = "-spare"  # not a valid tenant name, so it cannot collide
SPARE_QUEUE = "gpushare-unassigned"
LOCAL_QUEUE = "gpushare"
QUOTA_NAME = "gpushare-gpu-quota"
LIMIT_RANGE_NAME = "gpushare-host-defaults"
MANAGED = {"app.kubernetes.io/managed-by": "gpushare"}
_ISOLATION_ORDER = {"hardware": 0, "memory-partitioned": 1, "none": 2, "mixed": 3}

# ---------------------------------------------------------------- tenant RBAC
# The roles gpushare expects tenants to hold in their namespace, bound by RoleBinding to the groups and users the
# tenant names (developers, admins). They grant what a tenant's everyday work needs and never a verb that reaches
# past it: no Kueue Workloads or LocalQueues to write, no ResourceQuota or LimitRange edits, no pods/binding,
# pods/status or pods/ephemeralcontainers, no impersonation, no ServiceAccount tokens, no DaemonSets or
# PodDisruptionBudgets (docs/tenancy.md, "Tenant RBAC", says what each left-out grant would open). Bound in a
# namespace, a ClusterRole grants nothing cluster-scoped (nodes, webhooks, admission policies and their bindings,
# ClusterQueues), and the API server lets an admin bind or create only roles whose rights the admin holds.
RBAC_API = "rbac.authorization.k8s.io"
DEVELOPER_ROLE = "gpushare-tenant-developer"
ADMIN_ROLE = "gpushare-tenant-admin"
DEVELOPER_BINDING = "gpushare-developers"
ADMIN_BINDING = "gpushare-admins"
_READ = ["get", "list", "watch"]
_WRITE = [*_READ, "create", "update", "patch", "delete", "deletecollection"]
DEVELOPER_RULES: list[dict[str, Any]] = [
    # workloads: pods, the controllers whose pods Kueue queues, and what they mount or expose
    {"apiGroups": [""], "resources": ["pods", "configmaps", "secrets", "services", "persistentvolumeclaims"],
     "verbs": _WRITE},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": _READ},
    {"apiGroups": [""], "resources": ["pods/exec", "pods/attach", "pods/portforward"], "verbs": ["get", "create"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    {"apiGroups": ["apps"], "resources": ["deployments", "deployments/scale", "statefulsets", "statefulsets/scale",
                                          "replicasets", "replicasets/scale"], "verbs": _WRITE},
    {"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"], "verbs": _WRITE},
    # JobSets, which Kueue's JobSet integration queues as one Workload (the grant is inert where JobSet is absent)
    {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": _WRITE},
    {"apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"], "verbs": _WRITE},
    {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses"], "verbs": _WRITE},
    # what the namespace holds and why work waits: read only
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events", "endpoints", "serviceaccounts", "resourcequotas", "limitranges"],
     "verbs": _READ},
    {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": _READ},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": _READ},
    {"apiGroups": ["apps"], "resources": ["controllerrevisions", "daemonsets"], "verbs": _READ},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": _READ},
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["localqueues", "workloads"], "verbs": _READ},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims", "resourceclaimtemplates"], "verbs": _READ},
]
ADMIN_RULES: list[dict[str, Any]] = [
    *DEVELOPER_RULES,
    # who may do what in the namespace (never more than this role: the API server refuses the rest), the namespace's
    # own identities and its network
    {"apiGroups": [RBAC_API], "resources": ["roles", "rolebindings"], "verbs": _WRITE},
    {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": _WRITE},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": _WRITE},
    {"apiGroups": ["authorization.k8s.io"], "resources": ["localsubjectaccessreviews"], "verbs": ["create"]},
]


def rbac_subject(name: str) -> dict[str, str]:
    """A RoleBinding subject from the environment file's spelling: user:<name> a user, anything else a group."""
    if name.startswith(USER_PREFIX):
        return {"apiGroup": RBAC_API, "kind": "User", "name": name.removeprefix(USER_PREFIX)}
    return {"apiGroup": RBAC_API, "kind": "Group", "name": name}


def tenant_roles() -> list[dict[str, Any]]:
    """The two ClusterRoles every cluster gets; tenants' RoleBindings grant them in one namespace each."""
    return [{"apiVersion": f"{RBAC_API}/v1", "kind": "ClusterRole", "metadata": {"name": name, "labels": MANAGED},
             "rules": rules} for name, rules in ((DEVELOPER_ROLE, DEVELOPER_RULES), (ADMIN_ROLE, ADMIN_RULES))]


def tenant_role_bindings(tenant: Tenant) -> list[dict[str, Any]]:
    """The tenant's RoleBindings in its namespace: one per role it names people for."""
    out = []
    for name, role, subjects in ((DEVELOPER_BINDING, DEVELOPER_ROLE, tenant.developers),
                                 (ADMIN_BINDING, ADMIN_ROLE, tenant.admins)):
        if subjects:
            out.append({"apiVersion": f"{RBAC_API}/v1", "kind": "RoleBinding",
                        "metadata": {"name": name, "namespace": tenant.namespace, "labels": MANAGED},
                        "roleRef": {"apiGroup": RBAC_API, "kind": "ClusterRole", "name": role},
                        "subjects": [rbac_subject(s) for s in subjects]})
    return out


@dataclass
class Flavor:
    """A Kueue ResourceFlavor: one pool's nodes, with the pool's taints tolerated by the workloads it admits."""

    name: str
    pool: ResolvedPool
    resources: dict[str, int]  # advertised resource -> count in this pool


@dataclass
class TenantShare:
    """What a tenant gets in one cluster, per resource: guaranteed (nominal) and borrowable on top."""

    tenant: ResolvedTenant
    nominal: dict[str, int]
    borrowable: dict[str, int]

    @property
    def quota_limit(self) -> dict[str, int]:
        return {r: self.nominal.get(r, 0) + self.borrowable.get(r, 0) for r in self.nominal}


@dataclass
class ClusterTenancy:
    cluster: str
    flavors: list[Flavor]
    shares: list[TenantShare]
    objects: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    over_capacity: list[Problem] = field(default_factory=list)  # guaranteed quota above what the pools advertise
    # Kueue Configuration resources.deviceClassMappings (DRA clusters only; the Kueue install carries it).
    device_class_mappings: list[dict[str, Any]] = field(default_factory=list)
    # Per tenant, the pools (flavors) its ClusterQueue may admit work onto: quota or a borrowing limit there.
    tenant_pools: dict[str, list[str]] = field(default_factory=dict)
    # Per pool, its nodes' taints as (key, value, effect): what the pool's ResourceFlavor tolerates.
    pool_taints: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)

    @property
    def kueue_resources(self) -> dict[str, Any]:
        return kueue_resources(self.device_class_mappings)


# Kueue refuses a workload asking for a resource its ClusterQueue does not cover, and every tenant pod asks for cpu
# and memory (the LimitRange defaults). The queues hold GPU quota only: the environment file says nothing about
# host CPU and memory, which the LimitRange bounds per container and the scheduler places. So Kueue is told to leave
# the host resources out (a prefix: hugepages-<size>); any other resource a pod names still needs a covered quota.
KUEUE_EXCLUDED_PREFIXES = ("cpu", "memory", "ephemeral-storage", "hugepages-")


def kueue_resources(device_class_mappings: list[dict[str, Any]]) -> dict[str, Any]:
    """The `resources` block of Kueue's Configuration that gpushare's queues need."""
    out: dict[str, Any] = {"excludeResourcePrefixes": list(KUEUE_EXCLUDED_PREFIXES)}
    if device_class_mappings:
        out["deviceClassMappings"] = device_class_mappings
    return out


def _flavors(pools: list[ResolvedPool]) -> list[Flavor]:
    ordered = sorted(pools, key=lambda p: (_ISOLATION_ORDER.get(p.isolation, 9), p.name))
    return [Flavor(name=p.name, pool=p, resources=dict(p.totals.advertised)) for p in ordered]


def _groups(flavors: list[Flavor]) -> list[tuple[list[str], list[Flavor]]]:
    """Kueue: a resource sits in exactly one resource group, and every flavor of a group lists all its resources.
    Group resources that share a flavor (connected components of the resource-flavor graph)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for f in flavors:
        names = list(f.resources)
        for other in names[1:]:
            parent[find(other)] = find(names[0])
        find(names[0])
    groups: dict[str, tuple[list[str], list[Flavor]]] = {}
    for f in flavors:
        root = find(next(iter(f.resources)))
        resources, members = groups.setdefault(root, ([], []))
        members.append(f)
        for r in f.resources:
            if r not in resources:
                resources.append(r)
    return [(sorted(r), m) for r, m in groups.values()]


def _shares(fleet: ResolvedFleet, cluster: str, flavors: list[Flavor]) -> list[TenantShare]:
    isolated = {r for f in flavors if f.pool.isolation == "hardware" for r in f.resources}
    advertised = {r for f in flavors for r in f.resources}
    out = []
    for t in fleet.tenants:
        if cluster not in t.clusters:
            continue
        nominal = {r: 0 for r in sorted(advertised)}
        borrowable = {r: 0 for r in sorted(advertised)}
        for r, n in t.quota.items():
            if r in advertised and (t.trust == "trusted" or r in isolated):
                nominal[r] = n
                borrowable[r] = t.borrowing_limit.get(r, 0)
        out.append(TenantShare(tenant=t, nominal=nominal, borrowable=borrowable))
    return out


Placement = dict[str, dict[tuple[str, str], tuple[int, int]]]  # tenant -> (flavor, resource) -> (nominal, borrow)


def _place_quota(flavors: list[Flavor], shares: list[TenantShare]) -> Placement:
    """Spread each tenant's nominal quota over the flavors offering the resource, most isolated first, within
    what each flavor has left; the borrowing limit sits with the tenant's first flavor for that resource.
    What no tenant is guaranteed goes to the spare queue."""
    left = {(f.name, r): n for f in flavors for r, n in f.resources.items()}
    offering = {r: [f.name for f in flavors if r in f.resources] for f in flavors for r in f.resources}
    out: Placement = {}
    for share in shares:
        mine = out.setdefault(share.tenant.name, {})
        for r, wanted in share.nominal.items():
            names = offering.get(r, [])
            if not names:
                continue
            for i, name in enumerate(names):
                take = wanted if i == len(names) - 1 else min(wanted, left[(name, r)])
                if take or i == 0:
                    borrow = share.borrowable.get(r, 0) if i == 0 else 0
                    mine[(name, r)] = (take, borrow)
                left[(name, r)] -= take
                wanted -= take
                if not wanted:
                    break
    out[SPARE] = {key: (max(n, 0), 0) for key, n in left.items()}
    return out


def _cluster_queue(name: str, groups: list[tuple[list[str], list[Flavor]]],
                   quota: dict[tuple[str, str], tuple[int, int]], labels: dict[str, str],
                   namespace_selector: dict[str, Any] | None) -> dict[str, Any]:
    resource_groups = []
    for resources, members in groups:
        flavor_specs = []
        for f in members:
            entries = []
            for r in resources:
                nominal, borrow = quota.get((f.name, r), (0, 0))
                # borrowingLimit 0 is explicit: left out, Kueue would let the queue borrow without limit.
                entries.append({"name": r, "nominalQuota": nominal, "borrowingLimit": borrow})
            flavor_specs.append({"name": f.name, "resources": entries})
        resource_groups.append({"coveredResources": resources, "flavors": flavor_specs})
    spec: dict[str, Any] = {"cohortName": COHORT}
    if namespace_selector is not None:
        spec["namespaceSelector"] = namespace_selector
    return {
        "apiVersion": KUEUE_API, "kind": "ClusterQueue",
        "metadata": {"name": name, "labels": {**MANAGED, **labels}},
        "spec": {
            **spec,
            "queueingStrategy": "BestEffortFIFO",
            # Online work takes back lent GPUs; within a queue, higher priority goes first.
            "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority",
                           "borrowWithinCohort": {"policy": "Never"}},
            "resourceGroups": resource_groups,
        },
    }


def cluster_tenancy(fleet: ResolvedFleet, cluster: str, guardrails: Guardrails) -> ClusterTenancy:
    pools = [p for p in fleet.pools if p.cluster == cluster]
    flavors = _flavors(pools)
    shares = _shares(fleet, cluster, flavors)
    result = ClusterTenancy(cluster=cluster, flavors=flavors, shares=shares,
                            device_class_mappings=dra.kueue_device_class_mappings(fleet, cluster))
    kubernetes_version = fleet.clusters[cluster].kubernetes_version
    objects = result.objects
    policy = guardrails.tenancy
    adoption = fleet.env.adoption

    kept = adoption.priority_classes if adoption else {}
    for priority, name in PRIORITY_CLASSES.items():
        pc = policy.priority_classes[priority]  # type: ignore[index]
        description = f"gpushare {priority} work" + (" (queued; never preempts)" if priority == "batch" else "")
        if priority not in kept:  # an adopted cluster's own class of the same value stays the one pods name
            objects.append({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                            "metadata": {"name": name, "labels": MANAGED}, "value": pc.value,
                            "preemptionPolicy": pc.preemption_policy, "globalDefault": False,
                            "description": description})
        objects.append({"apiVersion": KUEUE_API, "kind": "WorkloadPriorityClass",
                        "metadata": {"name": name, "labels": MANAGED}, "value": pc.value,
                        "description": description})

    for f in flavors:
        spec: dict[str, Any] = {"nodeLabels": {"gpushare.io/pool": f.pool.name}}
        taints: list[tuple[str, str, str]] = sorted({(t.key, t.value, t.effect) for n in f.pool.nodes
                                                     for t in n.taints})
        result.pool_taints[f.name] = taints
        if taints:
            spec["tolerations"] = [{"key": k, "operator": "Equal", "value": v, "effect": e} for k, v, e in taints]
        objects.append({"apiVersion": KUEUE_API, "kind": "ResourceFlavor",
                        "metadata": {"name": f.name, "labels": MANAGED}, "spec": spec})

    objects.extend(tenant_roles())
    groups = _groups(flavors)
    placement = _place_quota(flavors, shares)
    for share in shares:
        t = share.tenant
        result.tenant_pools[t.name] = sorted({flavor for (flavor, _), (nominal, borrow)
                                              in placement.get(t.name, {}).items() if nominal or borrow})
        objects.append(_cluster_queue(f"tenant-{t.name}", groups, placement.get(t.name, {}),
                                      {"gpushare.io/tenant": t.name}, {"matchLabels": {"gpushare.io/tenant": t.name}}))
        labels = {**MANAGED, **tenant_namespace_labels(t.name, t.trust, t.priority, t.pod_security,
                                                       kubernetes_version, enforce=adoption is None
                                                       or adoption.pod_security == "enforce")}
        objects.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": t.namespace, "labels": labels}})
        objects.append({"apiVersion": "v1", "kind": "ResourceQuota",
                        "metadata": {"name": t.quota_name or QUOTA_NAME, "namespace": t.namespace,
                                     "labels": MANAGED},
                        "spec": {"hard": {**{f"requests.{r}": str(n) for r, n in _quota_limits(fleet, t, share)
                                             .items()},
                                          **dra.dra_quota_resources(fleet, cluster, t, share.quota_limit)}}})
        d = policy.container_defaults
        if adoption is None or adoption.host_defaults:
            objects.append({"apiVersion": "v1", "kind": "LimitRange",
                            "metadata": {"name": LIMIT_RANGE_NAME, "namespace": t.namespace, "labels": MANAGED},
                            "spec": {"limits": [{"type": "Container",
                                                 "defaultRequest": {"cpu": d.request.cpu,
                                                                    "memory": d.request.memory},
                                                 "default": {"cpu": d.limit.cpu, "memory": d.limit.memory},
                                                 "max": {"cpu": d.max.cpu, "memory": d.max.memory}}]}})
        objects.append({"apiVersion": KUEUE_API, "kind": "LocalQueue",
                        "metadata": {"name": LOCAL_QUEUE, "namespace": t.namespace, "labels": MANAGED},
                        "spec": {"clusterQueue": f"tenant-{t.name}"}})
        objects.extend(tenant_role_bindings(next(x for x in fleet.env.tenants if x.name == t.name)))

    spare = placement.get(SPARE, {})
    if any(q for q, _ in spare.values()):
        # Capacity no tenant is guaranteed still belongs to the cohort, so tenants can borrow it.
        # No namespaceSelector: Kueue then admits from no namespace at all; the queue only lends.
        objects.append(_cluster_queue(SPARE_QUEUE, groups, spare, {}, None))
    result.over_capacity = _over_capacity(fleet, cluster, flavors, shares)
    limits = guardrails.environments.get(fleet.environment)
    if limits is None or limits.quota_above_capacity == "warning":
        result.warnings.extend(p.message for p in result.over_capacity)
    return result


def priority_class_names(fleet: ResolvedFleet) -> dict[str, str]:
    """The PriorityClass tenant pods name for each priority: gpushare's, or the adopted cluster's own."""
    adoption = fleet.env.adoption
    kept = {str(k): v for k, v in adoption.priority_classes.items()} if adoption else {}
    return {**PRIORITY_CLASSES, **kept}


def _quota_limits(fleet: ResolvedFleet, tenant: ResolvedTenant, share: TenantShare) -> dict[str, int]:
    """The GPU limits of a tenant's ResourceQuota. Every resource the cluster advertises, 0 where the tenant has
    none (a resource missing from a quota is unlimited), except in a quota adopted in place while the cluster is
    being adopted: there the resources the quota never named stay unlimited, as they were, until
    adoption.host_defaults (the step that brings gpushare's namespace limits) is taken."""
    adoption = fleet.env.adoption
    if tenant.quota_name is None or adoption is None or adoption.host_defaults:
        return share.quota_limit
    named = set(tenant.quota) | set(tenant.borrowing_limit)
    return {r: n for r, n in share.quota_limit.items() if r in named}


def _over_capacity(fleet: ResolvedFleet, cluster: str, flavors: list[Flavor], shares: list[TenantShare]
                   ) -> list[Problem]:
    """Tenants guaranteed more of a resource than the cluster advertises, located at the first such quota; and a
    tenant whose ResourceQuota (guaranteed plus borrowing limit) is above it, located at its borrowing limit: a
    borrowing limit of 400 GPUs in a cluster of 8 is a typo or a wish, never a number Kueue can give."""
    capacity = {r: sum(f.resources.get(r, 0) for f in flavors) for r in {r for f in flavors for r in f.resources}}
    index = {t.name: i for i, t in enumerate(fleet.env.tenants)}
    found: list[tuple[tuple[Any, ...], str, str]] = []  # (where in the file, message, fix)
    for r, total in sorted(capacity.items()):
        guaranteed = sum(s.nominal.get(r, 0) for s in shares)
        if guaranteed <= total:
            continue
        who = ", ".join(f"{s.tenant.name} {s.nominal[r]}" for s in shares if s.nominal.get(r))
        first = next(s.tenant.name for s in shares if s.nominal.get(r))
        found.append((("tenants", index[first], "quota", r),
                      f"cluster {cluster}: tenants are guaranteed {guaranteed} {r} ({who}) but the pools advertise "
                      f"{total}", f"lower the tenants' quota of {r} to {total} in all, or add GPUs to the cluster"))
    for s in shares:
        for r, borrow in sorted(s.borrowable.items()):
            total, nominal = capacity.get(r, 0), s.nominal.get(r, 0)
            if borrow and nominal <= total < nominal + borrow:  # a guarantee above it is reported above
                found.append((("tenants", index[s.tenant.name], "borrowing_limit", r),
                              f"cluster {cluster}: tenant {s.tenant.name} may borrow {borrow} {r} beside its "
                              f"{nominal} guaranteed (its ResourceQuota allows {nominal + borrow}) but the pools "
                              f"advertise {total}",
                              f"lower the borrowing limit of {r} to at most {max(total - nominal, 0)} (what the "
                              "pools advertise beyond its guarantee), or add GPUs to the cluster"))
    if not found:
        return []
    try:  # read again only to give each problem its line; a file gone since (a temporary copy) gives none
        doc = read_yaml(fleet.source, "environment file")
    except GpushareError:
        return [Problem(message, file=str(fleet.source), path=format_path(loc), fix=fix) for loc, message, fix in found]
    return [doc.problem(loc, message, fix) for loc, message, fix in found]


def fleet_tenancy(fleet: ResolvedFleet, guardrails: Guardrails, refuse: bool = True) -> dict[str, ClusterTenancy]:
    """Every cluster's tenancy. With `refuse`, quota above capacity is an error where guardrails.yaml says so for
    this environment (quota_above_capacity: error); the guardrail rule reports it either way."""
    result = {c: cluster_tenancy(fleet, c, guardrails) for c in fleet.clusters}
    limits = guardrails.environments.get(fleet.environment)
    if refuse and limits is not None and limits.quota_above_capacity == "error":
        problems = [p for ct in result.values() for p in ct.over_capacity]
        if problems:
            raise GpushareError([Problem(p.message, file=p.file, path=p.path, line=p.line,
                                         fix=f"{p.fix} ({fleet.environment} refuses more: quota_above_capacity in "
                                             "policies/guardrails.yaml)") for p in problems])
    return result
