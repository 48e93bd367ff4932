"""The workload policies (pods and pod templates) every cluster gets, by name; the cluster's own pool
tolerations, Kueue identity and PriorityClasses replace their defaults in objects.workload_policies."""

from __future__ import annotations

from typing import Any

from gpushare.core.namespaces import (
    CDI_ANNOTATION_PREFIX,
    PRIORITY_CLASSES,
    RUNTIME_CLASSES,
    SHARED_TAINT_KEY,
    VISIBLE_DEVICES_ENV,
)
from gpushare.policy.admission.cel import TRUSTED_ONLY, UNTRUSTED_ONLY, _each_new, _flag_added, _strings
from gpushare.policy.admission.cluster import PoolTaints, kueue_user
from gpushare.policy.admission.environment import (
    _DRIVER_ENV_FAMILIES,
    _DRIVER_ENV_FIX,
    _DRIVER_ENV_RULE,
    _ENV_VALUE,
    _driver_env_ok,
)
from gpushare.policy.admission.priority import _priority_policy
from gpushare.policy.admission.queues import _queue_policy
from gpushare.policy.admission.scheduling import _AFFINITY_VARIABLES, _TOLERATION_KEY, _pool_toleration_policy

_PRIVILEGED = "has(c.securityContext) && has(c.securityContext.privileged) && c.securityContext.privileged"
_NODE_NAME = "(has(variables.podSpec.nodeName) ? variables.podSpec.nodeName : '')"
_OLD_NODE_NAME = "(has(variables.oldPodSpec.nodeName) ? variables.oldPodSpec.nodeName : '')"


def _no_shared(field: str) -> str:
    return (f"!has(c.resources) || !has(c.resources.{field}) || "
            f"c.resources.{field}.all(k, !k.endsWith('.shared'))")


# Claims a controller creates: a StatefulSet's volumeClaimTemplates (read in variables, as spec.suspend is).
def _claim_templates(obj: str) -> str:
    return (f"({obj}.kind == 'StatefulSet' && has({obj}.spec.volumeClaimTemplates) ? "
            f"{obj}.spec.volumeClaimTemplates : [])")


