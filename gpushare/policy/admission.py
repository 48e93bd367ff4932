"""Admission guardrails in the cluster: built-in ValidatingAdmissionPolicies (CEL, no extra engine) for tenant
namespaces. The Pulumi program deploys them per cluster; tests evaluate their CEL with two implementations.

Tenant namespaces carry the labels below (set by the tenancy component), which the policies read through
`namespaceObject`. Workload policies judge pods (CREATE, UPDATE, and `pods/ephemeralcontainers`) and the pod
templates of every built-in controller, written once over a `podSpec` variable picked by `object.kind`. On UPDATE
only what changed against `oldObject` is judged, so a label or finalizer update of an existing pod is never
refused. Per cluster, the pool-toleration policy carries its pools' taints and the queue policy the identity of its
Kueue controller (the only one that may lift Kueue's gate or resume a queued Job). A data policy judges untrusted
tenants' ConfigMaps and Secrets, whose keys envFrom turns into variables no workload policy sees. Namespace
policies keep tenants from editing the labels that decide their own trust, priority and Pod Security, through the
Namespace itself and its status and finalize subresources."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpushare.core import dra
from gpushare.core.namespaces import (
    CDI_ANNOTATION_PREFIX,
    DRA_ADMIN_ACCESS_LABEL,
    KUEUE_GATE,
    POD_SECURITY_PREFIX,
    PRIORITY_CLASSES,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    RUNTIME_CLASSES,
    SHARED_TAINT_KEY,
    TENANT_LABEL,
    TRUST_LABEL,
    TRUSTED,
    VISIBLE_DEVICES_ENV,
    WORKLOAD_PRIORITY_LABEL,
)
from gpushare.core.spec import SYSTEM_NAMESPACES
from gpushare.core.tenancy import LOCAL_QUEUE, ClusterTenancy

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

Taint = tuple[str, str, str]  # key, value, effect


@dataclass(frozen=True)
class PoolTaints:
    """The taints of a cluster's pools, and per tenant name those of the pools its queue may admit work onto: an
    untrusted tenant's pods may tolerate no other pool's taints (a tenant the map does not name: none at all)."""

    taints: tuple[Taint, ...] = ()
    allowed: Mapping[str, tuple[Taint, ...]] = field(default_factory=dict)


def pool_taints(tenancy: ClusterTenancy) -> PoolTaints:
    """A cluster's pool taints as its tenancy objects have them (the ResourceFlavors' tolerations): a tenant's own
    pools are the flavors its ClusterQueue holds quota or a borrowing limit in, so Kueue, which adds a flavor's
    tolerations when it admits a workload there, only ever adds allowed ones."""
    every = tuple(sorted({t for taints in tenancy.pool_taints.values() for t in taints}))
    allowed = {tenant: tuple(sorted({t for pool in pools for t in tenancy.pool_taints.get(pool, [])}))
               for tenant, pools in tenancy.tenant_pools.items()}
    return PoolTaints(taints=every, allowed=allowed)


# Kueue's controller (chart 0.19.2 installed as release "kueue": ServiceAccount kueue-controller-manager in Kueue's
# namespace) lifts its scheduling gate from the pods it admits and resumes the Jobs it admits.
KUEUE_SERVICE_ACCOUNT = "kueue-controller-manager"


def kueue_user(namespace: str = "kueue-system", service_account: str = KUEUE_SERVICE_ACCOUNT) -> str:
    return f"system:serviceaccount:{namespace}:{service_account}"


# The Job controller creates the pods of a Job Kueue admitted (by resuming the Job); Kueue gates none of them. Under
# --use-service-account-credentials it is its own service account, otherwise the controller manager.
JOB_CONTROLLER_USERS = ("system:serviceaccount:kube-system:job-controller", "system:kube-controller-manager")


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


def _lit(value: str) -> str:
    """A CEL string literal of a name gpushare wrote (label keys and values, resource and env names)."""
    if "'" in value or "\\" in value:
        raise ValueError(f"{value!r} cannot be a CEL literal here")
    return f"'{value}'"


def _strings(values: list[str] | tuple[str, ...]) -> str:
    return "[" + ", ".join(_lit(v) for v in values) + "]"


def _labels(obj: str) -> str:
    return f"(has({obj}.metadata.labels) ? {obj}.metadata.labels : {{}})"


def _template_labels(template: str) -> str:
    return f"(has({template}.metadata) && has({template}.metadata.labels) ? {template}.metadata.labels : {{}})"


def _label(labels: str, key: str) -> str:
    return f"({_lit(key)} in {labels} ? {labels}[{_lit(key)}] : '')"


_TENANT_NAME = (f"(has(namespaceObject.metadata.labels) && '{TENANT_LABEL}' in namespaceObject.metadata.labels ? "
                f"namespaceObject.metadata.labels['{TENANT_LABEL}'] : '')")
_ONLINE_NAMESPACE = (f"(has(namespaceObject.metadata.labels) && '{PRIORITY_LABEL}' in namespaceObject.metadata.labels "
                     f"&& namespaceObject.metadata.labels['{PRIORITY_LABEL}'] == 'online')")

# ---- scheduling: tolerations of other pools' taints, pod affinity across namespaces

_TOLERATION_VALUE = "(has(t.value) ? t.value : '')"
_TOLERATION_EFFECT = "(has(t.effect) ? t.effect : '')"
_TOLERATES_EVERYTHING = f"({_TOLERATION_KEY} == '' && {_TOLERATION_OPERATOR} == 'Exists')"


def _tolerates(taint: str) -> str:
    """Kubernetes' matching of toleration `t` to a taint (the key-less Exists, matching all, is judged apart)."""
    return (f"({_TOLERATION_KEY} == {taint}.key && ({_TOLERATION_OPERATOR} == 'Exists' || "
            f"{_TOLERATION_VALUE} == {taint}.value) && ({_TOLERATION_EFFECT} == '' || "
            f"{_TOLERATION_EFFECT} == {taint}.effect))")


