"""Tenancy and Kueue objects from the resolved fleet: exact resource names, zero shared quota for untrusted
tenants, one source of numbers (ResourceQuota = nominal + borrowing), and schema-valid objects."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.guardrails import load_guardrails
from gpushare.core.resolve import resolve, resolve_env
from gpushare.core.tenancy import COHORT, SPARE_QUEUE, cluster_tenancy, fleet_tenancy
from gpushare.ops.preview import crd_schemas
from tests.conftest import PROFILES, ROOT, cluster_named, pool_named, tenant_named


def validate(obj: dict[str, Any]) -> None:
    """Kueue objects against the CRDs the preview uses (gpushare/data), built-in kinds against Kubernetes'."""
    if obj["apiVersion"].startswith("kueue.x-k8s.io/"):
        jsonschema.validate(obj, crd_schemas()[(obj["apiVersion"], obj["kind"])])
    else:
        kubernetes_validate.validate(obj, "1.31", strict=True)


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"] if "namespace" not in o["metadata"] else
            f"{o['metadata']['namespace']}/{o['metadata']['name']}": o for o in objects if o["kind"] == kind}


@pytest.mark.parametrize("env", ["dev", "pilot", "prod"])
def test_every_object_is_schema_valid(env: str) -> None:
    tenancy = fleet_tenancy(resolve_env(env), load_guardrails())
    for ct in tenancy.values():
        assert ct.warnings == []
        for obj in ct.objects:
            validate(obj)


def test_quota_is_nominal_plus_borrowing_on_advertised_names() -> None:
    ct = cluster_tenancy(resolve_env("dev"), "dev-metal", load_guardrails())
    quota = by_kind(ct.objects, "ResourceQuota")["search-inference/gpushare-gpu-quota"]["spec"]["hard"]
    # every advertised GPU resource is listed, 0 where the tenant has none (missing would mean unlimited)
    assert quota == {"requests.nvidia.com/gpu": "0", "requests.nvidia.com/gpu.shared": "0",
                     "requests.nvidia.com/mig-1g.10gb": "0", "requests.nvidia.com/mig-2g.20gb": "4",
                     "requests.nvidia.com/mig-3g.40gb": "6"}
    cq = by_kind(ct.objects, "ClusterQueue")["tenant-search"]["spec"]
    entries = {(f["name"], r["name"]): r for g in cq["resourceGroups"] for f in g["flavors"] for r in f["resources"]}
    assert entries[("a100-inference", "nvidia.com/mig-3g.40gb")] == {
        "name": "nvidia.com/mig-3g.40gb", "nominalQuota": 4, "borrowingLimit": 2}
    assert cq["cohortName"] == COHORT


def test_untrusted_tenant_gets_zero_shared_quota(dev_data: dict[str, Any], write_env: Any) -> None:
    # A policy violation, still never granted.
    tenant_named(dev_data, "partner-eval")["quota"]["nvidia.com/gpu.shared"] = 4
    ct = cluster_tenancy(resolve(write_env(dev_data), PROFILES), "dev-metal", load_guardrails())
    quota = by_kind(ct.objects, "ResourceQuota")["partner-eval/gpushare-gpu-quota"]["spec"]["hard"]
    assert quota["requests.nvidia.com/gpu.shared"] == "0"
    assert quota["requests.nvidia.com/mig-1g.10gb"] == "8"
    ns = by_kind(ct.objects, "Namespace")["partner-eval"]
    assert ns["metadata"]["labels"]["gpushare.io/trust"] == "untrusted"


@pytest.mark.parametrize(("strategy", "profile", "expected"), [
    ("mixed", "mig-small", "requests.nvidia.com/mig-1g.10gb"),
    ("single", "mig-small", "requests.nvidia.com/gpu"),
    ("mixed", "mig-small-ts2", "requests.nvidia.com/mig-1g.10gb.shared"),
    ("mixed", "notebooks-ts4", "requests.nvidia.com/gpu.shared"),
])
def test_quota_names_follow_the_device_plugin(dev_data: dict[str, Any], write_env: Any, strategy: str,
                                              profile: str, expected: str) -> None:
    cluster_named(dev_data, "dev-metal")["mig_strategy"] = strategy
    dev_data["pools"] = [{"name": "p", "cluster": "dev-metal", "purpose": "inference",
                          "gpu_model": "NVIDIA A100-SXM4-80GB", "profile": profile,
                          "hosts": [{"name": "h", "address": "10.0.0.1", "gpu_count": 2}]}]
    resource = expected.removeprefix("requests.")
    dev_data["tenants"] = [{"name": "t", "namespace": "t", "trust": "trusted", "priority": "batch",
                            "quota": {resource: 3}}]
    ct = cluster_tenancy(resolve(write_env(dev_data), PROFILES), "dev-metal", load_guardrails())
    assert by_kind(ct.objects, "ResourceQuota")["t/gpushare-gpu-quota"]["spec"]["hard"] == {expected: "3"}


