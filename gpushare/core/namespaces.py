"""Tenant namespaces: the labels gpushare puts on them (trust, tenant, priority, Pod Security) and the names
the admission policies read. One place for both, so the tenancy objects and the policies cannot disagree."""

from __future__ import annotations

TENANT_LABEL = "gpushare.io/tenant"
TRUST_LABEL = "gpushare.io/trust"
PRIORITY_LABEL = "gpushare.io/priority"
TRUSTED = "trusted"
PRIORITY_CLASSES = {"online": "gpushare-online", "batch": "gpushare-batch"}
SHARED_TAINT_KEY = "gpushare.io/shared-gpu"
POD_SECURITY_PREFIX = "pod-security.kubernetes.io/"
POD_SECURITY_MODES = ("enforce", "audit", "warn")
# DRA: a namespace with this label may create claims with adminAccess, which reach devices other pods hold.
DRA_ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
# Kueue's names (0.19): the LocalQueue label it queues a workload by, the scheduling gate its webhook puts on the pods
# it manages until it admits them, and the label naming a workload's WorkloadPriorityClass.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GATE = "kueue.x-k8s.io/admission"
WORKLOAD_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# The RuntimeClass the GPU Operator creates for the one runtime gpushare configures (its containerd drop-in adds only
# "nvidia"): the only one untrusted tenants may name.
RUNTIME_CLASSES = ("nvidia",)


def pod_security_labels(level: str, kubernetes_version: str, enforce: bool = True) -> dict[str, str]:
    """Pod Security Admission labels: one level for enforce, audit and warn, pinned to the cluster's minor so an
    upgrade does not change what is admitted unseen. Without `enforce` (an adopted cluster's first step, as
    Kubernetes recommends for turning Pod Security on) only audit and warn: the namespace's own enforce label, if
    any, stays."""
    version = f"v{kubernetes_version}"
    out: dict[str, str] = {}
    for mode in POD_SECURITY_MODES if enforce else POD_SECURITY_MODES[1:]:
        out[f"{POD_SECURITY_PREFIX}{mode}"] = level
        out[f"{POD_SECURITY_PREFIX}{mode}-version"] = version
    return out


def tenant_namespace_labels(tenant: str, trust: str, priority: str, pod_security: str,
                            kubernetes_version: str, enforce: bool = True) -> dict[str, str]:
    """The labels the tenancy component puts on a tenant namespace, which the policies above read. Never DRA's
    admin-access label."""
    return {TENANT_LABEL: tenant, TRUST_LABEL: trust, PRIORITY_LABEL: priority,
            **pod_security_labels(pod_security, kubernetes_version, enforce)}