def _taint_id(key: str, value: str, effect: str) -> str:
    return f"{key}={value}:{effect}"


# Taint keys an untrusted tenant's toleration may name beside its own pools' (NODE_CONDITION_TAINT_PREFIX: any key
# under it): Kubernetes' node-condition taints (not-ready, unreachable, the pressure ones, unschedulable,
# network-unavailable), which say what state a node is in rather than whom it is for (the API server adds not-ready
# and unreachable to every pod, the DaemonSet controller the others to its pods), and nvidia.com/gpu, which GPU nodes
# carry on GKE for every GPU workload (its ExtendedResourceToleration admission plugin adds the toleration to pods
# that request nvidia.com/gpu).
NODE_CONDITION_TAINT_PREFIX = "node.kubernetes.io/"
GENERIC_GPU_TAINT_KEYS = ("nvidia.com/gpu",)


def _pool_toleration_policy(pools: PoolTaints) -> dict[str, Any]:
    taints = "[" + ", ".join(f"{{'key': {_lit(k)}, 'value': {_lit(v)}, 'effect': {_lit(e)}}}"
                             for k, v, e in pools.taints) + "]"
    # `tenant/key=value:effect`: tenant names are DNS labels, so the pair cannot be read two ways.
    allowed = sorted(f"{tenant}/{_taint_id(*t)}" for tenant, own in pools.allowed.items() for t in own)
    own = f"(variables.tenantName + '/' + x.key + '=' + x.value + ':' + x.effect) in {_strings(allowed)}"
    own_keys = sorted({f"{tenant}/{key}" for tenant, mine in pools.allowed.items() for key, _, _ in mine})
    known_key = (f"{_TOLERATION_KEY}.startsWith({_lit(NODE_CONDITION_TAINT_PREFIX)}) || "
                 f"{_TOLERATION_KEY} in {_strings(GENERIC_GPU_TAINT_KEYS)} || "
                 f"(variables.tenantName + '/' + {_TOLERATION_KEY}) in {_strings(own_keys)}")
    return {
        "bindings": [("", UNTRUSTED_ONLY, ["Deny"])],
        "variables": [{"name": "tenantName", "expression": _TENANT_NAME}],
        "validations": [
            {
                "expression": "!variables.untrusted || " + _each_new(
                    "tolerations", "t", f"{taints}.all(x, {own} || !{_tolerates('x')})"),
                "message": "untrusted tenants may tolerate only the taints of the pools their quota is in (a "
                           "gpushare.io/pool or other taint of another pool lets a pod, a CPU-only one too, onto "
                           "nodes dedicated to other tenants): remove the toleration; Kueue adds the tolerations of "
                           "the pool it admits a workload onto",
                "reason": "Forbidden",
            },
            {
                "expression": "!variables.untrusted || " + _each_new("tolerations", "t", f"!{_TOLERATES_EVERYTHING}"),
                "message": "untrusted tenants may not tolerate every taint at once (a toleration with no key and "
                           "operator Exists reaches every pool's nodes): tolerate the taints you need by key",
                "reason": "Forbidden",
            },
            {
                # Taints that are no pool's (the control plane's node-role.kubernetes.io/control-plane, a site's
                # own dedicated nodes) keep nodes for someone: only the keys above and the tenant's pools' pass.
                "expression": "!variables.untrusted || " + _each_new("tolerations", "t", known_key),
                "message": "untrusted tenants may tolerate only the taints of the pools their quota is in, "
                           f"Kubernetes' node-condition taints ({NODE_CONDITION_TAINT_PREFIX}*) and "
                           f"{', '.join(GENERIC_GPU_TAINT_KEYS)}: another taint (node-role.kubernetes.io/"
                           "control-plane, a site's dedicated nodes) keeps its nodes for other workloads: remove the "
                           "toleration; Kueue adds the tolerations of the pool it admits a workload onto",
                "reason": "Forbidden",
            },
        ],
    }


