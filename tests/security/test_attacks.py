"""The attack suite: pods and controllers a tenant might submit, allowed and denied, through gpushare's admission
policies as an API server applies them (rules, match conditions, bindings by namespace labels), with every CEL
expression evaluated by both engines. Namespaces are the ones gpushare renders for the frozen fixture's tenants:
`partner` (untrusted), `serving` (trusted, online), `lab` (trusted, restricted)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kubernetes_validate
import pytest

from gpushare.core.namespaces import TRUST_LABEL
from gpushare.policy.admission import POLICIES
from tests.security.cel_admission import Request, admit, namespace
from tests.security.tenants import CONTROLLERS, controller, example_pod, policy_objects, tenant_namespace

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


@dataclass
class Attack:
    id: str
    request: Callable[[], Request]
    expected: str  # ALLOW, "deny:<policy>" or "warn:<policy>"


def create(tenant: str = "partner", change: Callable[[dict[str, Any]], Any] | None = None,
           trust: str | None = "keep", kind: str = "Pod") -> Callable[[], Request]:
    def build() -> Request:
        p = pod(tenant, change)
        obj = p if kind == "Pod" else controller(kind, p)
        return Request(obj, ns_for(tenant, trust))
    return build


def update(old_change: Callable[[dict[str, Any]], Any] | None, new_change: Callable[[dict[str, Any]], Any],
           tenant: str = "partner", sub_resource: str = "", kind: str = "Pod") -> Callable[[], Request]:
    """An UPDATE: the old object is the example pod (or a controller of it) with `old_change`, the new one that
    plus `new_change` (applied to the controller itself where it is not a pod)."""
    def build() -> Request:
        old = pod(tenant, old_change)
        if kind != "Pod":
            old = controller(kind, old)
        new = copy.deepcopy(old)
        new_change(new)
        return Request(new, ns_for(tenant), operation="UPDATE", old_object=old, sub_resource=sub_resource)
    return build


def template(change: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], None]:
    """A change to a controller's pod template, as if the template were a pod."""
    def apply(obj: dict[str, Any]) -> None:
        change(obj["spec"]["template"])
    return apply


