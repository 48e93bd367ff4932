"""Admission guardrails in the cluster: built-in ValidatingAdmissionPolicies (CEL, no extra engine) for tenant
namespaces. The Pulumi program deploys them per cluster; tests evaluate their CEL with two implementations.

Tenant namespaces carry the labels below (set by the tenancy component), which the policies read through
`namespaceObject`. Workload policies judge pods (CREATE, UPDATE, and `pods/ephemeralcontainers`) and the pod
templates of every built-in controller, written once over a `podSpec` variable picked by `object.kind`. On UPDATE
only what changed against `oldObject` is judged, so a label or finalizer update of an existing pod is never
refused. Namespace policies keep tenants from editing the labels that decide their own trust and Pod Security."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpushare.core import dra
from gpushare.core.namespaces import (
    CDI_ANNOTATION_PREFIX,
    DRA_ADMIN_ACCESS_LABEL,
    POD_SECURITY_PREFIX,
    PRIORITY_CLASSES,
    PRIORITY_LABEL,
    SHARED_TAINT_KEY,
    TENANT_LABEL,
    TRUST_LABEL,
    TRUSTED,
    VISIBLE_DEVICES_ENV,
)
from gpushare.core.spec import SYSTEM_NAMESPACES

# Who may set a tenant namespace's trust, tenant and Pod Security labels; the Pulumi stack config can name others.
DEFAULT_DEPLOYER_GROUPS = ("system:masters",)
MANAGED = {"app.kubernetes.io/managed-by": "gpushare"}


@dataclass(frozen=True)
class Deployer:
    """gpushare's own identity in the cluster: the only one that may change tenant namespaces' guarded labels."""

    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = DEFAULT_DEPLOYER_GROUPS


@dataclass(frozen=True)
class DraClaims:
    """A DRA cluster's claim templates (docs/dra.md): per tenant name, the gpushare templates its pods may
    reference, and the templates of hardware-isolated profiles, the only ones an untrusted namespace may use."""

    templates: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    isolated: tuple[str, ...] = ()


# Who creates a pod's claims from its templates: kube-controller-manager's resource-claim controller, under its own
# service account (--use-service-account-credentials) or the manager's identity.
CLAIM_CONTROLLER_USERS = ("system:serviceaccount:kube-system:resource-claim-controller",
                          "system:kube-controller-manager")
# The driver's own DeviceClass gpu.nvidia.com maps this extended resource to DRA (extendedResourceName).
DRA_EXTENDED_RESOURCE = dra.driver_facts().extended_resource_name
# Kubernetes' DRAExtendedResource: `deviceclass.resource.kubernetes.io/<class>` in a container's resources asks the
# scheduler for a claim on any DeviceClass, with no template and none of its shares or quota accounting.
IMPLICIT_EXTENDED_PREFIX = "deviceclass.resource.kubernetes.io/"


# ---------------------------------------------------------------- workload policies (pods and pod templates)

_WORKLOAD_RULES = [
    {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE", "UPDATE"]},
    # `kubectl debug` adds containers through this subresource: a privileged one would otherwise pass unseen.
    {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/ephemeralcontainers"], "operations": ["UPDATE"]},
    {"apiGroups": ["apps"], "apiVersions": ["v1"],
     "resources": ["deployments", "statefulsets", "daemonsets", "replicasets"], "operations": ["CREATE", "UPDATE"]},
    {"apiGroups": ["batch"], "apiVersions": ["v1"], "resources": ["jobs", "cronjobs"],
     "operations": ["CREATE", "UPDATE"]},
]


def _template(obj: str) -> str:
    """The pod template of a controller object: CronJobs nest theirs in the job template."""
    return f"({obj}.kind == 'CronJob' ? {obj}.spec.jobTemplate.spec.template : {obj}.spec.template)"


def _pick_spec(obj: str) -> str:
    return f"({obj}.kind == 'Pod' ? {obj}.spec : {_template(obj)}.spec)"


def _pick_annotations(obj: str) -> str:
    template = _template(obj)
    return (f"({obj}.kind == 'Pod' ? "
            f"(has({obj}.metadata.annotations) ? {obj}.metadata.annotations : {{}}) : "
            f"(has({template}.metadata) && has({template}.metadata.annotations) ? "
            f"{template}.metadata.annotations : {{}}))")


def _containers(spec: str) -> str:
    return (f"{spec}.containers"
            f" + (has({spec}.initContainers) ? {spec}.initContainers : [])"
            f" + (has({spec}.ephemeralContainers) ? {spec}.ephemeralContainers : [])")


def _list(spec: str, field: str) -> str:
    return f"(has({spec}.{field}) ? {spec}.{field} : [])"


_UNTRUSTED = (f"!has(namespaceObject.metadata.labels) || !('{TRUST_LABEL}' in namespaceObject.metadata.labels) || "
              f"namespaceObject.metadata.labels['{TRUST_LABEL}'] != '{TRUSTED}'")

# On CREATE the "old" values are the new ones; every use is guarded by `isUpdate`, so no expression meets a null.
WORKLOAD_VARIABLES: list[dict[str, str]] = [
    {"name": "isUpdate", "expression": "request.operation == 'UPDATE'"},
    {"name": "podSpec", "expression": _pick_spec("object")},
    {"name": "oldPodSpec", "expression": f"variables.isUpdate ? {_pick_spec('oldObject')} : variables.podSpec"},
    {"name": "podAnnotations", "expression": _pick_annotations("object")},
    {"name": "oldPodAnnotations",
     "expression": f"variables.isUpdate ? {_pick_annotations('oldObject')} : variables.podAnnotations"},
    {"name": "containers", "expression": _containers("variables.podSpec")},
    {"name": "oldContainers", "expression": _containers("variables.oldPodSpec")},
    {"name": "volumes", "expression": _list("variables.podSpec", "volumes")},
    {"name": "oldVolumes", "expression": _list("variables.oldPodSpec", "volumes")},
    {"name": "tolerations", "expression": _list("variables.podSpec", "tolerations")},
    {"name": "oldTolerations", "expression": _list("variables.oldPodSpec", "tolerations")},
    {"name": "resourceClaims", "expression": _list("variables.podSpec", "resourceClaims")},
    {"name": "oldResourceClaims", "expression": _list("variables.oldPodSpec", "resourceClaims")},
    # A missing, empty, mis-cased or unknown trust label all mean untrusted.
    {"name": "untrusted", "expression": _UNTRUSTED},
]


def _kept(item: str, old_list: str) -> str:
    """True where an UPDATE leaves this element as it was: only what changed is judged."""
    return f"(variables.isUpdate && {item} in variables.{old_list})"


def _each_new(list_var: str, item: str, ok: str) -> str:
    return f"variables.{list_var}.all({item}, {_kept(item, 'old' + list_var[0].upper() + list_var[1:])} || ({ok}))"


def _flag_added(field: str) -> str:
    """A boolean pod-spec field that is set now and was not before."""
    return (f"(has(variables.podSpec.{field}) && variables.podSpec.{field}) && "
            f"!(variables.isUpdate && has(variables.oldPodSpec.{field}) && variables.oldPodSpec.{field})")


_PRIVILEGED = "has(c.securityContext) && has(c.securityContext.privileged) && c.securityContext.privileged"
_TOLERATION_KEY = "(has(t.key) ? t.key : '')"
_TOLERATION_OPERATOR = "(has(t.operator) ? t.operator : 'Equal')"
_PRIORITY = "(has(variables.podSpec.priorityClassName) ? variables.podSpec.priorityClassName : '')"
_OLD_PRIORITY = "(has(variables.oldPodSpec.priorityClassName) ? variables.oldPodSpec.priorityClassName : '')"
_NODE_NAME = "(has(variables.podSpec.nodeName) ? variables.podSpec.nodeName : '')"
_OLD_NODE_NAME = "(has(variables.oldPodSpec.nodeName) ? variables.oldPodSpec.nodeName : '')"


def _no_shared(field: str) -> str:
    return (f"!has(c.resources) || !has(c.resources.{field}) || "
            f"c.resources.{field}.all(k, !k.endsWith('.shared'))")


# Bindings by trust: a label selector's NotIn also matches namespaces without the label (so: untrusted).
ALL_TENANTS = "all"
UNTRUSTED_ONLY = "untrusted"
TRUSTED_ONLY = "trusted"

POLICIES: dict[str, dict[str, Any]] = {
    "gpushare-no-host-paths": {
        # Every hostPath, whatever its spelling (/dev/./nvidia0, /etc/cdi, /): no prefix list to get around.
        "validations": [{
            "expression": _each_new("volumes", "v", "!has(v.hostPath)"),
            "message": "hostPath volumes are not allowed in tenant namespaces (a host path can reach GPU device "
                       "nodes, driver files, CDI specs or the kubelet): request GPUs through resources "
                       "(nvidia.com/*) and use emptyDir, configMap, secret or persistentVolumeClaim volumes",
            "reason": "Forbidden",
        }],
    },
    "gpushare-no-privileged-gpu-pods": {
        "validations": [
            {
                "expression": _each_new("containers", "c", f"!({_PRIVILEGED})"),
                "message": "privileged containers (of any kind: init, ephemeral) see every GPU on the node and are "
                           "not allowed in tenant namespaces",
                "reason": "Forbidden",
            },
            {
                "expression": f"!({_flag_added('hostPID')}) && !({_flag_added('hostIPC')}) && "
                              f"!({_flag_added('hostNetwork')})",
                "message": "hostPID, hostIPC and hostNetwork are not allowed in tenant namespaces (the host network "
                           "reaches the node's DCGM host engine on localhost:5555; only the MPS control daemon, "
                           "outside tenant namespaces, shares the host's IPC)",
                "reason": "Forbidden",
            },
        ],
    },
    "gpushare-untrusted-no-node-name": {
        "validations": [{
            "expression": f"!variables.untrusted || {_NODE_NAME} == '' || "
                          f"(variables.isUpdate && {_NODE_NAME} == {_OLD_NODE_NAME})",
            "message": "untrusted tenants may not set spec.nodeName: it skips the scheduler and every taint that "
                       "keeps them off shared GPU nodes (the scheduler binds pods itself; use nodeSelector or "
                       "affinity to choose among the nodes you may use)",
            "reason": "Forbidden",
        }],
    },
    "gpushare-untrusted-no-shared-gpus": {
        "validations": [
            {
                "expression": "!variables.untrusted || " + _each_new(
                    "containers", "c", f"({_no_shared('limits')}) && ({_no_shared('requests')})"),
                "message": "untrusted tenants may not use time-sliced or MPS GPU replicas (*.shared) in any "
                           "container: they give no memory or fault isolation; request a MIG instance or a whole GPU",
                "reason": "Forbidden",
            },
            {
                "expression": "!variables.untrusted || " + _each_new(
                    "tolerations", "t", f"{_TOLERATION_KEY} != '{SHARED_TAINT_KEY}' && "
                    f"!({_TOLERATION_KEY} == '' && {_TOLERATION_OPERATOR} == 'Exists')"),
                "message": f"untrusted tenants may not tolerate {SHARED_TAINT_KEY} (GKE-managed shared GPU pools "
                           "advertise shared GPUs as nvidia.com/gpu) nor every taint at once (a toleration with no "
                           "key and operator Exists)",
                "reason": "Forbidden",
            },
        ],
    },
    "gpushare-no-cdi-annotations": {
        "validations": [{
            "expression": f"variables.podAnnotations.all(k, !k.startsWith('{CDI_ANNOTATION_PREFIX}') || "
                          "(variables.isUpdate && k in variables.oldPodAnnotations && "
                          "variables.oldPodAnnotations[k] == variables.podAnnotations[k]))",
            "message": f"{CDI_ANNOTATION_PREFIX}* annotations inject CDI devices past the device plugin and are not "
                       "allowed on pods or pod templates in tenant namespaces: request GPUs through resources",
            "reason": "Forbidden",
        }],
    },
    "gpushare-no-resource-claims": {
        # gpushare templates no DRA claims today; any claim a tenant writes could name devices outside its quota.
        "validations": [
            {
                "expression": _each_new("resourceClaims", "r", "false"),
                "message": "DRA resource claims (spec.resourceClaims) come through gpushare, which templates none "
                           "for tenants: request GPUs through resources (nvidia.com/*)",
                "reason": "Forbidden",
            },
            {
                "expression": _each_new("containers", "c", "!has(c.resources) || !has(c.resources.claims) || "
                                                           "size(c.resources.claims) == 0"),
                "message": "DRA resource claims (resources.claims of a container) come through gpushare, which "
                           "templates none for tenants: request GPUs through resources (nvidia.com/*)",
                "reason": "Forbidden",
            },
        ],
    },
    "gpushare-tenant-priority-class": {
        "validations": [{
            "expression": f"(variables.isUpdate && {_PRIORITY} == {_OLD_PRIORITY}) || "
                          f"({_PRIORITY} in ['{PRIORITY_CLASSES['online']}', '{PRIORITY_CLASSES['batch']}'] && "
                          f"({_PRIORITY} != '{PRIORITY_CLASSES['online']}' || "
                          f"(has(namespaceObject.metadata.labels) && "
                          f"'{PRIORITY_LABEL}' in namespaceObject.metadata.labels && "
                          f"namespaceObject.metadata.labels['{PRIORITY_LABEL}'] == 'online')))",
            "message": f"pods and pod templates in tenant namespaces use {PRIORITY_CLASSES['batch']}, or "
                       f"{PRIORITY_CLASSES['online']} where the tenant's priority is online",
            "reason": "Forbidden",
        }],
    },
    "gpushare-no-visible-devices-env": {
        # The toolkit's hardening is the real defence (images set the variable in their own ENV): a denial for
        # untrusted tenants, a warning for trusted ones.
        "bindings": [("", UNTRUSTED_ONLY, ["Deny"]), ("-trusted", TRUSTED_ONLY, ["Warn", "Audit"])],
        "validations": [{
            "expression": _each_new("containers", "c",
                                    f"!has(c.env) || c.env.all(e, e.name != '{VISIBLE_DEVICES_ENV}')"),
            "message": f"{VISIBLE_DEVICES_ENV} in a pod spec is ignored for unprivileged containers (hardened "
                       "toolkit) and not allowed for untrusted tenants; request GPUs through resources instead",
            "reason": "Invalid",
        }],
    },
    "gpushare-untrusted-env-from": {
        "bindings": [("", UNTRUSTED_ONLY, ["Warn", "Audit"])],
        "validations": [{
            "expression": "!variables.untrusted || " + _each_new(
                "containers", "c", "!has(c.envFrom) || size(c.envFrom) == 0"),
            "message": f"envFrom can set {VISIBLE_DEVICES_ENV} where this policy cannot see it; it reaches no GPU: "
                       "the hardened toolkit ignores the variable in unprivileged containers and restricted Pod "
                       "Security forbids privileged ones. Prefer env entries you list by name",
            "reason": "Invalid",
        }],
    },
}


# ---------------------------------------------------------------- DRA clusters (docs/dra.md)

_NO_CLAIMS_POLICY = "gpushare-no-resource-claims"
_TENANT_NAME = (f"(has(namespaceObject.metadata.labels) && '{TENANT_LABEL}' in namespaceObject.metadata.labels ? "
                f"namespaceObject.metadata.labels['{TENANT_LABEL}'] : '')")


def _strings(values: list[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _no_extended_gpu(field: str) -> str:
    return (f"!has(c.resources.{field}) || (!('{DRA_EXTENDED_RESOURCE}' in c.resources.{field}) && "
            f"!c.resources.{field}.exists(k, k.startsWith('{IMPLICIT_EXTENDED_PREFIX}')))")


def dra_workload_policies(claims: DraClaims) -> dict[str, dict[str, Any]]:
    """On DRA clusters these replace gpushare-no-resource-claims: a pod's claims come only from the gpushare
    templates its tenant may use (pairs `tenant/template`, looked up by the namespace's guarded tenant label)."""
    pairs = sorted(f"{tenant}/{t}" for tenant, names in claims.templates.items() for t in names)
    template = "(has(r.resourceClaimTemplateName) ? r.resourceClaimTemplateName : '')"
    allowed = (f"{template} != '' && (variables.tenantName + '/' + {template}) in {_strings(pairs)} && "
               f"(!variables.untrusted || {template} in {_strings(sorted(claims.isolated))})")
    return {
        "gpushare-dra-claim-templates": {
            "variables": [{"name": "tenantName", "expression": _TENANT_NAME}],
            "validations": [{
                "expression": _each_new("resourceClaims", "r", allowed),
                "message": "on this DRA cluster a pod's spec.resourceClaims may only name a gpushare claim template "
                           "its tenant may use (resourceClaimTemplateName gpushare-<profile>; untrusted tenants "
                           "only those of MIG or exclusive profiles); shared claims (resourceClaimName) are refused. "
                           "`kubectl get resourceclaimtemplates` in the namespace lists them",
                "reason": "Forbidden",
            }],
        },
        "gpushare-dra-no-extended-gpu": {
            "validations": [{
                "expression": _each_new("containers", "c", f"!has(c.resources) || (({_no_extended_gpu('limits')}) "
                                                           f"&& ({_no_extended_gpu('requests')}))"),
                "message": f"on this DRA cluster {DRA_EXTENDED_RESOURCE} is served by the driver's own DeviceClass "
                           f"(extendedResourceName) and {IMPLICIT_EXTENDED_PREFIX}<class> by any class, outside "
                           "gpushare's profiles, shares and quota: reference a gpushare claim template in "
                           "spec.resourceClaims instead",
                "reason": "Forbidden",
            }],
        },
    }


def _dra_claims_policy() -> dict[str, Any]:
    """Tenants create no ResourceClaims or templates of their own: a claim could name any DeviceClass, a template
    in place of gpushare's could change what `gpushare-<profile>` means. The claim controller and gpushare may."""
    users = ", ".join(f"'{u}'" for u in CLAIM_CONTROLLER_USERS)
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["*"],
                                                "resources": ["resourceclaims", "resourceclaimtemplates"],
                                                "operations": ["CREATE", "UPDATE"]}]},
        "matchConditions": [{"name": "not-claim-controller",
                             "expression": f"!(request.userInfo.username in [{users}])"}],
        # An UPDATE that keeps the spec passes: the scheduler adds its delete-protection finalizer and the garbage
        # collector its owner references while binding; only what a claim asks for is gpushare's alone.
        "validations": [{
            "expression": "request.operation == 'UPDATE' && has(oldObject.spec) && object.spec == oldObject.spec",
            "message": "ResourceClaims and ResourceClaimTemplates in tenant namespaces come from gpushare: reference "
                       "a gpushare claim template (gpushare-<profile>) in the pod's spec.resourceClaims",
            "reason": "Forbidden",
        }],
    }