def _affinity_terms(affinity: str) -> str:
    """Every pod (anti-)affinity term of an affinity: required ones and the terms of preferred ones."""
    parts = []
    for kind in ("podAffinity", "podAntiAffinity"):
        rules = f"{affinity}.{kind}"
        parts.append(f"(has({rules}) && has({rules}.requiredDuringSchedulingIgnoredDuringExecution) ? "
                     f"{rules}.requiredDuringSchedulingIgnoredDuringExecution : [])")
        parts.append(f"(has({rules}) && has({rules}.preferredDuringSchedulingIgnoredDuringExecution) ? "
                     f"{rules}.preferredDuringSchedulingIgnoredDuringExecution.map(w, w.podAffinityTerm) : [])")
    return " + ".join(parts)


_AFFINITY_VARIABLES = [
    {"name": "affinity", "expression": "has(variables.podSpec.affinity) ? variables.podSpec.affinity : {}"},
    {"name": "oldAffinity", "expression": "has(variables.oldPodSpec.affinity) ? variables.oldPodSpec.affinity : {}"},
    {"name": "affinityTerms", "expression": _affinity_terms("variables.affinity")},
    {"name": "oldAffinityTerms", "expression": _affinity_terms("variables.oldAffinity")},
]

# ---- queues: GPU work through Kueue, its gate and suspension lifted by Kueue alone


def _gpu_resource(key: str) -> str:
    return f"({key}.startsWith('nvidia.com/') || {key}.startsWith('{IMPLICIT_EXTENDED_PREFIX}'))"


def _asks_for_gpus(containers: str, claims: str) -> str:
    return (f"{containers}.exists(c, has(c.resources) && ("
            f"(has(c.resources.limits) && c.resources.limits.exists(k, {_gpu_resource('k')})) || "
            f"(has(c.resources.requests) && c.resources.requests.exists(k, {_gpu_resource('k')})))) || "
            f"size({claims}) > 0")