def test_without_rename_quota_cannot_tell_shared_from_whole(dev_data: dict[str, Any], write_env: Any) -> None:
    dev_data["profiles"] = [{"name": "ts-plain", "kind": "time-slicing",
                             "time_slicing": {"replicas": 2, "rename_by_default": False}}]
    pool_named(dev_data, "l4-notebooks")["profile"] = "ts-plain"
    dev_data["tenants"] = [t for t in dev_data["tenants"] if t["name"] != "notebooks"]
    ct = cluster_tenancy(resolve(write_env(dev_data), PROFILES), "dev-metal", load_guardrails())
    groups = by_kind(ct.objects, "ClusterQueue")["tenant-research"]["spec"]["resourceGroups"]
    (gpu_group,) = [g for g in groups if g["coveredResources"] == ["nvidia.com/gpu"]]
    # whole H100s and time-sliced L4s share one name, so one resource group with two flavors
    assert [f["name"] for f in gpu_group["flavors"]] == ["h100-training", "l4-notebooks"]


def test_each_tenant_has_a_local_queue_in_the_cohort() -> None:
    fleet = resolve_env("pilot")
    for cluster, ct in fleet_tenancy(fleet, load_guardrails()).items():
        queues = by_kind(ct.objects, "ClusterQueue")
        local = by_kind(ct.objects, "LocalQueue")
        tenants = [t for t in fleet.tenants if cluster in t.clusters]
        assert len(local) == len(tenants)
        for t in tenants:
            lq = local[f"{t.namespace}/gpushare"]
            cq = queues[lq["spec"]["clusterQueue"]]
            assert cq["spec"]["cohortName"] == COHORT
            assert cq["spec"]["namespaceSelector"] == {"matchLabels": {"gpushare.io/tenant": t.name}}
            assert cq["spec"]["preemption"]["reclaimWithinCohort"] == "Any"


def test_flavors_cover_every_advertised_resource() -> None:
    fleet = resolve_env("prod")
    for cluster, ct in fleet_tenancy(fleet, load_guardrails()).items():
        advertised = {r for p in fleet.pools if p.cluster == cluster for r in p.totals.advertised}
        covered = {r for f in ct.flavors for r in f.resources}
        assert covered == advertised
        queues = by_kind(ct.objects, "ClusterQueue")
        for cq in queues.values():
            assert {r for g in cq["spec"]["resourceGroups"] for r in g["coveredResources"]} == advertised


def test_unassigned_capacity_is_lendable() -> None:
    ct = cluster_tenancy(resolve_env("pilot"), "pilot-metal", load_guardrails())
    spare = by_kind(ct.objects, "ClusterQueue")[SPARE_QUEUE]["spec"]
    assert "namespaceSelector" not in spare  # admits from no namespace; only lends
    nominal = {(f["name"], r["name"]): r["nominalQuota"] for g in spare["resourceGroups"] for f in g["flavors"]
               for r in f["resources"]}
    # 3g.40gb: a100-inference has 16, search takes 8 and assistant 4 there first (more isolated pools come first,
    # then catalog order); h100-llm-serving's 8 are all spare. 4g.40gb: search takes 4 of h100-llm-serving's 8.
    assert nominal[("a100-inference", "nvidia.com/mig-3g.40gb")] == 4
    assert nominal[("h100-llm-serving", "nvidia.com/mig-3g.40gb")] == 8
    assert nominal[("h100-llm-serving", "nvidia.com/mig-4g.40gb")] == 4
    assert nominal[("a100-inference", "nvidia.com/mig-1g.10gb")] == 16


def test_quotas_above_the_fleet_warn_with_totals(dev_data: dict[str, Any], write_env: Any) -> None:
    tenant_named(dev_data, "research")["quota"]["nvidia.com/gpu"] = 12
    ct = cluster_tenancy(resolve(write_env(dev_data), PROFILES), "dev-metal", load_guardrails())
    assert ct.warnings == [
        "cluster dev-metal: tenants are guaranteed 12 nvidia.com/gpu (research 12) but the pools advertise 8"]


