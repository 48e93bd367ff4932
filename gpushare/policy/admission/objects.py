"""The ValidatingAdmissionPolicy and binding objects: every policy set matched, bound and staged per cluster."""

from __future__ import annotations

from typing import Any

from gpushare.core.namespaces import TENANT_LABEL, TRUST_LABEL, TRUSTED
from gpushare.core.spec import SYSTEM_NAMESPACES
from gpushare.policy.admission.cel import ALL_TENANTS, TRUSTED_ONLY, UNTRUSTED_ONLY, WORKLOAD_VARIABLES
from gpushare.policy.admission.cluster import MANAGED, Deployer, DraClaims, PoolTaints, kueue_user
from gpushare.policy.admission.data import DATA_POLICIES, _data_variables
from gpushare.policy.admission.dra import (
    _NO_CLAIMS_POLICY,
    DRA_CLAIMS_POLICY,
    _dra_claims_policy,
    dra_workload_policies,
)
from gpushare.policy.admission.namespaces import (
    _NAMESPACE_RULES,
    _TENANT_NAMESPACE_CONDITION,
    NAMESPACE_POLICIES,
    NAMESPACE_VARIABLES,
    _deployer_condition,
)
from gpushare.policy.admission.priority import _priority_policy
from gpushare.policy.admission.queues import JOBSET_RULES, JOBSETS_POLICY, _queue_policy, jobsets_policy
from gpushare.policy.admission.scheduling import _pool_toleration_policy
from gpushare.policy.admission.workload import POLICIES

_WORKLOAD_RULES = [
    {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE", "UPDATE"]},
    # `kubectl debug` adds containers through this subresource: a privileged one would otherwise pass unseen.
    {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/ephemeralcontainers"], "operations": ["UPDATE"]},
    {"apiGroups": ["apps"], "apiVersions": ["v1"],
     "resources": ["deployments", "statefulsets", "daemonsets", "replicasets"], "operations": ["CREATE", "UPDATE"]},
    {"apiGroups": ["batch"], "apiVersions": ["v1"], "resources": ["jobs", "cronjobs"],
     "operations": ["CREATE", "UPDATE"]},
]


def _trust_selector(trust: str) -> list[dict[str, Any]]:
    if trust == UNTRUSTED_ONLY:
        return [{"key": TRUST_LABEL, "operator": "NotIn", "values": [TRUSTED]}]
    if trust == TRUSTED_ONLY:
        return [{"key": TRUST_LABEL, "operator": "In", "values": [TRUSTED]}]
    return []


def _policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name, "labels": dict(MANAGED)}, "spec": spec}


def staged_actions(actions: list[str], enforcement: str) -> list[str]:
    """A binding's validationActions under an environment's admission stage: `warn` (an adopted cluster's first
    step) turns Deny into Warn and Audit, so running work is admitted and each would-be denial is seen by the client
    and recorded in the audit log; `deny` keeps them."""
    if enforcement == "deny" or "Deny" not in actions:
        return list(actions)
    return ["Warn", "Audit"]


def _bound(name: str, policy: str, actions: list[str], match: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"policyName": policy, "validationActions": actions}
    if match is not None:
        spec["matchResources"] = match
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name, "labels": dict(MANAGED)}, "spec": spec}


def excluded_namespaces(extra: tuple[str, ...] = ()) -> list[str]:
    """Namespaces no binding selects, whatever labels they carry: the system ones and those gpushare deploys into."""
    return sorted({*SYSTEM_NAMESPACES, *extra})


def workload_policies(dra: DraClaims | None = None, pools: PoolTaints | None = None,
                      kueue: str | None = None, priority_classes: dict[str, str] | None = None,
                      jobset: str | None = None) -> dict[str, dict[str, Any]]:
    """The workload policies of a cluster: device-plugin clusters refuse every claim, DRA clusters judge them; the
    pool tolerations follow the cluster's pools, the queue policy names the cluster's Kueue, the priority policy
    the PriorityClasses tenants use."""
    out = dict(POLICIES)
    if priority_classes is not None:
        out["gpushare-tenant-priority-class"] = _priority_policy(priority_classes)
    if pools is not None:
        out["gpushare-untrusted-pool-tolerations"] = _pool_toleration_policy(pools)
    if kueue is not None or jobset is not None:
        out["gpushare-gpu-pods-queued"] = _queue_policy(kueue or kueue_user(), jobset)
    if dra is None:
        return out
    return {**{k: v for k, v in out.items() if k != _NO_CLAIMS_POLICY}, **dra_workload_policies(dra)}