def _queue_name(obj: str) -> str:
    """The LocalQueue Kueue queues the object's pods by, read where Kueue 0.19 reads it: a Pod's and a Job's own
    label, a CronJob's job template, a Deployment's or StatefulSet's own label (else their pods', which Kueue then
    queues one by one), and a ReplicaSet's or DaemonSet's pod template (Kueue manages neither; their pods are plain
    pods to it)."""
    own = _labels(obj)
    cron = _template_labels(f"{obj}.spec.jobTemplate")
    template = _template_labels(f"{obj}.spec.template")
    return (f"({obj}.kind in ['Pod', 'Job'] ? {_label(own, QUEUE_LABEL)} : "
            f"{obj}.kind == 'CronJob' ? {_label(cron, QUEUE_LABEL)} : "
            f"{obj}.kind in ['Deployment', 'StatefulSet'] && '{QUEUE_LABEL}' in {own} ? {own}['{QUEUE_LABEL}'] : "
            f"{_label(template, QUEUE_LABEL)})")


def _has_gate(spec: str) -> str:
    return f"(has({spec}.schedulingGates) && {spec}.schedulingGates.exists(g, g.name == '{KUEUE_GATE}'))"


def _suspended(obj: str) -> str:
    return f"({obj}.kind == 'Job' && has({obj}.spec.suspend) && {obj}.spec.suspend)"


# Fields only some kinds have are read in variables: the API server type-checks each validation against every
# kind the policy matches (and warns of `spec.suspend` on a Pod), however the expression guards the kind.
_QUEUE_VARIABLES = [
    {"name": "gpu", "expression": _asks_for_gpus("variables.containers", "variables.resourceClaims")},
    {"name": "oldGpu", "expression": _asks_for_gpus("variables.oldContainers", "variables.oldResourceClaims")},
    {"name": "queueName", "expression": _queue_name("object")},
    {"name": "oldQueueName", "expression": f"variables.isUpdate ? {_queue_name('oldObject')} : ''"},
    {"name": "gated", "expression": _has_gate("variables.podSpec")},
    {"name": "wasGated", "expression": f"variables.isUpdate && {_has_gate('variables.oldPodSpec')}"},
    {"name": "suspended", "expression": _suspended("object")},
    {"name": "wasSuspended", "expression": f"variables.isUpdate && {_suspended('oldObject')}"},
]
_QUEUE_HOW = (f"label it {QUEUE_LABEL}: {LOCAL_QUEUE} (a Pod, Job, Deployment or StatefulSet itself, a CronJob's "
              "jobTemplate, a ReplicaSet's or DaemonSet's pod template)")
_WAITING = "`kubectl get workloads -n <namespace>` shows why the workload waits"


