"""The Tenancy component under the Pulumi mock engine: Kueue pinned with metrics, every tenancy and admission
object registered one by one per cluster, queues after Kueue and their namespaces."""

from __future__ import annotations

import pytest

from gpushare.admission import POLICIES
from gpushare.errors import GpushareError
from gpushare.preview import collect_plan
from gpushare.resolve import resolve_env
from infra.components.tenancy import KUEUE_VERSION, check_kueue_values
from tests.test_infra_components import by_name, dev_config, shipped


def test_kueue_is_pinned_with_metrics_on() -> None:
    plan = shipped("dev")
    (kueue,) = [r for r in plan.of_type("helm.sh/v3:Release") if r.inputs["chart"].endswith("/kueue")]
    assert kueue.inputs["version"] == KUEUE_VERSION == "0.19.2"
    assert kueue.inputs["values"] == {"enablePrometheus": True}
    for queue in plan.of_type("kueue.x-k8s.io/v1beta2:ClusterQueue"):
        assert kueue.urn in queue.dependencies


def test_existing_kueue_is_not_installed_again() -> None:
    plan = collect_plan("dev", dev_config(kueue={"mode": "existing"}))
    assert not [r for r in plan.of_type("helm.sh/v3:Release") if r.inputs["chart"].endswith("/kueue")]
    assert plan.of_type("kueue.x-k8s.io/v1beta2:LocalQueue")


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
        assert policies == bindings == set(POLICIES)


def test_workload_priority_classes_carry_their_value() -> None:
    classes = by_name(shipped("dev"), "kueue.x-k8s.io/v1beta2:WorkloadPriorityClass")
    values = {r.inputs["metadata"]["name"]: r.inputs["value"] for r in classes.values()}
    assert values["gpushare-online"] > values["gpushare-batch"]
