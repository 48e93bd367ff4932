"""The admission policies' CEL, evaluated on allowed and denied pods by two independent CEL implementations
(cel-python, pure Python; cel-expr-python, Google's C++ CEL), and the objects against Kubernetes' schemas.
Whether a real API server admits or denies is only provable on a cluster."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import kubernetes_validate
import pytest
from cel_expr_python import cel

from gpushare.admission import POLICIES, admission_objects, tenant_namespace_labels


def eval_celpy(policy: dict[str, Any], pod: dict[str, Any], namespace: dict[str, Any]) -> list[bool]:
    env = celpy.Environment()
    activation: dict[str, Any] = {"object": celpy.json_to_cel(pod), "namespaceObject": celpy.json_to_cel(namespace)}
    variables: dict[Any, Any] = {}
    for var in policy["variables"]:
        activation["variables"] = celpy.celtypes.MapType(variables)
        value = env.program(env.compile(var["expression"])).evaluate(activation)
        variables[celpy.celtypes.StringType(var["name"])] = value
    activation["variables"] = celpy.celtypes.MapType(variables)
    return [bool(env.program(env.compile(v["expression"])).evaluate(activation)) for v in policy["validations"]]


def eval_google(policy: dict[str, Any], pod: dict[str, Any], namespace: dict[str, Any]) -> list[bool]:
    env = cel.NewEnv(variables={"object": cel.Type.DYN, "namespaceObject": cel.Type.DYN, "variables": cel.Type.DYN})
    data: dict[str, Any] = {"object": pod, "namespaceObject": namespace, "variables": {}}
    for var in policy["variables"]:
        data["variables"][var["name"]] = env.compile(var["expression"]).eval(data=data).plain_value()
    return [bool(env.compile(v["expression"]).eval(data=data).plain_value()) for v in policy["validations"]]


def allowed(name: str, pod: dict[str, Any], trust: str = "trusted", priority: str = "batch") -> bool:
    namespace = {"metadata": {"name": "team", "labels": tenant_namespace_labels("team", trust, priority)}}
    policy = POLICIES[name]
    ours = eval_celpy(policy, pod, namespace)
    google = eval_google(policy, pod, namespace)
    assert ours == google, (name, ours, google)
    return all(ours)


BASE: dict[str, Any] = {
    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team"},
    "spec": {"priorityClassName": "gpushare-batch",
             "containers": [{"name": "main", "image": "cuda:12",
                             "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}}]},
}


def pod(**changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(BASE)
    for path, value in changes.items():
        target = out["spec"]
        keys = path.split("__")
        for key in keys[:-1]:
            target = target[int(key)] if isinstance(target, list) else target[key]
        target[keys[-1]] = value
    return out


CASES = [
    ("gpushare-no-gpu-host-paths", pod(), "trusted", True),
    ("gpushare-no-gpu-host-paths", pod(volumes=[{"name": "d", "hostPath": {"path": "/dev/nvidia0"}}]), "trusted",
     False),
    ("gpushare-no-gpu-host-paths", pod(volumes=[{"name": "l", "hostPath": {
        "path": "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"}}]), "trusted", False),
    ("gpushare-no-gpu-host-paths", pod(volumes=[{"name": "d", "hostPath": {"path": "/dev"}}]), "trusted", False),
    ("gpushare-no-gpu-host-paths", pod(volumes=[{"name": "c", "emptyDir": {}},
                                                {"name": "t", "hostPath": {"path": "/tmp/data"}}]), "trusted", True),
    ("gpushare-no-privileged-gpu-pods", pod(), "trusted", True),
    ("gpushare-no-privileged-gpu-pods", pod(containers__0__securityContext={"privileged": True}), "trusted", False),
    ("gpushare-no-privileged-gpu-pods", pod(containers__0__securityContext={"privileged": False}), "trusted", True),
    ("gpushare-no-privileged-gpu-pods", pod(initContainers=[{"name": "i", "image": "x",
                                                             "securityContext": {"privileged": True}}]), "trusted",
     False),
    ("gpushare-no-privileged-gpu-pods", pod(hostPID=True), "trusted", False),
    ("gpushare-no-privileged-gpu-pods", pod(hostIPC=True), "trusted", False),
    ("gpushare-untrusted-no-shared-gpus", pod(), "untrusted", True),
    ("gpushare-untrusted-no-shared-gpus", pod(containers__0__resources={"limits": {"nvidia.com/gpu.shared": 1}}),
     "untrusted", False),
    ("gpushare-untrusted-no-shared-gpus",
     pod(containers__0__resources={"requests": {"nvidia.com/mig-1g.10gb.shared": 1}}), "untrusted", False),
    ("gpushare-untrusted-no-shared-gpus", pod(containers__0__resources={"limits": {"nvidia.com/gpu.shared": 1}}),
     "trusted", True),
    ("gpushare-untrusted-no-shared-gpus", pod(tolerations=[{"key": "gpushare.io/shared-gpu", "operator": "Exists"}]),
     "untrusted", False),
    ("gpushare-untrusted-no-shared-gpus", pod(tolerations=[{"operator": "Exists"}]), "untrusted", False),
    ("gpushare-untrusted-no-shared-gpus", pod(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]),
     "untrusted", True),
    ("gpushare-untrusted-no-shared-gpus", pod(tolerations=[{"key": "gpushare.io/shared-gpu", "operator": "Exists"}]),
     "trusted", True),
    ("gpushare-tenant-priority-class", pod(), "trusted", True),
    ("gpushare-tenant-priority-class", pod(priorityClassName="gpushare-online"), "trusted", False),
    ("gpushare-tenant-priority-class", pod(priorityClassName="system-node-critical"), "trusted", False),
    ("gpushare-no-visible-devices-env", pod(), "trusted", True),
    ("gpushare-no-visible-devices-env", pod(containers__0__env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]),
     "trusted", False),
]


@pytest.mark.parametrize(("policy", "sample", "trust", "expected"), CASES,
                         ids=[f"{c[0]}-{i}-{'allow' if c[3] else 'deny'}" for i, c in enumerate(CASES)])
def test_policy_decisions(policy: str, sample: dict[str, Any], trust: str, expected: bool) -> None:
    assert allowed(policy, sample, trust) is expected


def test_online_tenant_may_use_the_online_class() -> None:
    assert allowed("gpushare-tenant-priority-class", pod(priorityClassName="gpushare-online"), priority="online")


def test_pod_without_priority_class_is_denied() -> None:
    sample = pod()
    del sample["spec"]["priorityClassName"]
    assert not allowed("gpushare-tenant-priority-class", sample)


@pytest.mark.parametrize("version", ["1.31", "1.33"])
def test_objects_pass_kubernetes_schema(version: str) -> None:
    objects = admission_objects()
    assert len(objects) == 2 * len(POLICIES)
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


def test_bindings_select_tenant_namespaces_only() -> None:
    bindings = [o for o in admission_objects() if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    for b in bindings:
        expressions = b["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
        assert {"key": "gpushare.io/tenant", "operator": "Exists"} in expressions
        assert any(e.get("operator") == "NotIn" and "gpu-operator" in e["values"] for e in expressions)
    actions = {b["metadata"]["name"]: b["spec"]["validationActions"] for b in bindings}
    assert actions["gpushare-untrusted-no-shared-gpus"] == ["Deny"]
    assert actions["gpushare-no-visible-devices-env"] == ["Warn", "Audit"]