def _queue_policy(kueue: str) -> dict[str, Any]:
    """Kueue holds a tenant's GPU quota, its borrowing and the online work's reclaim: GPU work runs through it."""
    # A pod of a Job, which Kueue leaves ungated and unlabelled: the Job it comes from was judged and queued.
    job_pod = (f"object.kind == 'Pod' && request.operation == 'CREATE' && "
               f"request.userInfo.username in {_strings(JOB_CONTROLLER_USERS)} && "
               "has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(o, "
               "has(o.controller) && o.controller && o.kind == 'Job')")
    return {
        "variables": [*_QUEUE_VARIABLES, {"name": "jobPod", "expression": job_pod}],
        "validations": [
            {
                "expression": f"!variables.gpu || variables.jobPod || variables.queueName == '{LOCAL_QUEUE}' || "
                              "(variables.isUpdate && variables.oldGpu && variables.queueName == "
                              "variables.oldQueueName)",
                "message": "GPU workloads in tenant namespaces run through Kueue, which holds the tenant's quota, "
                           f"borrowing and priority: {_QUEUE_HOW}",
                "reason": "Forbidden",
            },
            {
                # Kueue's webhook gates the pods it manages; a pod of a Job comes from the Job controller instead
                # (a pod whose ownerReferences a tenant wrote would otherwise look like one to Kueue).
                "expression": "object.kind != 'Pod' || request.operation != 'CREATE' || !variables.gpu || "
                              "variables.gated || variables.jobPod",
                "message": f"a GPU pod starts gated by Kueue ({KUEUE_GATE}, added by Kueue's webhook) until Kueue "
                           "admits it; this one is not, so no queue would count it: "
                           f"{_QUEUE_HOW}, and set no ownerReferences on pods you create (a Job's pods come from "
                           "the Job controller)",
                "reason": "Forbidden",
            },
            {
                "expression": "object.kind != 'Job' || request.operation != 'CREATE' || !variables.gpu || "
                              "variables.suspended",
                "message": "a GPU Job starts suspended until Kueue admits it (Kueue's webhook suspends the Jobs "
                           f"labelled {QUEUE_LABEL}); this one is not, so it would run outside the queue: label the "
                           f"Job {QUEUE_LABEL}: {LOCAL_QUEUE} and leave spec.suspend to Kueue",
                "reason": "Forbidden",
            },
            {
                "expression": "object.kind != 'Pod' || !variables.wasGated || variables.gated || "
                              f"request.userInfo.username == {_lit(kueue)}",
                "message": f"only Kueue lifts its scheduling gate {KUEUE_GATE}, when it admits the workload: leave "
                           f"spec.schedulingGates as they are ({_WAITING})",
                "reason": "Forbidden",
            },
            {
                "expression": "!variables.wasSuspended || variables.suspended || "
                              "!(variables.gpu || variables.oldQueueName != '') || "
                              f"request.userInfo.username == {_lit(kueue)}",
                "message": "only Kueue resumes a queued Job (spec.suspend: false), when it admits it: leave "
                           f"spec.suspend to Kueue ({_WAITING})",
                "reason": "Forbidden",
            },
        ],
    }


# ---- priority: Kueue's WorkloadPriorityClass label, wherever Kueue or its webhooks read it

def _workload_priorities(obj: str) -> str:
    """Every WorkloadPriorityClass label of the object: its own, its pod template's, a CronJob's job template's."""
    def pick(labels: str) -> str:
        return f"({_lit(WORKLOAD_PRIORITY_LABEL)} in {labels} ? [{labels}[{_lit(WORKLOAD_PRIORITY_LABEL)}]] : [])"
    cron = pick(_template_labels(f"{obj}.spec.jobTemplate")) + " + " + pick(
        _template_labels(f"{obj}.spec.jobTemplate.spec.template"))
    return (f"{pick(_labels(obj))} + ({obj}.kind == 'Pod' ? [] : {obj}.kind == 'CronJob' ? {cron} : "
            f"{pick(_template_labels(f'{obj}.spec.template'))})")


_PRIORITY_VARIABLES = [
    {"name": "workloadPriorities", "expression": _workload_priorities("object")},
    {"name": "oldWorkloadPriorities",
     "expression": f"variables.isUpdate ? {_workload_priorities('oldObject')} : []"},
]

# ---- claims a controller creates: a StatefulSet's volumeClaimTemplates (read in variables, as spec.suspend is)


def _claim_templates(obj: str) -> str:
    return (f"({obj}.kind == 'StatefulSet' && has({obj}.spec.volumeClaimTemplates) ? "
            f"{obj}.spec.volumeClaimTemplates : [])")


_CLAIM_TEMPLATE_VARIABLES = [
    {"name": "volumeClaimTemplates", "expression": _claim_templates("object")},
    {"name": "oldVolumeClaimTemplates",
     "expression": f"variables.isUpdate ? {_claim_templates('oldObject')} : []"},
]

# ---- the NVIDIA container toolkit's and the MPS client's environment