def test_priority_classes() -> None:
    ct = cluster_tenancy(resolve_env("dev"), "dev-metal", load_guardrails())
    pcs = by_kind(ct.objects, "PriorityClass")
    assert pcs["gpushare-batch"]["preemptionPolicy"] == "Never"
    assert pcs["gpushare-online"]["preemptionPolicy"] == "PreemptLowerPriority"
    assert pcs["gpushare-online"]["value"] > pcs["gpushare-batch"]["value"]
    assert set(by_kind(ct.objects, "WorkloadPriorityClass")) == set(pcs)


# ---------------------------------------------------------------- isolation settings (frozen fixture)

SECURITY_FIXTURE = ROOT / "tests" / "security" / "tenants.yaml"


@pytest.fixture
def security_data() -> dict[str, Any]:
    return copy.deepcopy(yaml.safe_load(SECURITY_FIXTURE.read_text()))


def tenant_index(data: dict[str, Any], name: str) -> int:
    return next(i for i, t in enumerate(data["tenants"]) if t["name"] == name)


def refused(data: dict[str, Any], write_env: Any) -> list[Problem]:
    with pytest.raises(GpushareError) as caught:
        resolve(write_env(data), PROFILES)
    return caught.value.problems


@pytest.mark.parametrize("namespace", ["kube-system", "kube-public", "kube-anything", "default", "gpu-operator",
                                       "kueue-system", "monitoring"])
def test_system_namespaces_are_never_tenants(security_data: dict[str, Any], write_env: Any, namespace: str) -> None:
    i = tenant_index(security_data, "partner")
    security_data["tenants"][i]["namespace"] = namespace
    (problem,) = refused(security_data, write_env)
    assert problem.path == f"tenants[{i}].namespace" and namespace in problem.message
    assert problem.file is not None and problem.fix and "own namespace" in problem.fix


def test_untrusted_tenant_cannot_ask_for_baseline(security_data: dict[str, Any], write_env: Any) -> None:
    i = tenant_index(security_data, "partner")
    security_data["tenants"][i]["pod_security"] = "baseline"
    (problem,) = refused(security_data, write_env)
    assert problem.path == f"tenants[{i}]" and "baseline" in problem.message
    assert problem.fix and "restricted" in problem.fix


def test_privileged_pod_security_is_not_a_choice(security_data: dict[str, Any], write_env: Any) -> None:
    i = tenant_index(security_data, "serving")
    security_data["tenants"][i]["pod_security"] = "privileged"
    (problem,) = refused(security_data, write_env)
    assert problem.path == f"tenants[{i}].pod_security" and problem.fix and "restricted" in problem.fix


def test_pod_security_defaults_follow_trust(security_data: dict[str, Any], write_env: Any) -> None:
    levels = {t.name: t.pod_security for t in resolve(write_env(security_data), PROFILES).tenants}
    assert levels == {"serving": "baseline", "partner": "restricted", "lab": "restricted"}


@pytest.mark.parametrize(("version", "words"), [
    (None, "Field required"), ("1.29", "older than 1.30"), ("1.3", "pattern"), ("v1.33", "pattern"),
    ("1.33.1", "pattern"), (1.33, "string"),
])
def test_kubernetes_version_is_required_and_recent(security_data: dict[str, Any], write_env: Any,
                                                   version: Any, words: str) -> None:
    cluster = cluster_named(security_data, "sec-metal")
    if version is None:
        del cluster["kubernetes_version"]
    else:
        cluster["kubernetes_version"] = version
    (problem,) = refused(security_data, write_env)
    assert problem.path == "clusters[0].kubernetes_version"
    assert words in problem.message and problem.fix


def test_tenant_namespaces_never_carry_dra_admin_access(security_data: dict[str, Any], write_env: Any) -> None:
    ct = cluster_tenancy(resolve(write_env(security_data), PROFILES), "sec-metal", load_guardrails())
    for ns in by_kind(ct.objects, "Namespace").values():
        assert "resource.kubernetes.io/admin-access" not in ns["metadata"]["labels"]
        assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce-version"] == "v1.31"


# ---------------------------------------------------------------- Kueue admits tenant work (the rendered objects)

