"""Each tenant namespace's Pod Security level refuses what it must: baseline (every tenant) refuses host access
and added capabilities, restricted (untrusted tenants, and trusted ones that ask) refuses root and privilege
escalation too. Levels come from the labels gpushare renders for the frozen fixture; the standards themselves
from a small evaluator after the upstream definitions (tests/security/pod_security.py)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from gpushare.core.namespaces import POD_SECURITY_MODES, POD_SECURITY_PREFIX
from tests.security.cel_admission import Request, admit, namespace
from tests.security.pod_security import violations
from tests.security.tenants import (
    CONTROLLERS,
    controller,
    example_pod,
    kueue_webhook,
    policy_objects,
    tenant_namespace,
)

TENANTS = {"partner": "restricted", "serving": "baseline", "lab": "restricted"}


def level_of(tenant: str) -> str:
    labels = tenant_namespace(tenant)["metadata"]["labels"]
    levels = {labels[f"{POD_SECURITY_PREFIX}{mode}"] for mode in POD_SECURITY_MODES}
    assert len(levels) == 1, labels  # enforce, audit and warn agree
    versions = {labels[f"{POD_SECURITY_PREFIX}{mode}-version"] for mode in POD_SECURITY_MODES}
    assert versions == {"v1.31"}  # the fixture cluster's minor
    return levels.pop()


def changed(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    pod = example_pod()
    change(pod)
    return pod


def _sc(p: dict[str, Any]) -> dict[str, Any]:
    return p["spec"]["containers"][0]["securityContext"]


# what baseline refuses: escapes to the host, whichever container asks
HOST_ESCAPES: dict[str, Callable[[dict[str, Any]], None]] = {
    "hostNetwork": lambda p: p["spec"].update(hostNetwork=True),
    "hostPID": lambda p: p["spec"].update(hostPID=True),
    "SYS_ADMIN": lambda p: _sc(p).update(capabilities={"add": ["SYS_ADMIN"], "drop": ["ALL"]}),
    "SYS_ADMIN-init": lambda p: p["spec"].update(initContainers=[{
        "name": "setup", "image": "busybox", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]),
    "procMount-Unmasked": lambda p: _sc(p).update(procMount="Unmasked"),
    "privileged": lambda p: _sc(p).update(privileged=True),
    "privileged-ephemeral": lambda p: p["spec"].update(ephemeralContainers=[{
        "name": "debug", "image": "busybox", "securityContext": {"privileged": True}}]),
    "hostPath": lambda p: p["spec"].update(volumes=[{"name": "h", "hostPath": {"path": "/dev"}}]),
    "hostPort": lambda p: p["spec"]["containers"][0].update(ports=[{"containerPort": 5555, "hostPort": 5555}]),
    "seccomp-Unconfined": lambda p: p["spec"]["securityContext"].update(seccompProfile={"type": "Unconfined"}),
}
# what restricted refuses on top: root and the ways to it
ROOT_PATHS: dict[str, Callable[[dict[str, Any]], None]] = {
    "allowPrivilegeEscalation": lambda p: _sc(p).update(allowPrivilegeEscalation=True),
    "escalation-unset": lambda p: _sc(p).pop("allowPrivilegeEscalation"),
    "runAsNonRoot-unset": lambda p: p["spec"]["securityContext"].pop("runAsNonRoot"),
    "runAsUser-0": lambda p: p["spec"]["securityContext"].update(runAsUser=0),
    "seccomp-unset": lambda p: p["spec"]["securityContext"].pop("seccompProfile"),
    "caps-not-dropped": lambda p: _sc(p).pop("capabilities"),
    "CHOWN": lambda p: _sc(p).update(capabilities={"add": ["CHOWN"], "drop": ["ALL"]}),
}


@pytest.mark.parametrize("tenant", TENANTS)
def test_levels_follow_trust_and_choice(tenant: str) -> None:
    assert level_of(tenant) == TENANTS[tenant]


@pytest.mark.parametrize("escape", HOST_ESCAPES)
@pytest.mark.parametrize("tenant", TENANTS)
def test_every_tenant_level_refuses_host_escapes(tenant: str, escape: str) -> None:
    assert violations(changed(HOST_ESCAPES[escape]), level_of(tenant))


@pytest.mark.parametrize("escape", ROOT_PATHS)
@pytest.mark.parametrize("tenant", ["partner", "lab"])
def test_restricted_tenants_refuse_root(tenant: str, escape: str) -> None:
    assert violations(changed(ROOT_PATHS[escape]), level_of(tenant))


@pytest.mark.parametrize("escape", ROOT_PATHS)
def test_baseline_admits_what_only_restricted_refuses(escape: str) -> None:
    # the control: the evaluator does not refuse everything, and trusted baseline tenants keep working
    assert violations(changed(ROOT_PATHS[escape]), level_of("serving")) == []


@pytest.mark.parametrize("kind", ["Pod", *CONTROLLERS])
def test_example_pod_passes_restricted_and_admission(kind: str) -> None:
    """The documented untrusted GPU pod: non-root, seccomp RuntimeDefault, no capabilities, a MIG instance."""
    pod = example_pod()
    obj = pod if kind == "Pod" else controller(kind, pod)
    assert violations(obj, level_of("partner")) == []
    ns = tenant_namespace("partner")
    decision = admit(list(policy_objects()), Request(kueue_webhook(obj), namespace(ns["metadata"]["name"],
                                                                                  ns["metadata"]["labels"])))
    assert decision.allowed and not decision.warned, decision
    assert "nvidia.com/mig-1g.10gb" in pod["spec"]["containers"][0]["resources"]["limits"]


def test_a_root_gpu_pod_is_what_untrusted_tenants_must_change() -> None:
    """What an existing untrusted workload without a security context meets: restricted refuses it."""
    pod = copy.deepcopy(example_pod())
    del pod["spec"]["securityContext"]
    del pod["spec"]["containers"][0]["securityContext"]
    found = violations(pod, level_of("partner"))
    assert any("allowPrivilegeEscalation" in v for v in found)
    assert any("runAsNonRoot" in v for v in found)
    assert any("seccompProfile" in v for v in found)
    assert any("ALL" in v for v in found)
    assert violations(pod, level_of("serving")) == []