_CLAIM_TEMPLATE_VARIABLES = [
    {"name": "volumeClaimTemplates", "expression": _claim_templates("object")},
    {"name": "oldVolumeClaimTemplates",
     "expression": f"variables.isUpdate ? {_claim_templates('oldObject')} : []"},
]


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
                           "not allowed in tenant namespaces: remove securityContext.privileged and request GPUs "
                           "through resources (nvidia.com/*)",
                "reason": "Forbidden",
            },
            {
                "expression": f"!({_flag_added('hostPID')}) && !({_flag_added('hostIPC')}) && "
                              f"!({_flag_added('hostNetwork')})",
                "message": "hostPID, hostIPC and hostNetwork are not allowed in tenant namespaces (the host network "
                           "reaches the node's DCGM host engine on localhost:5555; only the MPS control daemon, "
                           "outside tenant namespaces, shares the host's IPC): remove them and reach other pods "
                           "through Services",
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
                # Tolerating every taint at once is gpushare-untrusted-pool-tolerations' to refuse.
                "expression": "!variables.untrusted || " + _each_new(
                    "tolerations", "t", f"{_TOLERATION_KEY} != '{SHARED_TAINT_KEY}'"),
                "message": f"untrusted tenants may not tolerate {SHARED_TAINT_KEY} (GKE-managed shared GPU pools "
                           "advertise shared GPUs as nvidia.com/gpu): remove the toleration and request a MIG "
                           "instance or a whole GPU",
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
                       "allowed on pods or pod templates in tenant namespaces: remove them and request GPUs through "
                       "resources",
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
    "gpushare-tenant-priority-class": _priority_policy(PRIORITY_CLASSES),
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
    "gpushare-no-driver-env": {
        # Denied for untrusted tenants, a warning for trusted ones (images set such variables in their own ENV,
        # which admission cannot see; the hosts' toolkit configuration is the defence there).
        "bindings": [("", UNTRUSTED_ONLY, ["Deny"]), ("-trusted", TRUSTED_ONLY, ["Warn", "Audit"])],
        "validations": [
            {
                "expression": _each_new("containers", "c", "!has(c.env) || c.env.all(e, " + _driver_env_ok(
                    "e.name", "!has(e.valueFrom)", _ENV_VALUE) + ")"),
                "message": f"{_DRIVER_ENV_RULE}, and are not allowed for untrusted tenants in env of any "
                           f"container: {_DRIVER_ENV_FIX}",
                "reason": "Forbidden",
            },
            {
                "expression": _each_new("containers", "c", "!has(c.envFrom) || c.envFrom.all(f, !has(f.prefix) || "
                                        f"!{_strings(_DRIVER_ENV_FAMILIES)}.exists(x, x.startsWith(f.prefix) || "
                                        "f.prefix.startsWith(x)))"),
                "message": "an envFrom prefix that starts an NVIDIA_ or CUDA_ name lets a ConfigMap or Secret key "
                           "become one of the NVIDIA container toolkit's variables: use a prefix outside those, "
                           "e.g. APP_",
                "reason": "Forbidden",
            },
        ],
    },
    "gpushare-untrusted-runtime-class": {
        "validations": [{
            "expression": "!variables.untrusted || !has(variables.podSpec.runtimeClassName) || "
                          f"variables.podSpec.runtimeClassName in {_strings(RUNTIME_CLASSES)} || "
                          "(variables.isUpdate && has(variables.oldPodSpec.runtimeClassName) && "
                          "variables.oldPodSpec.runtimeClassName == variables.podSpec.runtimeClassName)",
            "message": f"untrusted tenants run under the node's default runtime or {', '.join(RUNTIME_CLASSES)} "
                       "(the one gpushare configures and hardens); another runtimeClassName picks a runtime "
                       f"handler nobody checked: remove runtimeClassName or set it to {RUNTIME_CLASSES[0]}",
            "reason": "Forbidden",
        }],
    },
    "gpushare-untrusted-no-inline-volumes": {
        "variables": _CLAIM_TEMPLATE_VARIABLES,
        "validations": [
            {
                "expression": "!variables.untrusted || " + _each_new("volumes", "v", "!has(v.csi)"),
                "message": "untrusted tenants may not mount inline CSI volumes (volumes[].csi): the CSI driver, "
                           "not the API server, decides what they reach (host paths, other identities' secrets): "
                           "use a persistentVolumeClaim, emptyDir, configMap, secret or projected volume",
                "reason": "Forbidden",
            },
            {
                "expression": "!variables.untrusted || " + _each_new("volumes", "v", "!has(v.ephemeral)"),
                "message": "untrusted tenants may not use generic ephemeral volumes (volumes[].ephemeral): the "
                           "ephemeral volume controller creates their claims past the tenant's own rights on "
                           "PersistentVolumeClaims: create a PersistentVolumeClaim and mount it by "
                           "persistentVolumeClaim, or use emptyDir",
                "reason": "Forbidden",
            },
            {
                # The same for a StatefulSet's claim templates (immutable: a StatefulSet that has them still
                # scales and rolls out its template).
                "expression": "!variables.untrusted || " + _each_new("volumeClaimTemplates", "c", "false"),
                "message": "untrusted tenants' StatefulSets may not carry volumeClaimTemplates: the StatefulSet "
                           "controller creates their claims past the tenant's own rights on PersistentVolumeClaims: "
                           "create the PersistentVolumeClaims yourself and mount them by persistentVolumeClaim in "
                           "the pod template, or use emptyDir",
                "reason": "Forbidden",
            },
        ],
    },
    "gpushare-untrusted-pod-affinity": {
        "variables": _AFFINITY_VARIABLES,
        "validations": [{
            "expression": "!variables.untrusted || " + _each_new(
                "affinityTerms", "t", "!has(t.namespaceSelector) && (!has(t.namespaces) || "
                "t.namespaces.all(n, n == namespaceObject.metadata.name))"),
            "message": "untrusted tenants' pod affinity and anti-affinity terms see their own namespace only (a "
                       "namespaceSelector or another namespace steers pods next to other tenants' pods, or keeps "
                       "theirs off nodes): leave namespaceSelector out and list no namespace but your own",
            "reason": "Forbidden",
        }],
    },
    "gpushare-untrusted-pool-tolerations": _pool_toleration_policy(PoolTaints()),
    "gpushare-gpu-pods-queued": _queue_policy(kueue_user()),
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