DRA_CLAIMS_POLICY = "gpushare-dra-no-tenant-claims"


# ---------------------------------------------------------------- namespace policies

def _labels(obj: str) -> str:
    return f"(has({obj}.metadata.labels) ? {obj}.metadata.labels : {{}})"


def _guarded(key: str) -> str:
    return f"({key} in ['{TRUST_LABEL}', '{TENANT_LABEL}'] || {key}.startsWith('{POD_SECURITY_PREFIX}'))"


# A binding's namespaceSelector reads a Namespace's new labels, so removing the tenant label would escape it:
# these policies match every namespace and select tenant ones (before or after the change) with a condition.
_TENANT_NAMESPACE_CONDITION = {
    "name": "tenant-namespace",
    "expression": f"'{TENANT_LABEL}' in {_labels('object')} || "
                  f"(request.operation == 'UPDATE' && '{TENANT_LABEL}' in {_labels('oldObject')})",
}

NAMESPACE_VARIABLES: list[dict[str, str]] = [
    {"name": "labels", "expression": _labels("object")},
    {"name": "oldLabels", "expression": f"request.operation == 'UPDATE' ? {_labels('oldObject')} : {{}}"},
]

NAMESPACE_POLICIES: dict[str, dict[str, Any]] = {
    "gpushare-tenant-namespace-labels": {
        "deployer_exempt": True,
        "validations": [{
            "expression": f"variables.labels.all(k, !{_guarded('k')} || "
                          "(k in variables.oldLabels && variables.oldLabels[k] == variables.labels[k])) && "
                          f"variables.oldLabels.all(k, !{_guarded('k')} || k in variables.labels)",
            "message": f"only gpushare's deployer sets a tenant namespace's {TRUST_LABEL}, {TENANT_LABEL} and "
                       f"{POD_SECURITY_PREFIX}* labels: change the tenant in the environment file instead",
            "reason": "Forbidden",
        }],
    },
    "gpushare-tenant-namespace-no-dra-admin": {
        "deployer_exempt": False,
        "validations": [{
            "expression": f"!('{DRA_ADMIN_ACCESS_LABEL}' in variables.labels)",
            "message": f"tenant namespaces never carry {DRA_ADMIN_ACCESS_LABEL}: DRA admin access reaches devices "
                       "that other pods hold",
            "reason": "Forbidden",
        }],
    },
}


