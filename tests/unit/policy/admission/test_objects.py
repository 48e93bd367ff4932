"""The admission objects themselves: valid against Kubernetes' schemas, matching every path to a pod spec, bound
to tenant namespaces only (never system ones), and tenant namespace labels with Pod Security. What the policies
decide is the attack suite's subject (tests/security/); whether a real API server admits or denies is only
provable on a cluster."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest

from gpushare.core.namespaces import tenant_namespace_labels
from gpushare.core.spec import SYSTEM_NAMESPACES
from gpushare.policy.admission import (
    DATA_POLICIES,
    JOBSETS_POLICY,
    NAMESPACE_POLICIES,
    POLICIES,
    Deployer,
    DraClaims,
    PoolTaints,
    admission_objects,
)
from tests.security.cel_admission import evaluate


def of_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


@pytest.mark.parametrize("version", ["1.31", "1.33"])
def test_objects_pass_kubernetes_schema(version: str) -> None:
    objects = admission_objects(Deployer(users=("ci",), groups=("platform",)), ("kueue",))
    assert set(of_kind(objects, "ValidatingAdmissionPolicy")) == {*POLICIES, *DATA_POLICIES, *NAMESPACE_POLICIES,
                                                                  JOBSETS_POLICY}
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)
    labels = tenant_namespace_labels("t", "untrusted", "batch", "restricted", "1.33")
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "Namespace",
                                  "metadata": {"name": "t", "labels": labels}}, version, strict=True)


def test_workload_policies_match_every_path_to_a_pod_spec() -> None:
    for name, policy in of_kind(admission_objects(), "ValidatingAdmissionPolicy").items():
        if name in NAMESPACE_POLICIES or name in DATA_POLICIES or name == JOBSETS_POLICY:
            continue
        rules = {(g, r, op) for rule in policy["spec"]["matchConstraints"]["resourceRules"]
                 for g in rule["apiGroups"] for r in rule["resources"] for op in rule["operations"]}
        assert {("", "pods", "CREATE"), ("", "pods", "UPDATE"), ("", "pods/ephemeralcontainers", "UPDATE")} <= rules
        for group, resource in [("apps", "deployments"), ("apps", "statefulsets"), ("apps", "daemonsets"),
                                ("apps", "replicasets"), ("batch", "jobs"), ("batch", "cronjobs")]:
            assert {(group, resource, "CREATE"), (group, resource, "UPDATE")} <= rules, resource
        names = [v["name"] for v in policy["spec"]["variables"]]
        assert "podSpec" in names and "untrusted" in names


def test_bindings_select_tenant_namespaces_but_never_system_ones() -> None:
    objects = admission_objects(system_namespaces=("kueue", "observability"))
    for b in of_kind(objects, "ValidatingAdmissionPolicyBinding").values():
        if b["spec"]["policyName"] in NAMESPACE_POLICIES:
            # a Namespace's own new labels decide a namespaceSelector: these select by match condition instead
            assert "matchResources" not in b["spec"]
            continue
        expressions = b["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
        assert {"key": "gpushare.io/tenant", "operator": "Exists"} in expressions
        (excluded,) = [e["values"] for e in expressions if e["key"] == "kubernetes.io/metadata.name"]
        assert {*SYSTEM_NAMESPACES, "kueue", "observability"} <= set(excluded)
        assert {"kube-system", "kube-public", "kube-node-lease", "default", "gpu-operator", "kueue-system",
                "monitoring"} <= set(excluded)


def test_visible_devices_denies_untrusted_and_warns_trusted() -> None:
    bindings = of_kind(admission_objects(), "ValidatingAdmissionPolicyBinding")
    deny = bindings["gpushare-no-visible-devices-env"]["spec"]
    warn = bindings["gpushare-no-visible-devices-env-trusted"]["spec"]
    assert deny["validationActions"] == ["Deny"] and warn["validationActions"] == ["Warn", "Audit"]
    assert {"key": "gpushare.io/trust", "operator": "NotIn", "values": ["trusted"]} in \
        deny["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert {"key": "gpushare.io/trust", "operator": "In", "values": ["trusted"]} in \
        warn["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert bindings["gpushare-untrusted-env-from"]["spec"]["validationActions"] == ["Warn", "Audit"]
    assert bindings["gpushare-untrusted-no-shared-gpus"]["spec"]["validationActions"] == ["Deny"]


@pytest.mark.parametrize(("label", "untrusted"), [
    ("trusted", False), ("untrusted", True), ("Untrusted", True), ("TRUSTED", True), ("", True),
    ("trusted ", True), (None, True),
])
def test_only_exactly_trusted_is_trusted(label: str | None, untrusted: bool) -> None:
    (variable,) = [v for v in admission_objects()[0]["spec"]["variables"] if v["name"] == "untrusted"]
    labels = {"gpushare.io/tenant": "t"} if label is None else {"gpushare.io/tenant": "t", "gpushare.io/trust": label}
    namespace = {"metadata": {"name": "t", "labels": labels}}
    assert evaluate([variable["expression"]], [], {"namespaceObject": namespace}) == [untrusted]


def test_namespace_labels_carry_pod_security_at_the_cluster_minor() -> None:
    labels = tenant_namespace_labels("t", "trusted", "online", "baseline", "1.31")
    assert labels == {
        "gpushare.io/tenant": "t", "gpushare.io/trust": "trusted", "gpushare.io/priority": "online",
        "pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/enforce-version": "v1.31",
        "pod-security.kubernetes.io/audit": "baseline", "pod-security.kubernetes.io/audit-version": "v1.31",
        "pod-security.kubernetes.io/warn": "baseline", "pod-security.kubernetes.io/warn-version": "v1.31",
    }


# A fix: after the reason, what to do instead (an imperative after a colon, semicolon or full stop).
FIX = re.compile(r"[:;.] (use|request|remove|set|label|leave|list|tolerate|rename|create|change|reference|prefer|"
                 r"run)\b", re.IGNORECASE)


def test_every_denial_says_how_to_fix_it() -> None:
    every = admission_objects(pools=PoolTaints(taints=(("k", "v", "NoSchedule"),))) + admission_objects(
        dra=DraClaims(templates={"t": ("gpushare-x",)}, isolated=("gpushare-x",)))
    messages = {v["message"] for o in every if o["kind"] == "ValidatingAdmissionPolicy"
                for v in o["spec"]["validations"]}
    assert len(messages) > 30
    assert [m for m in messages if not FIX.search(m)] == []
    assert not FIX.search("privileged containers are not allowed in tenant namespaces")  # the check can fail


def test_pool_taints_are_literals_gpushare_wrote() -> None:
    """Taints come from the environment file (label syntax): anything that could break out of a CEL string is
    refused rather than quoted."""
    with pytest.raises(ValueError, match="CEL literal"):
        admission_objects(pools=PoolTaints(taints=(("gpushare.io/pool", "a' || true || '", "NoSchedule"),)))
