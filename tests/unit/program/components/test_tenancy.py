"""The Tenancy component under the Pulumi mock engine: Kueue pinned with metrics, every tenancy and admission
object registered one by one per cluster, queues after Kueue and their namespaces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.errors import GpushareError
from gpushare.core.resolve import resolve_env
from gpushare.core.tenancy import ADMIN_RULES, DEVELOPER_RULES, KUEUE_EXCLUDED_PREFIXES
from gpushare.ops.preview import collect_plan
from gpushare.policy.admission import DATA_POLICIES, JOBSETS_POLICY, NAMESPACE_POLICIES, POLICIES
from gpushare.program.components.tenancy import KUEUE_VERSION, check_kueue_values, kueue_chart_defaults
from tests.conftest import ROOT
from tests.unit.program.helpers import by_name, dev_config, plan_of, shipped


def test_kueue_is_pinned_with_metrics_on() -> None:
    plan = shipped("dev")
    (kueue,) = [r for r in plan.of_type("helm.sh/v3:Release") if r.inputs["chart"].endswith("/kueue")]
    assert kueue.inputs["version"] == KUEUE_VERSION == "0.19.2"
    values = kueue.inputs["values"]
    assert values["enablePrometheus"] is True and set(values) == {"enablePrometheus", "managerConfig"}
    # Pending work per ClusterQueue and resource: the recording rules attribute demand to pools with it.
    config = yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])
    defaults = yaml.safe_load(kueue_chart_defaults()["managerConfig"]["controllerManagerConfigYaml"])
    assert config["metrics"] == {**defaults["metrics"], "enableClusterQueueResources": True}
    # GPU-only queues: Kueue leaves the host resources every tenant pod asks for out of quota (docs/tenancy.md)
    assert config["resources"] == {"excludeResourcePrefixes": list(KUEUE_EXCLUDED_PREFIXES)}
    assert {k: v for k, v in config.items() if k not in ("metrics", "resources")} == {
        k: v for k, v in defaults.items() if k != "metrics"}  # nothing else of the chart's configuration changes
    for queue in plan.of_type("kueue.x-k8s.io/v1beta2:ClusterQueue"):
        assert kueue.urn in queue.dependencies


def test_existing_kueue_is_not_installed_again() -> None:
    plan = collect_plan("dev", dev_config(kueue={"mode": "existing"}))
    assert not [r for r in plan.of_type("helm.sh/v3:Release") if r.inputs["chart"].endswith("/kueue")]
    assert plan.of_type("kueue.x-k8s.io/v1beta2:LocalQueue")
    # gpushare cannot configure a Kueue it did not install: it says what that Kueue needs to admit tenant work
    assert any("excludeResourcePrefixes" in w and "'cpu', 'memory'" in w for w in plan.warnings)


def test_unknown_kueue_value_is_refused() -> None:
    assert check_kueue_values({"enablePrometheus": True}) == []
    (problem,) = check_kueue_values({"enablePrometeus": True})
    assert "enablePrometeus" in problem.message and problem.fix


def test_unknown_kueue_stack_setting_is_an_error() -> None:
    with pytest.raises(GpushareError, match="kueue"):
        collect_plan("dev", dev_config(kueue={"mode": "maybe"}))


@pytest.mark.parametrize("env", ["dev", "pilot", "prod"])
def test_every_tenant_gets_its_objects_in_each_cluster(env: str) -> None:
    plan = shipped(env)
    fleet = resolve_env(env)
    gpu_clusters = {p.cluster for p in fleet.pools}
    namespaces = {(plan.cluster_of(r), r.inputs["metadata"]["name"]) for r in plan.of_type("core/v1:Namespace")}
    quotas = {(plan.cluster_of(r), r.inputs["metadata"]["namespace"]) for r in plan.of_type(":ResourceQuota")}
    queues = {(plan.cluster_of(r), r.inputs["metadata"]["namespace"]) for r in plan.of_type(":LocalQueue")}
    for t in fleet.tenants:
        for cluster in set(t.clusters) & gpu_clusters:
            assert (cluster, t.namespace) in namespaces
            assert (cluster, t.namespace) in quotas
            assert (cluster, t.namespace) in queues


def test_namespaced_objects_wait_for_their_namespace() -> None:
    plan = shipped("dev")
    ns = {r.inputs["metadata"]["name"]: r.urn for r in plan.of_type("core/v1:Namespace")}
    for suffix in (":ResourceQuota", ":LimitRange", ":LocalQueue"):
        for r in plan.of_type(suffix):
            assert ns[r.inputs["metadata"]["namespace"]] in r.dependencies


def test_admission_policies_in_every_cluster() -> None:
    plan = shipped("pilot")
    for cluster in ("pilot-metal", "pilot-gke"):
        policies = {r.inputs["metadata"]["name"] for r in plan.of_type(":ValidatingAdmissionPolicy")
                    if plan.cluster_of(r) == cluster}
        bindings = {r.inputs["metadata"]["name"] for r in plan.of_type(":ValidatingAdmissionPolicyBinding")
                    if plan.cluster_of(r) == cluster}
        assert policies == {b.inputs["spec"]["policyName"] for b in plan.of_type(":ValidatingAdmissionPolicyBinding")
                            if plan.cluster_of(b) == cluster} == {*POLICIES, *DATA_POLICIES, *NAMESPACE_POLICIES,
                                                                  JOBSETS_POLICY}
        assert "gpushare-no-visible-devices-env-trusted" in bindings  # the trusted tenants' Warn binding


SECURITY_FIXTURE = ROOT / "tests" / "security" / "tenants.yaml"
MONITORING = {"gpushare:monitoring": {"mode": "existing", "release": "kps", "namespace": "observability"}}


def test_tenant_namespaces_carry_pod_security_at_the_cluster_minor() -> None:
    plan = plan_of(SECURITY_FIXTURE, MONITORING)
    labels = {r.inputs["metadata"]["name"]: r.inputs["metadata"]["labels"] for r in plan.of_type("core/v1:Namespace")
              if "gpushare.io/tenant" in r.inputs["metadata"].get("labels", {})}
    levels = {ns: (lab["pod-security.kubernetes.io/enforce"], lab["pod-security.kubernetes.io/enforce-version"])
              for ns, lab in labels.items()}
    assert levels == {"partner": ("restricted", "v1.31"), "serving": ("baseline", "v1.31"),
                      "lab": ("restricted", "v1.31")}
    assert not any("resource.kubernetes.io/admin-access" in lab for lab in labels.values())


def test_bindings_skip_the_namespaces_the_stack_deploys_into() -> None:
    plan = plan_of(SECURITY_FIXTURE, {**MONITORING, "gpushare:kueue": {"mode": "existing", "namespace": "queues"}})
    for b in plan.of_type(":ValidatingAdmissionPolicyBinding"):
        selector = b.inputs["spec"].get("matchResources", {}).get("namespaceSelector")
        if selector is None:
            continue
        (excluded,) = [e["values"] for e in selector["matchExpressions"] if e["key"] == "kubernetes.io/metadata.name"]
        assert {"observability", "queues", "gpu-operator", "kube-system", "default"} <= set(excluded)


def test_deployer_identity_comes_from_stack_config() -> None:
    plan = plan_of(SECURITY_FIXTURE, {**MONITORING, "gpushare:deployer": {"users": ["ci-deployer"], "groups": []}})
    (policy,) = [r for r in plan.of_type(":ValidatingAdmissionPolicy")
                 if r.inputs["metadata"]["name"] == "gpushare-tenant-namespace-labels"]
    (condition,) = [c for c in policy.inputs["spec"]["matchConditions"] if c["name"] == "not-gpushare-deployer"]
    assert "'ci-deployer'" in condition["expression"] and "system:masters" not in condition["expression"]
    default = plan_of(SECURITY_FIXTURE, MONITORING)
    (policy,) = [r for r in default.of_type(":ValidatingAdmissionPolicy")
                 if r.inputs["metadata"]["name"] == "gpushare-tenant-namespace-labels"]
    assert any("'system:masters'" in c["expression"] for c in policy.inputs["spec"]["matchConditions"])


def test_jobset_controller_identity_comes_from_stack_config() -> None:
    """The one identity whose unlabelled Jobs of a JobSet the queue policy admits: gpushare:jobset, or per cluster."""
    def job_set_job(plan: Any) -> str:
        (policy,) = [r for r in plan.of_type(":ValidatingAdmissionPolicy")
                     if r.inputs["metadata"]["name"] == "gpushare-gpu-pods-queued"]
        (variable,) = [v for v in policy.inputs["spec"]["variables"] if v["name"] == "jobSetJob"]
        return str(variable["expression"])
    custom = plan_of(SECURITY_FIXTURE, {**MONITORING, "gpushare:jobset": {"namespace": "batch",
                                                                          "serviceAccount": "jobset-ctl"}})
    assert "'system:serviceaccount:batch:jobset-ctl'" in job_set_job(custom)
    default = job_set_job(plan_of(SECURITY_FIXTURE, MONITORING))
    assert "'system:serviceaccount:jobset-system:jobset-controller-manager'" in default


@pytest.mark.parametrize(("config", "namespace"), [
    ({"gpushare:monitoring": {"mode": "existing", "release": "kps", "namespace": "lab"}}, "lab"),
    ({**MONITORING, "gpushare:kueue": {"mode": "install", "namespace": "partner"}}, "partner"),
])
def test_a_tenant_in_a_namespace_the_stack_deploys_into_is_refused(config: dict[str, Any], namespace: str) -> None:
    with pytest.raises(GpushareError) as caught:
        plan_of(SECURITY_FIXTURE, config)
    (problem,) = [p for p in caught.value.problems if namespace in p.message]
    assert problem.path is not None and problem.path.endswith(".namespace")
    assert problem.file is not None and problem.file.endswith("tenants.yaml") and problem.fix


def test_workload_priority_classes_carry_their_value() -> None:
    classes = by_name(shipped("dev"), "kueue.x-k8s.io/v1beta2:WorkloadPriorityClass")
    values = {r.inputs["metadata"]["name"]: r.inputs["value"] for r in classes.values()}
    assert values["gpushare-online"] > values["gpushare-batch"]


def test_admission_follows_the_clusters_pools_and_kueue() -> None:
    """The program hands admission the cluster's pool taints and the stack's Kueue identity: Kueue may lift its own
    gate, and untrusted tenants may tolerate their own pools' taints only."""
    kueue = {"mode": "existing", "namespace": "queues", "serviceAccount": "kq-manager"}
    plan = plan_of(SECURITY_FIXTURE, {**MONITORING, "gpushare:kueue": kueue})
    specs = {r.inputs["metadata"]["name"]: r.inputs["spec"] for r in plan.of_type(":ValidatingAdmissionPolicy")}
    queued = " ".join(v["expression"] for v in specs["gpushare-gpu-pods-queued"]["validations"])
    assert "'system:serviceaccount:queues:kq-manager'" in queued and "kueue-system" not in queued
    pools = specs["gpushare-untrusted-pool-tolerations"]["validations"][0]["expression"]
    assert "'partner/gpushare.io/pool=a100-mig:NoSchedule'" in pools
    assert "'partner/gpushare.io/pool=l40s-shared:NoSchedule'" not in pools
    assert "'value': 'l40s-shared'" in pools