def _deployer_condition(deployer: Deployer) -> dict[str, str]:
    users = ", ".join(f"'{u}'" for u in deployer.users)
    groups = ", ".join(f"'{g}'" for g in deployer.groups)
    return {
        "name": "not-gpushare-deployer",
        "expression": f"!(request.userInfo.username in [{users}] || (has(request.userInfo.groups) && "
                      f"request.userInfo.groups.exists(g, g in [{groups}])))",
    }


# ---------------------------------------------------------------- objects


def _trust_selector(trust: str) -> list[dict[str, Any]]:
    if trust == UNTRUSTED_ONLY:
        return [{"key": TRUST_LABEL, "operator": "NotIn", "values": [TRUSTED]}]
    if trust == TRUSTED_ONLY:
        return [{"key": TRUST_LABEL, "operator": "In", "values": [TRUSTED]}]
    return []


def _policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name, "labels": dict(MANAGED)}, "spec": spec}


def _binding(name: str, policy: str, actions: list[str], match: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"policyName": policy, "validationActions": actions}
    if match is not None:
        spec["matchResources"] = match
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name, "labels": dict(MANAGED)}, "spec": spec}


def excluded_namespaces(extra: tuple[str, ...] = ()) -> list[str]:
    """Namespaces no binding selects, whatever labels they carry: the system ones and those gpushare deploys into."""
    return sorted({*SYSTEM_NAMESPACES, *extra})