# The toolkit (1.18) reads NVIDIA_* from a container's environment: capabilities (driver libraries and binaries
# mounted), MIG config and monitor devices, IMEX channels, GDS, MOFED, NVSWITCH and GDRCOPY devices; CUDA_VERSION
# without NVIDIA_REQUIRE_CUDA marks a legacy image, which gets every capability. CUDA_MPS_* point a CUDA client at
# an MPS daemon. What stays allowed narrows the surface: requirements (non-empty: an empty NVIDIA_REQUIRE_CUDA would
# make a CUDA image legacy), not checking them (only the tenant's own container fails), and the default capabilities.
_DRIVER_ENV_FAMILIES = ("NVIDIA_", "CUDA_")
_DRIVER_CAPABILITIES = "NVIDIA_DRIVER_CAPABILITIES"
_BENIGN_CAPABILITIES = ("", "compute", "utility", "compute,utility", "utility,compute")


def _driver_env_ok(name: str, literal: str, value: str, visible_devices_ok: bool = True) -> str:
    """CEL: the variable `name` set to `value` (known where `literal` holds) leaves the driver surface as it is."""
    free = ["NVIDIA_DISABLE_REQUIRE", *([VISIBLE_DEVICES_ENV] if visible_devices_ok else [])]
    return (f"!({name}.startsWith('NVIDIA_') || {name}.startsWith('CUDA_MPS_') || {name} == 'CUDA_VERSION') || "
            f"{name} in {_strings(free)} || ({literal} && (({name}.startsWith('NVIDIA_REQUIRE_') && {value} != '') "
            f"|| ({name} == '{_DRIVER_CAPABILITIES}' && {value} in {_strings(_BENIGN_CAPABILITIES)})))")


_ENV_VALUE = "(has(e.value) ? e.value : '')"
_DRIVER_ENV_RULE = ("NVIDIA_* variables (driver capabilities beyond compute and utility, MIG config or monitor "
                    "devices, IMEX channels, GDS, MOFED, NVSWITCH or GDRCOPY devices), CUDA_VERSION and CUDA_MPS_* "
                    "(an MPS daemon's pipe or log directory) widen what the NVIDIA container toolkit and the CUDA "
                    "client reach beyond the allocated GPU")
_DRIVER_ENV_FIX = (f"remove them; NVIDIA_REQUIRE_* (non-empty), NVIDIA_DISABLE_REQUIRE and {_DRIVER_CAPABILITIES} "
                   "with compute and utility stay allowed")


# Bindings by trust: a label selector's NotIn also matches namespaces without the label (so: untrusted).
ALL_TENANTS = "all"
UNTRUSTED_ONLY = "untrusted"
TRUSTED_ONLY = "trusted"

def _priority_policy(names: dict[str, str]) -> dict[str, Any]:
    """Tenant pods name the PriorityClass of their tenant's priority (`names`: gpushare's own, or the cluster's own
    an adopted environment keeps, adoption.priority_classes); Kueue workloads gpushare's WorkloadPriorityClasses."""
    online, batch = names["online"], names["batch"]
    return {
        # The namespace's priority label is the environment file's; only the deployer changes it (namespace policy).
        "variables": _PRIORITY_VARIABLES,
        "validations": [
            {
                "expression": f"(variables.isUpdate && {_PRIORITY} == {_OLD_PRIORITY}) || "
                              f"({_PRIORITY} in ['{online}', '{batch}'] && "
                              f"({_PRIORITY} != '{online}' || {_ONLINE_NAMESPACE}))",
                "message": f"pods and pod templates in tenant namespaces use {batch}, or {online} where the "
                           "tenant's priority is online: set spec.priorityClassName to one of them (the environment "
                           "file sets the tenant's priority)",
                "reason": "Forbidden",
            },
            {
                "expression": _each_new("workloadPriorities", "p", f"p == '{PRIORITY_CLASSES['batch']}' || "
                                        f"(p == '{PRIORITY_CLASSES['online']}' && {_ONLINE_NAMESPACE})"),
                "message": f"Kueue orders, preempts and reclaims by the WorkloadPriorityClass in "
                           f"{WORKLOAD_PRIORITY_LABEL}: set it to {PRIORITY_CLASSES['batch']}, or "
                           f"{PRIORITY_CLASSES['online']} where the tenant's priority is online, or leave it out "
                           "(Kueue then reads the pods' priority class)",
                "reason": "Forbidden",
            },
        ],
    }


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