def _tenant_selector(excluded: list[str], trust: str = ALL_TENANTS) -> dict[str, Any]:
    return {"namespaceSelector": {"matchExpressions": [
        {"key": TENANT_LABEL, "operator": "Exists"},
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": excluded},
        *_trust_selector(trust),
    ]}}


_DATA_RULES = [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps", "secrets"],
                "operations": ["CREATE", "UPDATE"]}]


def admission_objects(deployer: Deployer | None = None, system_namespaces: tuple[str, ...] = (),
                      dra: DraClaims | None = None, pools: PoolTaints | None = None,
                      kueue: str | None = None, enforcement: str = "deny",
                      priority_classes: dict[str, str] | None = None, jobset: str | None = None
                      ) -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy and binding objects, as Kubernetes manifests. `system_namespaces` adds the
    namespaces a stack deploys infrastructure into (operator, Kueue, monitoring) to those never selected; `dra`
    (DRA clusters only) the claim templates tenants may reference; `pools` the cluster's pool taints (pool_taints;
    none by default); `kueue` the user name of Kueue's controller (kueue_user; the installed chart's by default);
    `enforcement` the environment's admission stage (`warn` on an adopted cluster: staged_actions);
    `priority_classes` the PriorityClass of each priority (gpushare's own by default); `jobset` the user name of
    the JobSet controller (jobset_user; its release manifest's by default), the one that creates a queued JobSet's
    Jobs."""
    deployer = deployer or Deployer()
    excluded = excluded_namespaces(system_namespaces)
    out: list[dict[str, Any]] = []

    def _binding(name: str, policy: str, actions: list[str], match: dict[str, Any] | None) -> dict[str, Any]:
        return _bound(name, policy, staged_actions(actions, enforcement), match)

    for name, policy in workload_policies(dra, pools, kueue, priority_classes, jobset).items():
        out.append(_policy(name, {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [dict(r) for r in _WORKLOAD_RULES]},
            "variables": [dict(v) for v in (*WORKLOAD_VARIABLES, *policy.get("variables", []))],
            "validations": policy["validations"],
        }))
        for suffix, trust, actions in policy.get("bindings", [("", ALL_TENANTS, ["Deny"])]):
            out.append(_binding(f"{name}{suffix}", name, actions, _tenant_selector(excluded, trust)))
    jobsets = jobsets_policy(kueue or kueue_user())
    out.append(_policy(JOBSETS_POLICY, {"failurePolicy": "Fail",
                                        "matchConstraints": {"resourceRules": [dict(r) for r in JOBSET_RULES]},
                                        "variables": jobsets["variables"], "validations": jobsets["validations"]}))
    out.append(_binding(JOBSETS_POLICY, JOBSETS_POLICY, ["Deny"], _tenant_selector(excluded)))
    if dra is not None:
        claims = _dra_claims_policy()
        claims["matchConditions"].append(_deployer_condition(deployer))
        out.append(_policy(DRA_CLAIMS_POLICY, claims))
        out.append(_binding(DRA_CLAIMS_POLICY, DRA_CLAIMS_POLICY, ["Deny"], _tenant_selector(excluded)))
    for name, policy in DATA_POLICIES.items():
        out.append(_policy(name, {"failurePolicy": "Fail",
                                  "matchConstraints": {"resourceRules": [dict(r) for r in _DATA_RULES]},
                                  "variables": _data_variables(),
                                  "validations": policy["validations"]}))
        out.append(_binding(name, name, ["Deny"], _tenant_selector(excluded, UNTRUSTED_ONLY)))
    for name, policy in NAMESPACE_POLICIES.items():
        conditions = [dict(_TENANT_NAMESPACE_CONDITION)]
        if policy["deployer_exempt"]:
            conditions.append(_deployer_condition(deployer))
        out.append(_policy(name, {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [dict(r) for r in _NAMESPACE_RULES]},
            "matchConditions": conditions,
            "variables": [dict(v) for v in NAMESPACE_VARIABLES],
            "validations": policy["validations"],
        }))
        out.append(_binding(name, name, ["Deny"], None))
    return out