def workload_policies(dra: DraClaims | None = None) -> dict[str, dict[str, Any]]:
    """The workload policies of a cluster: device-plugin clusters refuse every claim, DRA clusters judge them."""
    if dra is None:
        return POLICIES
    return {**{k: v for k, v in POLICIES.items() if k != _NO_CLAIMS_POLICY}, **dra_workload_policies(dra)}


def _tenant_selector(excluded: list[str], trust: str = ALL_TENANTS) -> dict[str, Any]:
    return {"namespaceSelector": {"matchExpressions": [
        {"key": TENANT_LABEL, "operator": "Exists"},
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": excluded},
        *_trust_selector(trust),
    ]}}


def admission_objects(deployer: Deployer | None = None, system_namespaces: tuple[str, ...] = (),
                      dra: DraClaims | None = None) -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy and binding objects, as Kubernetes manifests. `system_namespaces` adds the
    namespaces a stack deploys infrastructure into (operator, Kueue, monitoring) to those never selected; `dra`
    (DRA clusters only) the claim templates tenants may reference."""
    deployer = deployer or Deployer()
    excluded = excluded_namespaces(system_namespaces)
    out: list[dict[str, Any]] = []
    for name, policy in workload_policies(dra).items():
        out.append(_policy(name, {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [dict(r) for r in _WORKLOAD_RULES]},
            "variables": [dict(v) for v in (*WORKLOAD_VARIABLES, *policy.get("variables", []))],
            "validations": policy["validations"],
        }))
        for suffix, trust, actions in policy.get("bindings", [("", ALL_TENANTS, ["Deny"])]):
            out.append(_binding(f"{name}{suffix}", name, actions, _tenant_selector(excluded, trust)))
    if dra is not None:
        claims = _dra_claims_policy()
        claims["matchConditions"].append(_deployer_condition(deployer))
        out.append(_policy(DRA_CLAIMS_POLICY, claims))
        out.append(_binding(DRA_CLAIMS_POLICY, DRA_CLAIMS_POLICY, ["Deny"], _tenant_selector(excluded)))
    for name, policy in NAMESPACE_POLICIES.items():
        conditions = [dict(_TENANT_NAMESPACE_CONDITION)]
        if policy["deployer_exempt"]:
            conditions.append(_deployer_condition(deployer))
        out.append(_policy(name, {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                    "resources": ["namespaces"],
                                                    "operations": ["CREATE", "UPDATE"]}]},
            "matchConditions": conditions,
            "variables": [dict(v) for v in NAMESPACE_VARIABLES],
            "validations": policy["validations"],
        }))
        out.append(_binding(name, name, ["Deny"], None))
    return out
