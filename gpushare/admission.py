"""Admission guardrails in the cluster: built-in ValidatingAdmissionPolicies (CEL, no extra engine) for tenant
namespaces. The Pulumi program deploys them per cluster; tests evaluate their CEL with two implementations.

Tenant namespaces carry the labels below (set by the tenancy component), which the policies read through
`namespaceObject`."""

from __future__ import annotations

from typing import Any

TENANT_LABEL = "gpushare.io/tenant"
TRUST_LABEL = "gpushare.io/trust"
PRIORITY_LABEL = "gpushare.io/priority"
PRIORITY_CLASSES = {"online": "gpushare-online", "batch": "gpushare-batch"}
SHARED_TAINT_KEY = "gpushare.io/shared-gpu"
# Namespaces that run GPU infrastructure (the MPS control daemon, device plugin) are never tenant namespaces.
SYSTEM_NAMESPACES = ("gpu-operator", "kube-system")

# All containers of a pod, whatever their kind.
_CONTAINERS = (
    "object.spec.containers"
    " + (has(object.spec.initContainers) ? object.spec.initContainers : [])"
    " + (has(object.spec.ephemeralContainers) ? object.spec.ephemeralContainers : [])"
)
_DRIVER_PATHS = ("/dev/nvidia", "/dev/dri", "/run/nvidia", "/usr/local/nvidia", "/usr/lib/x86_64-linux-gnu/libnvidia",
                 "/usr/lib/x86_64-linux-gnu/libcuda", "/usr/lib64/libnvidia", "/usr/lib64/libcuda",
                 "/usr/bin/nvidia")


def _starts(path_expr: str, prefixes: tuple[str, ...]) -> str:
    return " || ".join(f"{path_expr}.startsWith('{p}')" for p in prefixes)


def _untrusted() -> str:
    return (f"'{TRUST_LABEL}' in namespaceObject.metadata.labels && "
            f"namespaceObject.metadata.labels['{TRUST_LABEL}'] == 'untrusted'")


POLICIES: dict[str, dict[str, Any]] = {
    "gpushare-no-gpu-host-paths": {
        "variables": [],
        "validations": [{
            "expression": "!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.hostPath) || "
                          f"!(v.hostPath.path == '/dev' || {_starts('v.hostPath.path', _DRIVER_PATHS)}))",
            "message": "hostPath mounts of GPU device nodes or NVIDIA driver files are not allowed in tenant "
                       "namespaces: request GPUs through the device plugin (nvidia.com/* resources)",
            "reason": "Forbidden",
        }],
    },
    "gpushare-no-privileged-gpu-pods": {
        "variables": [{"name": "containers", "expression": _CONTAINERS}],
        "validations": [
            {
                "expression": "variables.containers.all(c, !has(c.securityContext) || "
                              "!has(c.securityContext.privileged) || c.securityContext.privileged == false)",
                "message": "privileged containers see every GPU on the node and are not allowed in tenant namespaces",
                "reason": "Forbidden",
            },
            {
                "expression": "(!has(object.spec.hostPID) || object.spec.hostPID == false) && "
                              "(!has(object.spec.hostIPC) || object.spec.hostIPC == false)",
                "message": "hostPID and hostIPC are not allowed in tenant namespaces (only the MPS control daemon, "
                           "outside them, shares the host's IPC)",
                "reason": "Forbidden",
            },
        ],
    },
    "gpushare-untrusted-no-shared-gpus": {
        "variables": [{"name": "containers", "expression": _CONTAINERS}],
        "validations": [
            {
                "expression": f"!({_untrusted()}) || variables.containers.all(c, !has(c.resources) || "
                              "((!has(c.resources.limits) || c.resources.limits.all(k, !k.endsWith('.shared'))) && "
                              "(!has(c.resources.requests) || c.resources.requests.all(k, !k.endsWith('.shared')))))",
                "message": "untrusted tenants may not use time-sliced or MPS GPU replicas (*.shared): they give no "
                           "memory or fault isolation; request a MIG instance or a whole GPU",
                "reason": "Forbidden",
            },
            {
                "expression": f"!({_untrusted()}) || !has(object.spec.tolerations) || object.spec.tolerations.all("
                              f"t, (has(t.key) && t.key != '{SHARED_TAINT_KEY}') || "
                              "(!has(t.key) && has(t.operator) && t.operator != 'Exists') || "
                              "(!has(t.key) && !has(t.operator)))",
                "message": f"untrusted tenants may not tolerate {SHARED_TAINT_KEY} (GKE-managed shared GPU pools "
                           "advertise shared GPUs as nvidia.com/gpu) nor every taint at once",
                "reason": "Forbidden",
            },
        ],
    },
    "gpushare-tenant-priority-class": {
        "variables": [],
        "validations": [{
            "expression": f"has(object.spec.priorityClassName) && object.spec.priorityClassName in "
                          f"['{PRIORITY_CLASSES['online']}', '{PRIORITY_CLASSES['batch']}'] && "
                          f"(object.spec.priorityClassName != '{PRIORITY_CLASSES['online']}' || "
                          f"('{PRIORITY_LABEL}' in namespaceObject.metadata.labels && "
                          f"namespaceObject.metadata.labels['{PRIORITY_LABEL}'] == 'online'))",
            "message": f"pods in tenant namespaces use {PRIORITY_CLASSES['batch']}, or {PRIORITY_CLASSES['online']} "
                       "where the tenant's priority is online",
            "reason": "Forbidden",
        }],
    },
    "gpushare-no-visible-devices-env": {
        # The toolkit's hardening is the real defence (images set the variable in their own ENV); this warns.
        "actions": ["Warn", "Audit"],
        "variables": [{"name": "containers", "expression": _CONTAINERS}],
        "validations": [{
            "expression": "variables.containers.all(c, !has(c.env) || "
                          "c.env.all(e, e.name != 'NVIDIA_VISIBLE_DEVICES'))",
            "message": "NVIDIA_VISIBLE_DEVICES in a pod spec is ignored for unprivileged containers (hardened "
                       "toolkit); request GPUs through resources instead",
            "reason": "Invalid",
        }],
    },
}


def admission_objects() -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy and binding objects, as Kubernetes manifests."""
    out: list[dict[str, Any]] = []
    for name, spec in POLICIES.items():
        policy_spec: dict[str, Any] = {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                                   "operations": ["CREATE", "UPDATE"]}],
            },
            "validations": spec["validations"],
        }
        if spec["variables"]:
            policy_spec["variables"] = spec["variables"]
        out.append({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "gpushare"}},
            "spec": policy_spec,
        })
        out.append({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "gpushare"}},
            "spec": {
                "policyName": name,
                "validationActions": spec.get("actions", ["Deny"]),
                "matchResources": {"namespaceSelector": {"matchExpressions": [
                    {"key": TENANT_LABEL, "operator": "Exists"},
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": list(SYSTEM_NAMESPACES)},
                ]}},
            },
        })
    return out


def tenant_namespace_labels(tenant: str, trust: str, priority: str) -> dict[str, str]:
    """The labels the tenancy component puts on a tenant namespace, which the policies above read."""
    return {TENANT_LABEL: tenant, TRUST_LABEL: trust, PRIORITY_LABEL: priority}