# ---------------------------------------------------------------- DRA clusters (docs/dra.md)

_NO_CLAIMS_POLICY = "gpushare-no-resource-claims"


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
                           "only those of MIG or exclusive profiles); shared claims (resourceClaimName) are refused: "
                           "reference one of those templates (`kubectl get resourceclaimtemplates` in the namespace "
                           "lists them)",
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


# ---------------------------------------------------------------- data an envFrom can hand to a container

def _data_keys_ok(name: str, literal: str, kept: bool) -> str:
    """Every key of the map variable `name` is harmless as an environment variable, or (`kept`) an UPDATE leaves it
    as it was. Map lookups, not list scans: a ConfigMap may hold many keys."""
    # string(): on a Secret the type checker sees this map's values as bytes (it never is a Secret's at run time).
    value = f"string(variables.{name}[k])" if literal != "false" else "''"
    old = "old" + name[0].upper() + name[1:]
    keep = (f"(k in variables.{old} && variables.{old}[k] == variables.{name}[k]) || ") if kept else ""
    return f"variables.{name}.all(k, {keep}{_driver_env_ok('k', literal, value, visible_devices_ok=False)})"


# (variable, kind, field): a ConfigMap's data is text, a Secret's bytes; each map is read for its own kind only, in
# variables, so no validation meets a field (or a value type) its kind does not have.
_DATA_MAPS = (("configMapData", "ConfigMap", "data"), ("binaryData", "ConfigMap", "binaryData"),
              ("secretData", "Secret", "data"), ("stringData", "Secret", "stringData"))


def _data_variables() -> list[dict[str, str]]:
    out = []
    for name, kind, key in _DATA_MAPS:
        old = "old" + name[0].upper() + name[1:]
        out.append({"name": name, "expression": f"object.kind == '{kind}' && has(object.{key}) ? "
                                                f"object.{key} : {{}}"})
        out.append({"name": old, "expression": f"request.operation == 'UPDATE' && oldObject.kind == '{kind}' && "
                                               f"has(oldObject.{key}) ? oldObject.{key} : {{}}"})
    return out


# ConfigMaps' and Secrets' keys become variables through envFrom, which the workload policies cannot read: judged
# where they are written. A ConfigMap's data is plain text, so its capabilities value can be checked; a Secret's and
# binaryData are not read (a Secret's data is base64).
DATA_POLICIES: dict[str, dict[str, Any]] = {
    "gpushare-untrusted-no-driver-env-data": {
        "validations": [{
            # stringData is write-only (merged into data before it is stored): no old value to keep.
            "expression": " && ".join([_data_keys_ok("configMapData", "true", kept=True),
                                       _data_keys_ok("binaryData", "false", kept=True),
                                       _data_keys_ok("secretData", "false", kept=True),
                                       _data_keys_ok("stringData", "false", kept=False)]),
            "message": f"ConfigMaps and Secrets of untrusted tenants may not hold keys named {VISIBLE_DEVICES_ENV} or "
                       f"like the other variables envFrom would hand to the NVIDIA container toolkit unseen "
                       f"({_DRIVER_ENV_RULE}): rename the key (e.g. APP_<name>); NVIDIA_REQUIRE_* and "
                       f"{_DRIVER_CAPABILITIES}=compute,utility may stay in a ConfigMap",
            "reason": "Forbidden",
        }],
    },
}

# ---------------------------------------------------------------- namespace policies

def _guarded(key: str) -> str:
    return (f"({key} in ['{TRUST_LABEL}', '{TENANT_LABEL}', '{PRIORITY_LABEL}'] || "
            f"{key}.startsWith('{POD_SECURITY_PREFIX}'))")


