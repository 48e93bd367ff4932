"""The attack suite: pods and controllers a tenant might submit, allowed and denied, through gpushare's admission
policies as an API server applies them (rules, match conditions, bindings by namespace labels), with every CEL
expression evaluated by both engines. Namespaces are the ones gpushare renders for the frozen fixture's tenants:
`partner` (untrusted), `serving` (trusted, online), `lab` (trusted, restricted)."""

from __future__ import annotations

import base64
import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kubernetes_validate
import pytest

from gpushare.core.namespaces import KUEUE_GATE, QUEUE_LABEL, TRUST_LABEL, WORKLOAD_PRIORITY_LABEL
from gpushare.policy.admission import (
    DATA_POLICIES,
    JOB_CONTROLLER_USERS,
    JOBSETS_POLICY,
    POLICIES,
    jobset_user,
    kueue_user,
)
from tests.security.cel_admission import Request, admit, namespace
from tests.security.tenants import (
    CONTROLLERS,
    controller,
    example_pod,
    jobset,
    kueue_webhook,
    policy_objects,
    tenant_namespace,
)

ALLOW = "allow"


def ns_for(tenant: str, trust: str | None = "keep") -> dict[str, Any]:
    """The tenant's namespace; `trust` overrides the trust label (None removes it), as if someone had edited it."""
    ns = tenant_namespace(tenant)
    labels = dict(ns["metadata"]["labels"])
    if trust is None:
        labels.pop(TRUST_LABEL)
    elif trust != "keep":
        labels[TRUST_LABEL] = trust
    return namespace(ns["metadata"]["name"], labels)


def pod(tenant: str = "partner", change: Callable[[dict[str, Any]], Any] | None = None) -> dict[str, Any]:
    """The example untrusted pod, moved to the tenant's namespace, with one change applied to it."""
    out = example_pod()
    out["metadata"]["namespace"] = tenant_namespace(tenant)["metadata"]["name"]
    if change is not None:
        change(out)
    return out


def main(p: dict[str, Any]) -> dict[str, Any]:
    return p["spec"]["containers"][0]


def host_path(path: str) -> Callable[[dict[str, Any]], None]:
    def change(p: dict[str, Any]) -> None:
        p["spec"]["volumes"] = [{"name": "host", "hostPath": {"path": path}}]
        main(p)["volumeMounts"] = [{"name": "host", "mountPath": "/host"}]
    return change


def init_container(**fields: Any) -> Callable[[dict[str, Any]], None]:
    def change(p: dict[str, Any]) -> None:
        p["spec"]["initContainers"] = [{"name": "setup", "image": "busybox:1.36", **copy.deepcopy(fields)}]
    return change


def ephemeral(**fields: Any) -> dict[str, Any]:
    return {"name": "debugger", "image": "busybox:1.36", "targetContainerName": "eval", **copy.deepcopy(fields)}