def test_tenant_roles_and_their_bindings_are_registered_after_namespace_and_role(tmp_path: Path) -> None:
    """Every cluster gets the two tenant ClusterRoles; a tenant that names its people gets a RoleBinding per role in
    its namespace, created after the namespace and the role it grants."""
    data = yaml.safe_load(SECURITY_FIXTURE.read_text())
    tenants = {t["name"]: t for t in data["tenants"]}
    tenants["partner"].update(developers=["partner-devs", "user:eve@example.com"], admins=["partner-leads"])
    env = tmp_path / "environments" / "tenants.yaml"
    env.parent.mkdir()
    env.write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "profiles").symlink_to(ROOT / "tests" / "fixtures" / "profiles")
    plan = plan_of(env, MONITORING)
    roles = {r.inputs["metadata"]["name"]: r for r in plan.of_type("rbac.authorization.k8s.io/v1:ClusterRole")}
    assert set(roles) == {"gpushare-tenant-developer", "gpushare-tenant-admin"}
    assert roles["gpushare-tenant-developer"].inputs["rules"] == DEVELOPER_RULES
    assert roles["gpushare-tenant-admin"].inputs["rules"] == ADMIN_RULES
    namespaces = {r.inputs["metadata"]["name"]: r.urn for r in plan.of_type("core/v1:Namespace")}
    bindings = {(r.inputs["metadata"]["namespace"], r.inputs["metadata"]["name"]): r
                for r in plan.of_type("rbac.authorization.k8s.io/v1:RoleBinding")}
    assert set(bindings) == {("partner", "gpushare-developers"), ("partner", "gpushare-admins")}
    for (ns, name), binding in bindings.items():
        role = binding.inputs["roleRef"]["name"]
        assert role == ("gpushare-tenant-developer" if name == "gpushare-developers" else "gpushare-tenant-admin")
        assert {namespaces[ns], roles[role].urn} <= set(binding.dependencies), name
    assert bindings[("partner", "gpushare-developers")].inputs["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "partner-devs"},
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "eve@example.com"}]