def limit_range_requests(objects: list[dict[str, Any]], namespace: str) -> dict[str, str]:
    """What a container without requests asks for in the namespace: the rendered LimitRange's defaultRequest."""
    (lr,) = [o for o in objects if o["kind"] == "LimitRange" and o["metadata"]["namespace"] == namespace]
    (limits,) = lr["spec"]["limits"]
    return dict(limits["defaultRequest"])


def kueue_refusal(cluster_queue: dict[str, Any], requests: dict[str, Any], resources: dict[str, Any]) -> str | None:
    """Why Kueue 0.19 would find no flavor for one pod's requests in this ClusterQueue, or None where one fits.
    As its flavor assigner does (quotaCheckStrategy BlockUndeclared, the default): requests matching
    excludeResourcePrefixes are dropped; every other resource must be covered by a resource group, and within a
    group one flavor must hold all of the group's requests within nominal quota plus borrowing limit."""
    excluded = resources.get("excludeResourcePrefixes", [])
    counted = {r: q for r, q in requests.items() if not any(r.startswith(p) for p in excluded)}
    groups = cluster_queue["spec"]["resourceGroups"]
    for r in counted:
        if not any(r in g["coveredResources"] for g in groups):
            return f"resource {r} unavailable in ClusterQueue"
    for g in groups:
        wanted = {r: q for r, q in counted.items() if r in g["coveredResources"]}
        if not wanted:
            continue
        fits = [f["name"] for f in g["flavors"] if all(e["nominalQuota"] + e["borrowingLimit"] >= wanted[e["name"]]
                                                        for e in f["resources"] if e["name"] in wanted)]
        if not fits:
            return f"insufficient quota for {', '.join(sorted(wanted))}"
    return None


def shipped_kueue_resources(fleet: Any, cluster: str) -> dict[str, Any]:
    """The `resources` of the Kueue Configuration the Pulumi program installs with this cluster's queues."""
    from gpushare.program.components.tenancy import kueue_values

    values = kueue_values(fleet, fleet.clusters[cluster])
    config = yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])
    resources = config.get("resources", {})
    assert isinstance(resources, dict)
    return resources