# A binding's namespaceSelector reads a Namespace's new labels, so removing the tenant label would escape it:
# these policies match every namespace and select tenant ones (before or after the change) with a condition.
_TENANT_NAMESPACE_CONDITION = {
    "name": "tenant-namespace",
    "expression": f"'{TENANT_LABEL}' in {_labels('object')} || "
                  f"(request.operation == 'UPDATE' && '{TENANT_LABEL}' in {_labels('oldObject')})",
}

# The API server stores a Namespace's metadata from writes to namespaces/status and namespaces/finalize as well (a
# status write keeps only the old spec, a finalize only the old status): RBAC granting either reaches the labels.
_NAMESPACE_RULES = [
    {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["namespaces"], "operations": ["CREATE", "UPDATE"]},
    {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["namespaces/status", "namespaces/finalize"],
     "operations": ["UPDATE"]},
]

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
            "message": f"only gpushare's deployer sets a tenant namespace's {TRUST_LABEL}, {TENANT_LABEL}, "
                       f"{PRIORITY_LABEL} and {POD_SECURITY_PREFIX}* labels (admission trusts them): change the "
                       "tenant in the environment file instead",
            "reason": "Forbidden",
        }],
    },
    "gpushare-tenant-namespace-no-dra-admin": {
        "deployer_exempt": False,
        "validations": [{
            # Through a subresource it may stay as it was: the namespace controller's finalize of a namespace that
            # carried it before the policies must not leave the namespace terminating for ever.
            "expression": f"!('{DRA_ADMIN_ACCESS_LABEL}' in variables.labels) || (request.subResource != '' && "
                          f"'{DRA_ADMIN_ACCESS_LABEL}' in variables.oldLabels && "
                          f"variables.oldLabels['{DRA_ADMIN_ACCESS_LABEL}'] == "
                          f"variables.labels['{DRA_ADMIN_ACCESS_LABEL}'])",
            "message": f"tenant namespaces never carry {DRA_ADMIN_ACCESS_LABEL}: DRA admin access reaches devices "
                       "that other pods hold: remove the label (device monitoring runs outside tenant namespaces)",
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
                      kueue: str | None = None, priority_classes: dict[str, str] | None = None
                      ) -> dict[str, dict[str, Any]]:
    """The workload policies of a cluster: device-plugin clusters refuse every claim, DRA clusters judge them; the
    pool tolerations follow the cluster's pools, the queue policy names the cluster's Kueue, the priority policy
    the PriorityClasses tenants use."""
    out = dict(POLICIES)
    if priority_classes is not None:
        out["gpushare-tenant-priority-class"] = _priority_policy(priority_classes)
    if pools is not None:
        out["gpushare-untrusted-pool-tolerations"] = _pool_toleration_policy(pools)
    if kueue is not None:
        out["gpushare-gpu-pods-queued"] = _queue_policy(kueue)
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
                      priority_classes: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy and binding objects, as Kubernetes manifests. `system_namespaces` adds the
    namespaces a stack deploys infrastructure into (operator, Kueue, monitoring) to those never selected; `dra`
    (DRA clusters only) the claim templates tenants may reference; `pools` the cluster's pool taints (pool_taints;
    none by default); `kueue` the user name of Kueue's controller (kueue_user; the installed chart's by default);
    `enforcement` the environment's admission stage (`warn` on an adopted cluster: staged_actions);
    `priority_classes` the PriorityClass of each priority (gpushare's own by default)."""
    deployer = deployer or Deployer()
    excluded = excluded_namespaces(system_namespaces)
    out: list[dict[str, Any]] = []

    def _binding(name: str, policy: str, actions: list[str], match: dict[str, Any] | None) -> dict[str, Any]:
        return _bound(name, policy, staged_actions(actions, enforcement), match)

    for name, policy in workload_policies(dra, pools, kueue, priority_classes).items():
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