def _every_bad_thing(p: dict[str, Any]) -> None:
    for change in (host_path("/"), setter("spec", "nodeName", value="gpu-node-1"),
                   setter("spec", "containers", 0, "securityContext", "privileged", value=True),
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
    Attack("trusted-node-name", create("serving", setter("spec", "nodeName", value="gpu-node-1")), ALLOW),
    Attack("safe-volumes", create(change=setter("spec", "volumes", value=[
        {"name": "scratch", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "eval"}}])), ALLOW),
    # every hostPath, however spelt, in any tenant namespace
    *[Attack(f"host-path-{path}", create("serving", host_path(path)), "deny:gpushare-no-host-paths")
      for path in HOST_PATHS],
    Attack("host-path-untrusted", create(change=host_path("/dev/nvidia0")), "deny:gpushare-no-host-paths"),
    # privileged containers of every kind, host namespaces
    Attack("privileged-main", create("serving", setter("spec", "containers", 0, "securityContext", "privileged",
                                                       value=True)), "deny:gpushare-no-privileged-gpu-pods"),
    Attack("privileged-init", create("serving", init_container(**PRIVILEGED)),
           "deny:gpushare-no-privileged-gpu-pods"),
    Attack("privileged-ephemeral-in-spec", create("serving", setter("spec", "ephemeralContainers",
                                                                    value=[ephemeral(**PRIVILEGED)])),
           "deny:gpushare-no-privileged-gpu-pods"),
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
    Attack("node-name-untrusted", create(change=setter("spec", "nodeName", value="gpu-node-1")),
           "deny:gpushare-untrusted-no-node-name"),
    *[Attack(f"node-name-trust-{label!r}", create("serving", setter("spec", "nodeName", value="gpu-node-1"),
                                                  trust=label), "deny:gpushare-untrusted-no-node-name")
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
    Attack("claim-container", create("serving", setter("spec", "containers", 0, "resources", "claims",
                                                       value=[{"name": "gpu"}])), "deny:gpushare-no-resource-claims"),
    Attack("claim-job-template", create("serving", setter("spec", "resourceClaims", value=[
        {"name": "gpu", "resourceClaimTemplateName": "gpu"}]), kind="Job"), "deny:gpushare-no-resource-claims"),
    # shared replicas and shared-pool tolerations for untrusted tenants, in every container kind
    Attack("shared-limits", create(change=limits(**SHARED)), "deny:gpushare-untrusted-no-shared-gpus"),
    Attack("shared-requests", create(change=setter("spec", "containers", 0, "resources", "requests",
                                                   value={"nvidia.com/mig-1g.10gb.shared": 1})),
           "deny:gpushare-untrusted-no-shared-gpus"),
    Attack("shared-init", create(change=init_container(resources={"limits": SHARED})),
           "deny:gpushare-untrusted-no-shared-gpus"),
    Attack("shared-ephemeral-debug", update(None, _add_ephemeral(resources={"limits": SHARED}),
                                            sub_resource="ephemeralcontainers"),
           "deny:gpushare-untrusted-no-shared-gpus"),
    Attack("shared-cronjob-template", create(change=limits(**SHARED), kind="CronJob"),
           "deny:gpushare-untrusted-no-shared-gpus"),
    Attack("shared-missing-trust-label", create("serving", limits(**SHARED), trust=None),
           "deny:gpushare-untrusted-no-shared-gpus"),
    Attack("tolerate-shared-exists", create(change=tolerate({"key": "gpushare.io/shared-gpu", "operator": "Exists"})),
           "deny:gpushare-untrusted-no-shared-gpus"),
    Attack("tolerate-shared-equal", create(change=tolerate({"key": "gpushare.io/shared-gpu", "operator": "Equal",
                                                            "value": "true", "effect": "NoSchedule"})),
           "deny:gpushare-untrusted-no-shared-gpus"),
    Attack("tolerate-everything", create(change=tolerate({"operator": "Exists"})),
           "deny:gpushare-untrusted-no-shared-gpus"),
    Attack("tolerate-everything-empty-key", create(change=tolerate({"key": "", "operator": "Exists"})),
           "deny:gpushare-untrusted-no-shared-gpus"),
    Attack("tolerate-shared-added-later", update(None, tolerate({"key": "gpushare.io/shared-gpu",
                                                                 "operator": "Exists"})),
           "deny:gpushare-untrusted-no-shared-gpus"),
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
    Attack("bound-pod-label-update", update(setter("spec", "nodeName", value="gpu-node-1"), _add_label), ALLOW),
    Attack("unprivileged-debug-container", update(None, _add_ephemeral(
        securityContext={"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}),
        sub_resource="ephemeralcontainers"), ALLOW),
    Attack("image-change-of-privileged-container", update(
        setter("spec", "containers", 0, "securityContext", "privileged", value=True), _bump_image, "serving"),
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


def test_the_suite_is_broad() -> None:
    assert len(ATTACKS) >= 40
    assert len({a.id for a in ATTACKS}) == len(ATTACKS)
    denied = {a.expected.split(":", 1)[1] for a in ATTACKS if a.expected.startswith("deny:")}
    warned = {a.expected.split(":", 1)[1] for a in ATTACKS if a.expected.startswith("warn:")}
    assert denied | warned == set(POLICIES)  # every workload policy is shown firing


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
    assert set(decision.denied) | set(decision.warned) == {policy}, decision


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.id for a in ATTACKS])
def test_attack_objects_are_valid_kubernetes(attack: Attack) -> None:
    """Each spec is one an API server would take apart from the policies (strict schema, 1.33)."""
    request = attack.request()
    kubernetes_validate.validate(request.object, "1.33", strict=True)
    kubernetes_validate.validate(request.namespace, "1.33", strict=True)