def setter(*path: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(p: dict[str, Any]) -> None:
        target = p
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = copy.deepcopy(value)
    return change


def limits(**resources: Any) -> Callable[[dict[str, Any]], None]:
    return setter("spec", "containers", 0, "resources", "limits", value=resources)


def tolerate(*tolerations: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return setter("spec", "tolerations", value=list(tolerations))


def env(*entries: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return setter("spec", "containers", 0, "env", value=list(entries))


def cpu_only(p: dict[str, Any]) -> None:
    """The example pod without its GPU (and so without a queue: Kueue counts GPUs only)."""
    del main(p)["resources"]["limits"]["nvidia.com/mig-1g.10gb"]
    p["metadata"]["labels"].pop(QUEUE_LABEL)


def then(*changes: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], None]:
    def change(p: dict[str, Any]) -> None:
        for c in changes:
            c(p)
    return change


def node_name(p: dict[str, Any]) -> None:
    """spec.nodeName on a pod no queue holds: the API server refuses it beside Kueue's scheduling gate anyway."""
    cpu_only(p)
    p["spec"]["nodeName"] = "gpu-node-1"


@dataclass
class Attack:
    id: str
    request: Callable[[], Request]
    expected: str  # ALLOW, "deny:<policy>" or "warn:<policy>"
    # policies that fire as well: envFrom's warning beside a denial of its prefix; the pool policy beside the
    # shared-pool one (shared pools carry the shared-GPU taint, which untrusted tenants' pools never do)
    also: tuple[str, ...] = ()


def create(tenant: str = "partner", change: Callable[[dict[str, Any]], Any] | None = None,
           trust: str | None = "keep", kind: str = "Pod", user: str = "alice") -> Callable[[], Request]:
    """A CREATE of the example pod (or a controller of it) with one change, as Kueue's webhooks leave it."""
    def build() -> Request:
        p = pod(tenant, change)
        obj = p if kind == "Pod" else controller(kind, p)
        return Request(kueue_webhook(obj), ns_for(tenant, trust), username=user)
    return build


def update(old_change: Callable[[dict[str, Any]], Any] | None, new_change: Callable[[dict[str, Any]], Any],
           tenant: str = "partner", sub_resource: str = "", kind: str = "Pod",
           user: str = "alice") -> Callable[[], Request]:
    """An UPDATE: the old object is the example pod (or a controller of it) with `old_change` as it was created,
    the new one that plus `new_change` (applied to the controller itself where it is not a pod)."""
    def build() -> Request:
        old = pod(tenant, old_change)
        if kind != "Pod":
            old = controller(kind, old)
        old = kueue_webhook(old)
        new = copy.deepcopy(old)
        new_change(new)
        return Request(new, ns_for(tenant), operation="UPDATE", old_object=old, sub_resource=sub_resource,
                       username=user)
    return build


def template(change: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], None]:
    """A change to a controller's pod template, as if the template were a pod."""
    def apply(obj: dict[str, Any]) -> None:
        change(obj["spec"]["template"])
    return apply


def _every_bad_thing(p: dict[str, Any]) -> None:
    """A pod from before the policies: bound, privileged, shared, with CDI annotations and outside any queue."""
    p["metadata"]["labels"].pop(QUEUE_LABEL)
    for change in (host_path("/"), setter("spec", "nodeName", value="gpu-node-1"),
                   privileged_main,
                   limits(**{"nvidia.com/gpu.shared": 1}),
                   setter("metadata", "annotations", value={"cdi.k8s.io/x": "nvidia.com/gpu=all"})):
        change(p)


def _add_label(p: dict[str, Any]) -> None:
    p["metadata"].setdefault("labels", {})["audit"] = "done"


def _add_finalizer(p: dict[str, Any]) -> None:
    p["metadata"]["finalizers"] = ["example.com/keep"]


def _add_ephemeral(**fields: Any) -> Callable[[dict[str, Any]], None]:
    def change(p: dict[str, Any]) -> None:
        p["spec"].setdefault("ephemeralContainers", []).append(ephemeral(**fields))
    return change


def _bump_image(p: dict[str, Any]) -> None:
    main(p)["image"] = "nvcr.io/nvidia/cuda:12.9.0-base-ubuntu24.04"


HOST_PATHS = ["/", "/run", "/var/run/nvidia/driver", "/etc/cdi", "/dev/", "/dev/./nvidia0", "/dev//nvidia0",
              "/var/lib/kubelet/device-plugins", "/proc/driver/nvidia", "/sys/bus/pci", "/usr/lib/x86_64-linux-gnu",
              "/usr/lib64", "/home/kubernetes/bin/nvidia", "/tmp/scratch"]
SHARED = {"nvidia.com/gpu.shared": 1}
CDI = {"cdi.k8s.io/devices": "nvidia.com/gpu=all"}
PRIVILEGED = {"securityContext": {"privileged": True}}


def privileged_main(p: dict[str, Any]) -> None:
    """The main container privileged. The API server refuses privileged beside allowPrivilegeEscalation: false
    (the example pod's) as invalid before any admission, so the attack lifts that too."""
    main(p)["securityContext"].update(privileged=True, allowPrivilegeEscalation=True)

ATTACKS: list[Attack] = [
    # allowed: the example pod and ordinary trusted work
    Attack("example-pod-untrusted", create(), ALLOW),
    Attack("example-pod-trusted", create("serving"), ALLOW),
    Attack("trusted-shared-replica", create("serving", limits(**SHARED)), ALLOW),
    Attack("trusted-tolerates-shared-pool", create(
        "serving", tolerate({"key": "gpushare.io/shared-gpu", "operator": "Exists"})), ALLOW),
    Attack("untrusted-tolerates-gpu-taint", create(
        change=tolerate({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})), ALLOW),
    Attack("trusted-online-priority", create("serving", setter("spec", "priorityClassName",
                                                               value="gpushare-online")), ALLOW),
    Attack("trusted-node-name", create("serving", node_name), ALLOW),
    Attack("safe-volumes", create(change=setter("spec", "volumes", value=[
        {"name": "scratch", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "eval"}}])), ALLOW),
    # every hostPath, however spelt, in any tenant namespace
    *[Attack(f"host-path-{path}", create("serving", host_path(path)), "deny:gpushare-no-host-paths")
      for path in HOST_PATHS],
    Attack("host-path-untrusted", create(change=host_path("/dev/nvidia0")), "deny:gpushare-no-host-paths"),
    # privileged containers of every kind, host namespaces
    Attack("privileged-main", create("serving", privileged_main), "deny:gpushare-no-privileged-gpu-pods"),
    Attack("privileged-init", create("serving", init_container(**PRIVILEGED)),
           "deny:gpushare-no-privileged-gpu-pods"),
    # (ephemeral containers in a pod's spec on create: the API server refuses them as invalid before admission)
    Attack("privileged-ephemeral-kubectl-debug", update(None, _add_ephemeral(**PRIVILEGED), "serving",
                                                        "ephemeralcontainers"),
           "deny:gpushare-no-privileged-gpu-pods"),
    Attack("host-network", create("serving", setter("spec", "hostNetwork", value=True)),
           "deny:gpushare-no-privileged-gpu-pods"),
    Attack("host-pid", create("serving", setter("spec", "hostPID", value=True)),
           "deny:gpushare-no-privileged-gpu-pods"),
    Attack("host-ipc", create("serving", setter("spec", "hostIPC", value=True)),
           "deny:gpushare-no-privileged-gpu-pods"),
    # nodeName skips the scheduler and its taints; a missing or unknown trust label means untrusted
    Attack("node-name-untrusted", create(change=node_name), "deny:gpushare-untrusted-no-node-name"),
    *[Attack(f"node-name-trust-{label!r}", create("serving", node_name, trust=label),
             "deny:gpushare-untrusted-no-node-name")
      for label in (None, "Untrusted", "TRUSTED", "", "trusted-ish")],
    # CDI annotations on pods and templates
    Attack("cdi-annotation-pod", create("serving", setter("metadata", "annotations", value=CDI)),
           "deny:gpushare-no-cdi-annotations"),
    Attack("cdi-annotation-deployment-template", create("serving", setter("metadata", "annotations", value=CDI),
                                                        kind="Deployment"), "deny:gpushare-no-cdi-annotations"),
    Attack("cdi-annotation-added-later", update(None, setter("metadata", "annotations", value=CDI), "serving"),
           "deny:gpushare-no-cdi-annotations"),
    # DRA claims gpushare did not template
    Attack("claim-pod-level", create("serving", setter("spec", "resourceClaims", value=[
        {"name": "gpu", "resourceClaimName": "any-gpu"}])), "deny:gpushare-no-resource-claims"),
    # a container's claim must name one of the pod's (the API server refuses it as invalid otherwise)
    Attack("claim-container", create("serving", then(
        setter("spec", "resourceClaims", value=[{"name": "gpu", "resourceClaimTemplateName": "any-gpu"}]),
        setter("spec", "containers", 0, "resources", "claims", value=[{"name": "gpu"}]))),
        "deny:gpushare-no-resource-claims"),
    Attack("claim-job-template", create("serving", setter("spec", "resourceClaims", value=[
        {"name": "gpu", "resourceClaimTemplateName": "gpu"}]), kind="Job"), "deny:gpushare-no-resource-claims"),
    # shared replicas and shared-pool tolerations for untrusted tenants, in every container kind
    Attack("shared-limits", create(change=limits(**SHARED)), "deny:gpushare-untrusted-no-shared-gpus"),
    # an extended resource in requests needs the same in limits (the API server refuses it as invalid otherwise)
    Attack("shared-requests", create(change=then(
        setter("spec", "containers", 0, "resources", "requests", value={"nvidia.com/mig-1g.10gb.shared": 1}),
        setter("spec", "containers", 0, "resources", "limits", value={"nvidia.com/mig-1g.10gb.shared": 1}))),
           "deny:gpushare-untrusted-no-shared-gpus"),
    Attack("shared-init", create(change=init_container(resources={"limits": SHARED})),
           "deny:gpushare-untrusted-no-shared-gpus"),
    # (an ephemeral container with resources: the API server refuses it as invalid before admission)
    Attack("shared-cronjob-template", create(change=limits(**SHARED), kind="CronJob"),
           "deny:gpushare-untrusted-no-shared-gpus"),
    Attack("shared-missing-trust-label", create("serving", limits(**SHARED), trust=None),
           "deny:gpushare-untrusted-no-shared-gpus"),
    Attack("tolerate-shared-exists", create(change=tolerate({"key": "gpushare.io/shared-gpu", "operator": "Exists"})),
           "deny:gpushare-untrusted-no-shared-gpus", also=("gpushare-untrusted-pool-tolerations",)),
    Attack("tolerate-shared-equal", create(change=tolerate({"key": "gpushare.io/shared-gpu", "operator": "Equal",
                                                            "value": "true", "effect": "NoSchedule"})),
           "deny:gpushare-untrusted-no-shared-gpus", also=("gpushare-untrusted-pool-tolerations",)),
    Attack("tolerate-everything", create(change=tolerate({"operator": "Exists"})),
           "deny:gpushare-untrusted-pool-tolerations"),
    Attack("tolerate-everything-empty-key", create(change=tolerate({"key": "", "operator": "Exists"})),
           "deny:gpushare-untrusted-pool-tolerations"),
    Attack("tolerate-shared-added-later", update(None, tolerate({"key": "gpushare.io/shared-gpu",
                                                                 "operator": "Exists"})),
           "deny:gpushare-untrusted-no-shared-gpus", also=("gpushare-untrusted-pool-tolerations",)),
    # NVIDIA_VISIBLE_DEVICES: denied for untrusted, a warning for trusted; envFrom warns for untrusted
    Attack("visible-devices-untrusted", create(change=env({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})),
           "deny:gpushare-no-visible-devices-env"),
    Attack("visible-devices-init-untrusted", create(change=init_container(
        env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])), "deny:gpushare-no-visible-devices-env"),
    Attack("visible-devices-trusted", create("serving", env({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})),
           "warn:gpushare-no-visible-devices-env"),
    Attack("visible-devices-mis-cased-trust", create("serving", env({"name": "NVIDIA_VISIBLE_DEVICES",
                                                                     "value": "all"}), trust="Trusted"),
           "deny:gpushare-no-visible-devices-env"),
    Attack("env-from-untrusted", create(change=setter("spec", "containers", 0, "envFrom", value=[
        {"configMapRef": {"name": "settings"}}])), "warn:gpushare-untrusted-env-from"),
    Attack("env-from-trusted", create("serving", setter("spec", "containers", 0, "envFrom", value=[
        {"configMapRef": {"name": "settings"}}])), ALLOW),
    # priority classes, for pods and templates
    Attack("no-priority-class", create(change=lambda p: p["spec"].pop("priorityClassName")),
           "deny:gpushare-tenant-priority-class"),
    Attack("online-in-batch-tenant", create(change=setter("spec", "priorityClassName", value="gpushare-online")),
           "deny:gpushare-tenant-priority-class"),
    Attack("system-priority", create("serving", setter("spec", "priorityClassName", value="system-node-critical")),
           "deny:gpushare-tenant-priority-class"),
    Attack("no-priority-cronjob", create(change=lambda p: p["spec"].pop("priorityClassName"), kind="CronJob"),
           "deny:gpushare-tenant-priority-class"),
    # UPDATE is judged on what changed
    Attack("label-update-of-now-denied-pod", update(_every_bad_thing, _add_label), ALLOW),
    Attack("finalizer-update-of-now-denied-pod", update(_every_bad_thing, _add_finalizer), ALLOW),
    Attack("bound-pod-label-update", update(node_name, _add_label), ALLOW),
    Attack("unprivileged-debug-container", update(None, _add_ephemeral(
        securityContext={"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}),
        sub_resource="ephemeralcontainers"), ALLOW),
    Attack("image-change-of-privileged-container", update(privileged_main, _bump_image, "serving"),
        "deny:gpushare-no-privileged-gpu-pods"),
    Attack("deployment-update-adds-host-path", update(None, template(host_path("/etc/cdi")), "serving",
                                                      kind="Deployment"), "deny:gpushare-no-host-paths"),
    Attack("deployment-update-scales-only", update(host_path("/etc/cdi"), setter("spec", "replicas", value=3),
                                                   "serving", kind="Deployment"), ALLOW),
    Attack("deployment-update-changes-image", update(host_path("/etc/cdi"), template(_bump_image), "serving",
                                                     kind="Deployment"), ALLOW),
]
# every controller kind: a good template is admitted, a bad one refused when the controller is created
ATTACKS += [Attack(f"{kind.lower()}-allowed", create(kind=kind), ALLOW) for kind in CONTROLLERS]
ATTACKS += [Attack(f"{kind.lower()}-host-path", create(change=host_path("/"), kind=kind),
                   "deny:gpushare-no-host-paths") for kind in CONTROLLERS]
ATTACKS += [Attack(f"{kind.lower()}-privileged-init", create(change=init_container(**PRIVILEGED), kind=kind),
                   "deny:gpushare-no-privileged-gpu-pods") for kind in CONTROLLERS]
ATTACKS += [Attack(f"{kind.lower()}-node-name", create(change=setter("spec", "nodeName", value="n1"), kind=kind),
                   "deny:gpushare-untrusted-no-node-name") for kind in CONTROLLERS]


# ---- second round (issue 26): pools, affinity, queues, priority, runtime class, inline volumes, driver env

OWN_POOL = {"key": "gpushare.io/pool", "operator": "Equal", "value": "a100-mig", "effect": "NoSchedule"}
OTHER_POOL = {"key": "gpushare.io/pool", "operator": "Equal", "value": "l40s-shared", "effect": "NoSchedule"}
KUEUE = kueue_user()


def affinity(kind: str, term: dict[str, Any], preferred: bool = False) -> Callable[[dict[str, Any]], None]:
    term = {"labelSelector": {"matchLabels": {"app": "llm"}}, "topologyKey": "kubernetes.io/hostname", **term}
    rules = ({"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 50, "podAffinityTerm": term}]}
             if preferred else {"requiredDuringSchedulingIgnoredDuringExecution": [term]})
    return setter("spec", "affinity", value={kind: rules})


def label(key: str, value: str | None) -> Callable[[dict[str, Any]], None]:
    def change(p: dict[str, Any]) -> None:
        labels = p["metadata"].setdefault("labels", {})
        if value is None:
            labels.pop(key, None)
        else:
            labels[key] = value
    return change


def owned_by_job(p: dict[str, Any]) -> None:
    p["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": "eval", "controller": True,
                                         "blockOwnerDeletion": True, "uid": "6d1b8f1e-7c1a-4b8e-9a51-0f3c2d4e5f60"}]


def kueue_admits(p: dict[str, Any]) -> None:
    """What Kueue's pod controller patches when it admits a pod onto the a100-mig flavor."""
    p["spec"]["schedulingGates"] = [g for g in p["spec"]["schedulingGates"] if g["name"] != KUEUE_GATE]
    p["spec"]["nodeSelector"] = {"gpushare.io/pool": "a100-mig"}
    p["spec"].setdefault("tolerations", []).append(dict(OWN_POOL))


def lift_gate(p: dict[str, Any]) -> None:
    p["spec"]["schedulingGates"] = []


def resume(job: dict[str, Any]) -> None:
    job["spec"]["suspend"] = False


def in_template(change: Callable[[dict[str, Any]], Any], kind: str) -> Callable[[dict[str, Any]], None]:
    def apply(obj: dict[str, Any]) -> None:
        change(obj["spec"]["jobTemplate"]["spec"]["template"] if kind == "CronJob" else obj["spec"]["template"])
    return apply


def kueue_label_on(kind: str, key: str, value: str | None) -> Callable[[dict[str, Any]], None]:
    """A Kueue label set (None: removed) where controller() puts it for this kind."""
    def change(obj: dict[str, Any]) -> None:
        if kind == "CronJob":
            target = obj["spec"]["jobTemplate"]
        elif kind in ("ReplicaSet", "DaemonSet"):
            target = obj["spec"]["template"]
        else:
            target = obj
        label(key, value)(target)
    return change


def created(kind: str, tenant: str, change: Callable[[dict[str, Any]], Any]) -> Callable[[], Request]:
    """A controller of the example pod with a change to the controller itself (not its template)."""
    def build() -> Request:
        obj = controller(kind, pod(tenant))
        change(obj)
        return Request(kueue_webhook(obj), ns_for(tenant))
    return build


def env_var(name: str, value: str | None = None, **extra: Any) -> Callable[[dict[str, Any]], None]:
    entry: dict[str, Any] = {"name": name, **extra}
    if value is not None:
        entry["value"] = value
    return env(entry)


QUEUED = "gpushare-gpu-pods-queued"
POOLS = "gpushare-untrusted-pool-tolerations"
AFFINITY = "gpushare-untrusted-pod-affinity"
PRIORITY = "gpushare-tenant-priority-class"
DRIVER_ENV = "gpushare-no-driver-env"
ENV_FROM = "gpushare-untrusted-env-from"
DATA = "gpushare-untrusted-no-driver-env-data"
WIDENING_ENV = {
    "NVIDIA_DRIVER_CAPABILITIES": "all", "NVIDIA_MIG_MONITOR_DEVICES": "all", "NVIDIA_MIG_CONFIG_DEVICES": "all",
    "NVIDIA_IMEX_CHANNELS": "0", "NVIDIA_GDS": "enabled", "NVIDIA_MOFED": "enabled", "NVIDIA_NVSWITCH": "enabled",
    "NVIDIA_GDRCOPY": "enabled", "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps", "CUDA_MPS_LOG_DIRECTORY": "/tmp/log",
    "CUDA_VERSION": "12.8.1", "NVIDIA_FUTURE_FEATURE": "enabled",
}
NARROWING_ENV = {"NVIDIA_DRIVER_CAPABILITIES": "compute,utility", "NVIDIA_REQUIRE_CUDA": "cuda>=12.0",
                 "NVIDIA_DISABLE_REQUIRE": "true", "CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}

ATTACKS += [
    # tolerations: an untrusted tenant's pods (CPU-only and DaemonSets' too) stay on the pools its quota is in
    Attack("untrusted-tolerates-own-pool", create(change=tolerate(OWN_POOL)), ALLOW),
    Attack("untrusted-tolerates-own-pool-every-effect", create(change=tolerate(
        {k: v for k, v in OWN_POOL.items() if k != "effect"})), ALLOW),
    Attack("untrusted-tolerates-other-pool", create(change=tolerate(OTHER_POOL)), f"deny:{POOLS}"),
    Attack("untrusted-tolerates-every-pool", create(change=tolerate(
        {"key": "gpushare.io/pool", "operator": "Exists"})), f"deny:{POOLS}"),
    Attack("untrusted-cpu-pod-tolerates-other-pool", create(change=then(cpu_only, tolerate(OTHER_POOL))),
           f"deny:{POOLS}"),
    Attack("untrusted-cpu-pod-tolerates-own-pool", create(change=then(cpu_only, tolerate(OWN_POOL))), ALLOW),
    Attack("untrusted-daemonset-tolerates-other-pool", create(change=tolerate(OTHER_POOL), kind="DaemonSet"),
           f"deny:{POOLS}"),
    Attack("untrusted-other-pool-toleration-added-later", update(None, tolerate(OTHER_POOL)), f"deny:{POOLS}"),
    Attack("trusted-tolerates-other-pool", create("serving", tolerate(OTHER_POOL, OWN_POOL)), ALLOW),
    # pod affinity: untrusted tenants' terms see their own namespace only
    Attack("untrusted-affinity-own-namespace", create(change=affinity("podAffinity", {})), ALLOW),
    Attack("untrusted-anti-affinity-own-namespace-named", create(change=affinity(
        "podAntiAffinity", {"namespaces": ["partner"]})), ALLOW),
    Attack("untrusted-affinity-namespace-selector", create(change=affinity(
        "podAffinity", {"namespaceSelector": {}})), f"deny:{AFFINITY}"),
    Attack("untrusted-affinity-other-namespace", create(change=affinity(
        "podAffinity", {"namespaces": ["serving"]})), f"deny:{AFFINITY}"),
    Attack("untrusted-preferred-anti-affinity-other-namespace", create(change=affinity(
        "podAntiAffinity", {"namespaces": ["partner", "serving"]}, preferred=True)), f"deny:{AFFINITY}"),
    Attack("untrusted-deployment-anti-affinity-selector", create(change=affinity(
        "podAntiAffinity", {"namespaceSelector": {"matchLabels": {"gpushare.io/tenant": "serving"}}}),
        kind="Deployment"), f"deny:{AFFINITY}"),
    Attack("trusted-affinity-namespace-selector", create("serving", affinity(
        "podAffinity", {"namespaceSelector": {}})), ALLOW),
    # queues: GPU work runs through Kueue, for trusted tenants too (their quota and borrowing live there)
    Attack("gpu-pod-without-queue-label", create(change=label(QUEUE_LABEL, None)), f"deny:{QUEUED}"),
    Attack("trusted-gpu-pod-without-queue-label", create("serving", label(QUEUE_LABEL, None)), f"deny:{QUEUED}"),
    Attack("gpu-pod-other-queue", create(change=label(QUEUE_LABEL, "tenant-serving")), f"deny:{QUEUED}"),
    Attack("cpu-pod-without-queue-label", create(change=cpu_only), ALLOW),
    Attack("gpu-pod-forged-job-owner", create(change=owned_by_job), f"deny:{QUEUED}"),
    *[Attack(f"job-controller-creates-job-pod-as-{user.rsplit(':', 1)[1]}",
             create(change=then(owned_by_job, label(QUEUE_LABEL, None)), user=user), ALLOW)
      for user in JOB_CONTROLLER_USERS],
    Attack("job-controller-identity-without-job-owner", create(
        change=label(QUEUE_LABEL, None), user=JOB_CONTROLLER_USERS[1]), f"deny:{QUEUED}"),
    *[Attack(f"gpu-{kind.lower()}-without-queue-label", created(kind, "partner", kueue_label_on(
        kind, QUEUE_LABEL, None)), f"deny:{QUEUED}") for kind in CONTROLLERS],
    Attack("job-queue-label-on-template-only", created("Job", "partner", then(
        kueue_label_on("Job", QUEUE_LABEL, None), in_template(label(QUEUE_LABEL, "gpushare"), "Job"))),
        f"deny:{QUEUED}"),
    Attack("deployment-queue-label-on-template-only", created("Deployment", "partner", then(
        kueue_label_on("Deployment", QUEUE_LABEL, None), in_template(label(QUEUE_LABEL, "gpushare"), "Deployment"))),
        ALLOW),
    Attack("tenant-lifts-kueue-gate", update(None, lift_gate), f"deny:{QUEUED}"),
    Attack("trusted-tenant-lifts-kueue-gate", update(None, lift_gate, "serving"), f"deny:{QUEUED}"),
    Attack("kueue-admits-pod-onto-its-pool", update(None, kueue_admits, user=KUEUE), ALLOW),
    Attack("queue-label-removed-from-gated-pod", update(None, label(QUEUE_LABEL, None)), f"deny:{QUEUED}"),
    Attack("tenant-resumes-queued-job", update(None, resume, kind="Job"), f"deny:{QUEUED}"),
    Attack("kueue-resumes-queued-job", update(None, resume, kind="Job", user=KUEUE), ALLOW),
    Attack("tenant-resumes-own-cpu-job", update(cpu_only, resume, kind="Job"), ALLOW),
    # priority: Kueue's WorkloadPriorityClass label, like the priority class, follows the tenant's priority
    *[Attack(f"batch-tenant-{kind.lower()}-online-workload-priority", created(kind, "partner", kueue_label_on(
        kind, WORKLOAD_PRIORITY_LABEL, "gpushare-online")), f"deny:{PRIORITY}") for kind in CONTROLLERS],
    Attack("batch-tenant-pod-online-workload-priority", create(change=label(WORKLOAD_PRIORITY_LABEL,
                                                                            "gpushare-online")), f"deny:{PRIORITY}"),
    Attack("batch-tenant-cronjob-pod-template-online-workload-priority", create(
        change=label(WORKLOAD_PRIORITY_LABEL, None), kind="CronJob"), ALLOW),
    Attack("cronjob-pod-template-online-workload-priority", created("CronJob", "partner", in_template(
        label(WORKLOAD_PRIORITY_LABEL, "gpushare-online"), "CronJob")), f"deny:{PRIORITY}"),
    Attack("unknown-workload-priority", created("Job", "serving", kueue_label_on(
        "Job", WORKLOAD_PRIORITY_LABEL, "system-cluster-critical")), f"deny:{PRIORITY}"),
    Attack("online-tenant-online-workload-priority", created("Job", "serving", kueue_label_on(
        "Job", WORKLOAD_PRIORITY_LABEL, "gpushare-online")), ALLOW),
    Attack("batch-tenant-batch-workload-priority", created("Job", "partner", kueue_label_on(
        "Job", WORKLOAD_PRIORITY_LABEL, "gpushare-batch")), ALLOW),
    Attack("batch-tenant-relabels-job-online-later", update(None, label(WORKLOAD_PRIORITY_LABEL, "gpushare-online"),
                                                            kind="Job"), f"deny:{PRIORITY}"),
    # runtime classes: untrusted tenants get the default or the one gpushare configures
    Attack("untrusted-runtime-class-nvidia", create(change=setter("spec", "runtimeClassName", value="nvidia")),
           ALLOW),
    Attack("untrusted-runtime-class-other", create(change=setter("spec", "runtimeClassName", value="nvidia-legacy")),
           "deny:gpushare-untrusted-runtime-class"),
    Attack("untrusted-statefulset-runtime-class-other", create(change=setter(
        "spec", "runtimeClassName", value="runc-unconfined"), kind="StatefulSet"),
        "deny:gpushare-untrusted-runtime-class"),
    Attack("trusted-runtime-class-other", create("serving", setter("spec", "runtimeClassName", value="kata")), ALLOW),
    # inline volumes: the driver, not the API server, decides what an inline CSI or ephemeral volume reaches
    Attack("untrusted-inline-csi", create(change=setter("spec", "volumes", value=[
        {"name": "x", "csi": {"driver": "hostpath.csi.k8s.io"}}])), "deny:gpushare-untrusted-no-inline-volumes"),
    Attack("untrusted-ephemeral-volume", create(change=setter("spec", "volumes", value=[
        {"name": "x", "ephemeral": {"volumeClaimTemplate": {"spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}}])),
        "deny:gpushare-untrusted-no-inline-volumes"),
    Attack("untrusted-job-inline-csi", create(change=setter("spec", "volumes", value=[
        {"name": "x", "csi": {"driver": "secrets-store.csi.k8s.io"}}]), kind="Job"),
        "deny:gpushare-untrusted-no-inline-volumes"),
    Attack("untrusted-pvc-volume", create(change=setter("spec", "volumes", value=[
        {"name": "x", "persistentVolumeClaim": {"claimName": "data"}}])), ALLOW),
    Attack("trusted-inline-csi", create("serving", setter("spec", "volumes", value=[
        {"name": "x", "csi": {"driver": "secrets-store.csi.k8s.io"}}])), ALLOW),
    # the toolkit's and MPS client's environment
    *[Attack(f"untrusted-env-{name}", create(change=env_var(name, value)), f"deny:{DRIVER_ENV}")
      for name, value in WIDENING_ENV.items()],
    *[Attack(f"untrusted-env-{name}-narrows", create(change=env_var(name, value)), ALLOW)
      for name, value in NARROWING_ENV.items()],
    Attack("untrusted-env-capabilities-plus-graphics", create(change=env_var(
        "NVIDIA_DRIVER_CAPABILITIES", "compute,utility,graphics")), f"deny:{DRIVER_ENV}"),
    Attack("untrusted-env-empty-cuda-requirement", create(change=env_var("NVIDIA_REQUIRE_CUDA", "")),
           f"deny:{DRIVER_ENV}"),
    Attack("untrusted-env-capabilities-from-configmap", create(change=env_var(
        "NVIDIA_DRIVER_CAPABILITIES", valueFrom={"configMapKeyRef": {"name": "c", "key": "k"}})),
        f"deny:{DRIVER_ENV}"),
    Attack("untrusted-env-init-container", create(change=init_container(
        env=[{"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"}])), f"deny:{DRIVER_ENV}"),
    Attack("untrusted-env-debug-container", update(None, _add_ephemeral(
        env=[{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/tmp/nvidia-mps"}], securityContext={
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}), sub_resource="ephemeralcontainers"),
        f"deny:{DRIVER_ENV}"),
    Attack("untrusted-env-cronjob", create(change=env_var("NVIDIA_GDS", "enabled"), kind="CronJob"),
           f"deny:{DRIVER_ENV}"),
    Attack("trusted-env-capabilities-all", create("serving", env_var("NVIDIA_DRIVER_CAPABILITIES", "all")),
           f"warn:{DRIVER_ENV}"),
    *[Attack(f"untrusted-env-from-prefix-{prefix}", create(change=setter("spec", "containers", 0, "envFrom", value=[
        {"prefix": prefix, "configMapRef": {"name": "settings"}}])), f"deny:{DRIVER_ENV}", also=(ENV_FROM,))
      for prefix in ("NVIDIA_", "N", "CUDA_MPS_", "NVIDIA_REQUIRE_X")],
    Attack("untrusted-env-from-prefix-app", create(change=setter("spec", "containers", 0, "envFrom", value=[
        {"prefix": "APP_", "configMapRef": {"name": "settings"}}])), f"warn:{ENV_FROM}"),
]


# ---- third round (issue 39): tolerations of taints that are no pool's, StatefulSets' claim templates

CONTROL_PLANE = {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}
# What the API server's DefaultTolerationSeconds adds to every pod, and the DaemonSet controller to its pods.
API_SERVER_TOLERATIONS = [{"key": f"node.kubernetes.io/{k}", "operator": "Exists", "effect": "NoExecute",
                           "tolerationSeconds": 300} for k in ("not-ready", "unreachable")]
DAEMONSET_TOLERATIONS = [
    *({"key": f"node.kubernetes.io/{k}", "operator": "Exists", "effect": "NoExecute"}
      for k in ("not-ready", "unreachable")),
    *({"key": f"node.kubernetes.io/{k}", "operator": "Exists", "effect": "NoSchedule"}
      for k in ("disk-pressure", "memory-pressure", "pid-pressure", "unschedulable", "network-unavailable")),
]
INLINE_VOLUMES = "gpushare-untrusted-no-inline-volumes"


def claim_templates(obj: dict[str, Any]) -> None:
    """A StatefulSet's volumeClaimTemplates: the StatefulSet controller creates a claim per replica from them."""
    obj["spec"]["volumeClaimTemplates"] = [{"metadata": {"name": "data"}, "spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]


def changed(kind: str, old_change: Callable[[dict[str, Any]], Any], new_change: Callable[[dict[str, Any]], Any],
            tenant: str = "partner") -> Callable[[], Request]:
    """An UPDATE of a controller of the example pod: `old_change` made to the controller as it was created,
    `new_change` on top of it."""
    def build() -> Request:
        old = kueue_webhook(controller(kind, pod(tenant)))
        old_change(old)
        new = copy.deepcopy(old)
        new_change(new)
        return Request(new, ns_for(tenant), operation="UPDATE", old_object=old)
    return build


ATTACKS += [
    # tolerations of taints no pool has: the control plane's, a site's own; Kubernetes' node-condition taints and
    # nvidia.com/gpu (untrusted-tolerates-gpu-taint) stay allowed
    Attack("untrusted-tolerates-control-plane", create(change=tolerate(CONTROL_PLANE)), f"deny:{POOLS}"),
    Attack("untrusted-tolerates-other-taint", create(change=tolerate(
        {"key": "example.com/dedicated", "operator": "Equal", "value": "team-b", "effect": "NoSchedule"})),
        f"deny:{POOLS}"),
    Attack("untrusted-deployment-tolerates-control-plane", create(change=tolerate(CONTROL_PLANE),
                                                                  kind="Deployment"), f"deny:{POOLS}"),
    Attack("untrusted-control-plane-toleration-added-later", update(None, tolerate(CONTROL_PLANE)),
           f"deny:{POOLS}"),
    Attack("untrusted-tolerates-api-server-defaults", create(change=tolerate(*API_SERVER_TOLERATIONS)), ALLOW),
    Attack("untrusted-tolerates-daemonset-defaults", create(change=tolerate(*DAEMONSET_TOLERATIONS)), ALLOW),
    Attack("trusted-tolerates-control-plane", create("serving", tolerate(CONTROL_PLANE)), ALLOW),
    # a StatefulSet's claim templates: claims the StatefulSet controller creates, like a generic ephemeral volume's
    Attack("untrusted-statefulset-volume-claim-templates", created("StatefulSet", "partner", claim_templates),
           f"deny:{INLINE_VOLUMES}"),
    Attack("untrusted-statefulset-scales-with-volume-claim-templates", changed(
        "StatefulSet", claim_templates, setter("spec", "replicas", value=3)), ALLOW),
    Attack("trusted-statefulset-volume-claim-templates", created("StatefulSet", "serving", claim_templates), ALLOW),
]


def data_object(kind: str, tenant: str = "partner", **fields: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": "settings", "namespace": tenant}, **fields}


def data_create(kind: str, tenant: str = "partner", **fields: Any) -> Callable[[], Request]:
    return lambda: Request(data_object(kind, tenant, **fields), ns_for(tenant))


def data_update(kind: str, old: dict[str, Any], new: dict[str, Any]) -> Callable[[], Request]:
    return lambda: Request(data_object(kind, data=new), ns_for("partner"), operation="UPDATE",
                           old_object=data_object(kind, data=old))


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


ATTACKS += [
    # what envFrom hands over unseen is judged where it is written: untrusted tenants' ConfigMaps and Secrets
    Attack("configmap-capabilities-all", data_create("ConfigMap", data={"NVIDIA_DRIVER_CAPABILITIES": "all"}),
           f"deny:{DATA}"),
    Attack("configmap-visible-devices", data_create("ConfigMap", data={"NVIDIA_VISIBLE_DEVICES": "all"}),
           f"deny:{DATA}"),
    Attack("configmap-binary-gds", data_create("ConfigMap", binaryData={"NVIDIA_GDS": b64("enabled")}),
           f"deny:{DATA}"),
    Attack("secret-mig-monitor", data_create("Secret", data={"NVIDIA_MIG_MONITOR_DEVICES": b64("all")}),
           f"deny:{DATA}"),
    Attack("secret-capabilities-unreadable", data_create("Secret", data={
        "NVIDIA_DRIVER_CAPABILITIES": b64("compute,utility")}), f"deny:{DATA}"),
    Attack("secret-string-data-mps-pipe", data_create("Secret", stringData={"CUDA_MPS_PIPE_DIRECTORY": "/tmp/m"}),
           f"deny:{DATA}"),
    Attack("configmap-update-adds-mig-config", data_update("ConfigMap", {"APP_MODE": "eval"}, {
        "APP_MODE": "eval", "NVIDIA_MIG_CONFIG_DEVICES": "all"}), f"deny:{DATA}"),
    Attack("configmap-capabilities-default", data_create("ConfigMap", data={
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility", "NVIDIA_REQUIRE_CUDA": "cuda>=12.0"}), ALLOW),
    Attack("configmap-ordinary-keys", data_create("ConfigMap", data={"APP_MODE": "eval", "config.yaml": "a: 1"}),
           ALLOW),
    Attack("secret-ordinary-keys", data_create("Secret", data={"token": b64("t")}), ALLOW),
    Attack("configmap-update-keeps-an-old-key", data_update("ConfigMap", {"NVIDIA_DRIVER_CAPABILITIES": "all"}, {
        "NVIDIA_DRIVER_CAPABILITIES": "all", "APP_MODE": "eval"}), ALLOW),
]


# ---------------------------------------------------------------- JobSets (Kueue's JobSet integration)
# A CRD, so kept out of ATTACKS (whose objects are validated against the built-in schemas): tests/cluster/
# test_jobset.py sends the same requests to a real API server with JobSet's CRD and the JobSet controller.
JOBSET = jobset_user()


def jobset_create(change: Callable[[dict[str, Any]], Any] | None = None, pod_change: Callable[[dict[str, Any]], Any]
                  | None = None, unmutated: Callable[[dict[str, Any]], Any] | None = None) -> Callable[[], Request]:
    """A JobSet of the example pod (with `pod_change`), `change`d before Kueue's webhook mutates it and `unmutated`
    after (what reaches validation where Kueue's webhook does not run)."""
    def build() -> Request:
        obj = jobset(pod("partner", pod_change))
        if change is not None:
            change(obj)
        obj = kueue_webhook(obj)
        if unmutated is not None:
            unmutated(obj)
        return Request(obj, ns_for("partner"))
    return build


def jobset_update(change: Callable[[dict[str, Any]], Any], user: str = "alice") -> Callable[[], Request]:
    def build() -> Request:
        old = kueue_webhook(jobset(pod("partner")))
        new = copy.deepcopy(old)
        change(new)
        return Request(new, ns_for("partner"), operation="UPDATE", old_object=old, username=user)
    return build


def owned_by_jobset(obj: dict[str, Any]) -> None:
    obj["metadata"]["ownerReferences"] = [{
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "eval", "controller": True,
        "blockOwnerDeletion": True, "uid": "0c5d1a9e-2b7f-4c3d-8e6a-1f2b3c4d5e6f"}]


def jobsets_job(user: str, owner: Callable[[dict[str, Any]], Any] | None = owned_by_jobset, operation: str = "CREATE"
                ) -> Callable[[], Request]:
    """A Job as the JobSet controller makes it: the JobSet's labels but no queue label, not suspended (CREATE), or
    resumed (UPDATE), owned by the JobSet."""
    def build() -> Request:
        obj = controller("Job", pod("partner", label(QUEUE_LABEL, None)))
        if owner is not None:
            owner(obj)
        if operation == "CREATE":
            obj["spec"]["suspend"] = False
            return Request(obj, ns_for("partner"), username=user)
        old = copy.deepcopy(obj)
        old["spec"]["suspend"] = True
        obj["spec"]["suspend"] = False
        return Request(obj, ns_for("partner"), operation="UPDATE", old_object=old, username=user)
    return build


JOBSET_ATTACKS = [
    Attack("queued-gpu-jobset", jobset_create(), ALLOW),
    Attack("cpu-jobset-without-queue", jobset_create(pod_change=then(cpu_only, label(QUEUE_LABEL, None))), ALLOW),
    Attack("gpu-jobset-without-queue-label", jobset_create(lambda o: o["metadata"].pop("labels", None)),
           f"deny:{JOBSETS_POLICY}"),
    Attack("gpu-jobset-another-queue", jobset_create(lambda o: o["metadata"]["labels"].update(
        {QUEUE_LABEL: "other"})), f"deny:{JOBSETS_POLICY}"),
    Attack("gpu-jobset-created-running", jobset_create(unmutated=lambda o: o["spec"].update(suspend=False)),
           f"deny:{JOBSETS_POLICY}"),
    Attack("tenant-resumes-queued-jobset", jobset_update(resume), f"deny:{JOBSETS_POLICY}"),
    Attack("kueue-resumes-queued-jobset", jobset_update(resume, user=KUEUE), ALLOW),
    Attack("jobset-queue-label-removed", jobset_update(lambda o: o["metadata"]["labels"].pop(QUEUE_LABEL)),
           f"deny:{JOBSETS_POLICY}"),
    Attack("jobset-controller-creates-a-jobsets-job", jobsets_job(JOBSET), ALLOW),
    Attack("jobset-controller-resumes-a-jobsets-job", jobsets_job(JOBSET, operation="UPDATE"), ALLOW),
    Attack("tenant-passes-a-job-off-as-a-jobsets", jobsets_job("alice"), f"deny:{QUEUED}"),
    Attack("tenant-resumes-a-jobsets-job", jobsets_job("alice", operation="UPDATE"), f"deny:{QUEUED}"),
    Attack("jobset-controller-job-without-a-jobset-owner", jobsets_job(JOBSET, owner=None), f"deny:{QUEUED}"),
    Attack("jobset-controller-job-owned-by-another-kind", jobsets_job(JOBSET, owner=owned_by_job), f"deny:{QUEUED}"),
]


@pytest.mark.parametrize("attack", JOBSET_ATTACKS, ids=[a.id for a in JOBSET_ATTACKS])
def test_jobset_attack(attack: Attack) -> None:
    test_attack(attack)


def test_the_suite_is_broad() -> None:
    assert len(ATTACKS) >= 40
    assert len({a.id for a in ATTACKS}) == len(ATTACKS)
    denied = {a.expected.split(":", 1)[1] for a in ATTACKS if a.expected.startswith("deny:")}
    warned = {a.expected.split(":", 1)[1] for a in ATTACKS if a.expected.startswith("warn:")}
    assert denied | warned == set(POLICIES) | set(DATA_POLICIES)  # every workload and data policy shown firing


def test_trusted_tenants_configmaps_are_theirs() -> None:
    """The data policy binds untrusted namespaces only: a trusted tenant's ConfigMap is not looked at."""
    request = data_create("ConfigMap", "serving", data={"NVIDIA_DRIVER_CAPABILITIES": "all"})()
    decision = admit(list(policy_objects()), request)
    assert decision.allowed and DATA not in decision.matched
    assert DATA in admit(list(policy_objects()), data_create(
        "ConfigMap", "partner", data={"NVIDIA_DRIVER_CAPABILITIES": "all"})()).denied


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.id for a in ATTACKS])
def test_attack(attack: Attack) -> None:
    request = attack.request()
    decision = admit(list(policy_objects()), request)
    assert decision.matched, "no gpushare policy looked at this request"
    if attack.expected == ALLOW:
        assert decision.allowed and not decision.warned, (decision.denied, decision.warned)
        return
    action, policy = attack.expected.split(":", 1)
    if action == "deny":
        assert policy in decision.denied, decision
    else:
        assert decision.allowed and policy in decision.warned, decision
    # one attack, one reason: no other policy fires, so each case shows the policy it names
    assert set(decision.denied) | set(decision.warned) == {policy, *attack.also}, decision
    assert set(attack.also) <= set(decision.denied) | set(decision.warned), decision


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.id for a in ATTACKS])
def test_attack_objects_are_valid_kubernetes(attack: Attack) -> None:
    """Each spec is one an API server would take apart from the policies (strict schema, 1.33)."""
    request = attack.request()
    kubernetes_validate.validate(request.object, "1.33", strict=True)
    kubernetes_validate.validate(request.namespace, "1.33", strict=True)