def tenant_gpu_pods(ct: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """Per tenant and GPU resource it may use: one pod's requests, a GPU plus its namespace's host defaults."""
    out = []
    for share in ct.shares:
        defaults = limit_range_requests(ct.objects, share.tenant.namespace)
        for r in sorted(r for r in share.nominal if share.nominal[r] or share.borrowable.get(r)):
            out.append((share.tenant.name, r, {**defaults, r: 1}))
    return out


ENVS_AND_FIXTURE = [("dev", None), ("pilot", None), ("prod", None), ("fixture", SECURITY_FIXTURE)]


@pytest.mark.parametrize(("env", "path"), ENVS_AND_FIXTURE, ids=[e for e, _ in ENVS_AND_FIXTURE])
def test_kueue_admits_every_tenants_gpu_work(env: str, path: Any) -> None:
    """Every tenant pod asks for cpu and memory (LimitRange defaults), which the GPU-only queues do not cover: the
    Kueue Configuration gpushare installs leaves them out, so each GPU a tenant may use finds a flavor."""
    fleet = resolve(path, PROFILES) if path else resolve_env(env)
    checked = 0
    for cluster, ct in fleet_tenancy(fleet, load_guardrails()).items():
        resources = shipped_kueue_resources(fleet, cluster)
        assert resources == ct.kueue_resources
        queues = by_kind(ct.objects, "ClusterQueue")
        for tenant, gpu, requests in tenant_gpu_pods(ct):
            assert {"cpu", "memory"} <= set(requests)
            assert kueue_refusal(queues[f"tenant-{tenant}"], requests, resources) is None, (cluster, tenant, gpu)
            checked += 1
    assert checked


def test_without_the_exclusion_kueue_admits_no_tenant_work() -> None:
    """The chart's own Configuration (no resources block): what stopped tenancy working."""
    from gpushare.program.components.tenancy import kueue_chart_defaults

    chart = yaml.safe_load(kueue_chart_defaults()["managerConfig"]["controllerManagerConfigYaml"])
    ct = cluster_tenancy(resolve_env("dev"), "dev-metal", load_guardrails())
    queues = by_kind(ct.objects, "ClusterQueue")
    pods = tenant_gpu_pods(ct)
    assert pods
    for tenant, _, requests in pods:
        refusal = kueue_refusal(queues[f"tenant-{tenant}"], requests, chart.get("resources", {}))
        assert refusal is not None and refusal.startswith("resource cpu unavailable")


def test_kueue_still_counts_what_is_not_a_host_resource() -> None:
    """Only host resources are left out: a CPU-only pod counts nothing and is admitted at once, a GPU beyond the
    tenant's quota or a resource no queue covers is still refused (never admitted unaccounted)."""
    ct = cluster_tenancy(resolve_env("dev"), "dev-metal", load_guardrails())
    queue = by_kind(ct.objects, "ClusterQueue")["tenant-search"]
    defaults = limit_range_requests(ct.objects, "search-inference")
    host = {**defaults, "ephemeral-storage": "1Gi", "hugepages-2Mi": "64Mi"}
    assert kueue_refusal(queue, host, ct.kueue_resources) is None
    assert kueue_refusal(queue, {**defaults, "example.com/fpga": 1}, ct.kueue_resources) == (
        "resource example.com/fpga unavailable in ClusterQueue")
    assert kueue_refusal(queue, {**defaults, "nvidia.com/mig-3g.40gb": 99}, ct.kueue_resources) == (
        "insufficient quota for nvidia.com/mig-3g.40gb")


# ---------------------------------------------------------------- tenant RBAC (issue 39, item 12)

def _allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    """What the RBAC authorizer decides for a namespaced request under these rules (no resourceNames in them)."""
    return any((group in r["apiGroups"] or "*" in r["apiGroups"]) and (resource in r["resources"] or
               "*" in r["resources"]) and (verb in r["verbs"] or "*" in r["verbs"]) for r in rules)


WRITES = ("create", "update", "patch", "delete", "deletecollection")
# What stops a tenant only because no role of its grants the verb: Kueue's objects, its quotas and host limits,
# binding pods past the scheduler and gates, writing their status, other identities, tokens, DaemonSets and
# PodDisruptionBudgets (a DaemonSet lands a pod on every node it tolerates, a PDB can hold a node's drain).
NEVER = [
    *[("kueue.x-k8s.io", res, verb) for res in ("workloads", "localqueues") for verb in WRITES],
    *[("kueue.x-k8s.io", res, verb) for res in ("workloads/status", "localqueues/status")
      for verb in ("update", "patch")],
    *[("", res, verb) for res in ("resourcequotas", "limitranges") for verb in WRITES],
    *[("", res, verb) for res in ("resourcequotas/status", "pods/status", "pods/ephemeralcontainers",
                                  "namespaces", "namespaces/status", "namespaces/finalize")
      for verb in ("update", "patch")],
    ("", "pods/binding", "create"), ("", "bindings", "create"), ("", "serviceaccounts/token", "create"),
    *[(group, res, "impersonate") for group, res in (("", "users"), ("", "groups"), ("", "serviceaccounts"),
                                                     ("authentication.k8s.io", "userextras"),
                                                     ("authentication.k8s.io", "uids"))],
    ("apps", "daemonsets", "create"), ("policy", "poddisruptionbudgets", "create"),
    ("resource.k8s.io", "resourceclaimtemplates", "update"), ("resource.k8s.io", "resourceclaims", "create"),
    ("batch", "jobs/status", "update"), ("apps", "deployments/status", "update"),
    ("events.k8s.io", "events", "create"),
]
EVERYDAY = [
    *[(group, res, verb) for group, res in (("", "pods"), ("apps", "deployments"), ("apps", "statefulsets"),
                                            ("batch", "jobs"), ("batch", "cronjobs"), ("", "configmaps"),
                                            ("", "secrets"), ("", "services"), ("", "persistentvolumeclaims"))
      for verb in ("create", "get", "list", "watch", "update", "patch", "delete")],
    ("", "pods/log", "get"), ("", "pods/exec", "create"), ("apps", "deployments/scale", "patch"),
    *[("kueue.x-k8s.io", res, verb) for res in ("localqueues", "workloads") for verb in ("get", "list", "watch")],
    *[("", res, verb) for res in ("resourcequotas", "limitranges", "events") for verb in ("get", "list")],
    ("", "namespaces", "get"), ("resource.k8s.io", "resourceclaimtemplates", "get"),
]


def test_tenant_roles_grant_everyday_work_and_none_of_what_only_rbac_withholds() -> None:
    from gpushare.core.tenancy import ADMIN_ROLE, DEVELOPER_ROLE, tenant_roles

    roles = {r["metadata"]["name"]: r["rules"] for r in tenant_roles()}
    assert set(roles) == {DEVELOPER_ROLE, ADMIN_ROLE}
    for name, rules in roles.items():
        # no wildcard anywhere, and none of the verbs that reach past the namespace's own objects
        assert not any("*" in r[k] for r in rules for k in ("apiGroups", "resources", "verbs")), name
        assert not {"bind", "escalate", "impersonate", "approve", "sign"} & {v for r in rules for v in r["verbs"]}
        assert not any("resourceNames" in r or "nonResourceURLs" in r for r in rules), name
        granted = [(g, res, v) for g, res, v in NEVER if _allows(rules, g, res, v)]
        assert not granted, (name, granted)
        missing = [(g, res, v) for g, res, v in EVERYDAY if not _allows(rules, g, res, v)]
        assert not missing, (name, missing)
    # The admin manages who may do what in the namespace and its identities; a developer does not.
    for group, res, verb in (("rbac.authorization.k8s.io", "rolebindings", "create"),
                             ("rbac.authorization.k8s.io", "roles", "create"), ("", "serviceaccounts", "create"),
                             ("networking.k8s.io", "networkpolicies", "create")):
        assert _allows(roles[ADMIN_ROLE], group, res, verb) and not _allows(roles[DEVELOPER_ROLE], group, res, verb)
    # Everything the developer may do, the admin may too: so an admin can bind the developer role to others.
    assert all(rule in roles[ADMIN_ROLE] for rule in roles[DEVELOPER_ROLE])


def test_tenants_naming_their_people_get_role_bindings_in_their_namespace(dev_data: dict[str, Any],
                                                                           write_env: Any) -> None:
    tenant_named(dev_data, "search").update(developers=["search-devs", "user:alice@example.com"],
                                            admins=["oidc:search-leads"])
    tenant_named(dev_data, "partner-eval")["developers"] = ["partner-eval-devs"]
    ct = cluster_tenancy(resolve(write_env(dev_data), PROFILES), "dev-metal", load_guardrails())
    roles = by_kind(ct.objects, "ClusterRole")
    assert set(roles) == {"gpushare-tenant-developer", "gpushare-tenant-admin"}
    bindings = by_kind(ct.objects, "RoleBinding")
    # Only tenants that name people get bindings, one per role they name people for.
    assert set(bindings) == {"search-inference/gpushare-developers", "search-inference/gpushare-admins",
                             "partner-eval/gpushare-developers"}
    group = "rbac.authorization.k8s.io"
    assert bindings["search-inference/gpushare-developers"]["subjects"] == [
        {"apiGroup": group, "kind": "Group", "name": "search-devs"},
        {"apiGroup": group, "kind": "User", "name": "alice@example.com"}]
    assert bindings["search-inference/gpushare-developers"]["roleRef"] == {
        "apiGroup": group, "kind": "ClusterRole", "name": "gpushare-tenant-developer"}
    assert bindings["search-inference/gpushare-admins"]["roleRef"]["name"] == "gpushare-tenant-admin"
    assert bindings["search-inference/gpushare-admins"]["subjects"] == [
        {"apiGroup": group, "kind": "Group", "name": "oidc:search-leads"}]
    for obj in [*roles.values(), *bindings.values()]:
        validate(obj)
        assert obj["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpushare"}


@pytest.mark.parametrize("subject", ["system:authenticated", "system:serviceaccounts", "system:masters",
                                     "system:serviceaccounts:search-inference", "user:system:admin", "user:",
                                     "team{{ x }}", "a$(id)", "`id`", ""])
def test_a_tenants_people_are_never_kubernetes_own_identities(dev_data: dict[str, Any], write_env: Any,
                                                              subject: str) -> None:
    tenant_named(dev_data, "search")["developers"] = ["search-devs", subject]
    path = write_env(dev_data)
    with pytest.raises(GpushareError) as err:
        resolve(path, PROFILES)
    (problem,) = err.value.problems
    assert problem.file == str(path) and problem.line and problem.fix, problem
    assert problem.path == "tenants[0].developers[1]", problem


def test_a_tenant_in_no_cluster_is_refused(dev_data: dict[str, Any], write_env: Any) -> None:
    tenant_named(dev_data, "research")["clusters"] = []
    with pytest.raises(GpushareError, match="puts the tenant in no cluster") as err:
        resolve(write_env(dev_data), PROFILES)
    assert err.value.problems[0].path == "tenants[1].clusters" and err.value.problems[0].fix
