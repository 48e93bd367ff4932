"""The attack suite on a DRA cluster (docs/dra.md): pods that reference claim templates, shared claims, plain
nvidia.com/gpu (which the driver's DeviceClass serves through DRA) and claims or templates a tenant creates itself,
through the DRA cluster's admission policies, with both CEL engines and the Kubernetes 1.34 schemas. The fixture's
tenants: `partner` (untrusted) may use the MIG template, `serving` (trusted) the MIG and time-slicing ones."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import kubernetes_validate
import pytest

from gpushare.policy.admission import (
    CLAIM_CONTROLLER_USERS,
    DRA_CLAIMS_POLICY,
    DraClaims,
    admission_objects,
    workload_policies,
)
from tests.security.cel_admission import Request, admit
from tests.security.tenants import CONTROLLERS, controller, kueue_webhook
from tests.security.test_attacks import ALLOW, main, ns_for, pod

MIG = "gpushare-mig-balanced-1g.10gb"
SHARED = "gpushare-timeslice-4"
EXCLUSIVE = "gpushare-exclusive"
CLAIMS = DraClaims(templates={"partner": (MIG,), "serving": (MIG, SHARED), "lab": (SHARED,)},
                   isolated=(MIG, EXCLUSIVE))
K8S = "1.34"


@cache
def dra_objects() -> tuple[dict[str, Any], ...]:
    return tuple(admission_objects(dra=CLAIMS))


def claim_pod(*claims: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    """The example pod with its GPU limit replaced by claims, each used by the main container."""
    def change(p: dict[str, Any]) -> None:
        limits = main(p)["resources"]["limits"]
        for key in [k for k in limits if k.startswith("nvidia.com/")]:
            del limits[key]
        p["spec"]["resourceClaims"] = [copy.deepcopy(c) for c in claims]
        main(p)["resources"]["claims"] = [{"name": c["name"]} for c in claims]
    return change


def template(name: str, claim: str = "gpu") -> dict[str, Any]:
    return {"name": claim, "resourceClaimTemplateName": name}


def then(*changes: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def change(p: dict[str, Any]) -> None:
        for c in changes:
            c(p)
    return change


def pod_request(tenant: str, change: Callable[[dict[str, Any]], None], kind: str = "Pod",
                trust: str | None = "keep") -> Callable[[], Request]:
    def build() -> Request:
        p = pod(tenant, change)
        return Request(kueue_webhook(p if kind == "Pod" else controller(kind, p)), ns_for(tenant, trust))
    return build


def claim_update(tenant: str, old: Callable[[dict[str, Any]], None], new: Callable[[dict[str, Any]], None]
                 ) -> Callable[[], Request]:
    def build() -> Request:
        before = kueue_webhook(pod(tenant, old))
        after = copy.deepcopy(before)
        new(after)
        return Request(after, ns_for(tenant), operation="UPDATE", old_object=before)
    return build


def claim_object(kind: str, tenant: str, user: str = "alice") -> Callable[[], Request]:
    """A ResourceClaim or ResourceClaimTemplate in the tenant's namespace, asking for any GPU the driver offers."""
    def build() -> Request:
        spec = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}
        ns = ns_for(tenant)
        meta = {"name": "mine", "namespace": ns["metadata"]["name"]}
        body = spec if kind == "ResourceClaim" else {"spec": spec}
        return Request({"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": meta, "spec": body},
                       ns, username=user, groups=("system:authenticated",))
    return build


def claim_metadata_update(user: str, change_spec: bool = False) -> Callable[[], Request]:
    """An UPDATE of a pod's claim in a tenant namespace: the scheduler's finalizer while binding, or a spec change."""
    def build() -> Request:
        before = claim_object("ResourceClaim", "partner")().object
        before["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = MIG
        after = copy.deepcopy(before)
        after["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
        if change_spec:
            after["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu.nvidia.com"
        return Request(after, ns_for("partner"), operation="UPDATE", old_object=before, username=user,
                       groups=("system:authenticated",))
    return build


@dataclass(frozen=True)
class Attack:
    id: str
    request: Callable[[], Request]
    expected: str


def _add_label(p: dict[str, Any]) -> None:
    p["metadata"].setdefault("labels", {})["touched"] = "yes"


TEMPLATES = "gpushare-dra-claim-templates"
EXTENDED = "gpushare-dra-no-extended-gpu"
ATTACKS = [
    Attack("untrusted-mig-template", pod_request("partner", claim_pod(template(MIG))), ALLOW),
    Attack("trusted-shared-template", pod_request("serving", claim_pod(template(SHARED))), ALLOW),
    Attack("trusted-two-templates", pod_request("serving", claim_pod(template(MIG), template(SHARED, "b"))), ALLOW),
    Attack("untrusted-shared-template", pod_request("partner", claim_pod(template(SHARED))), f"deny:{TEMPLATES}"),
    # the trust label is what counts: a trusted tenant's namespace without it is judged untrusted
    Attack("shared-template-trust-removed", pod_request("serving", claim_pod(template(SHARED)), trust=None),
           f"deny:{TEMPLATES}"),
    Attack("template-of-another-tenant", pod_request("lab", claim_pod(template(MIG))), f"deny:{TEMPLATES}"),
    Attack("untrusted-isolated-template-not-granted", pod_request("partner", claim_pod(template(EXCLUSIVE))),
           f"deny:{TEMPLATES}"),
    Attack("own-template-name", pod_request("serving", claim_pod(template("mine"))), f"deny:{TEMPLATES}"),
    Attack("driver-class-name-as-template", pod_request("serving", claim_pod(template("gpu.nvidia.com"))),
           f"deny:{TEMPLATES}"),
    Attack("shared-claim", pod_request("serving", claim_pod({"name": "gpu", "resourceClaimName": "team-gpu"})),
           f"deny:{TEMPLATES}"),
    Attack("one-good-one-shared-claim", pod_request("serving", claim_pod(
        template(MIG), {"name": "b", "resourceClaimName": "team-gpu"})), f"deny:{TEMPLATES}"),
    Attack("plain-gpu-limit", pod_request("serving", then(claim_pod(), lambda p: main(p)["resources"]["limits"]
                                                          .update({"nvidia.com/gpu": 1}))), f"deny:{EXTENDED}"),
    Attack("plain-gpu-init-container", pod_request("partner", then(claim_pod(template(MIG)), lambda p: p["spec"]
           .__setitem__("initContainers", [{"name": "warm", "image": "busybox:1.36",
                                            "resources": {"limits": {"nvidia.com/gpu": 1}}}]))), f"deny:{EXTENDED}"),
    Attack("update-adds-shared-claim", claim_update("partner", claim_pod(template(MIG)), lambda p: p["spec"][
        "resourceClaims"].append({"name": "b", "resourceClaimName": "team-gpu"})), f"deny:{TEMPLATES}"),
    Attack("label-update-of-claim-pod", claim_update("partner", claim_pod(template(MIG)), _add_label), ALLOW),
    # DRAExtendedResource: the scheduler would make a claim on any class, without a template, shares or quota.
    Attack("implicit-extended-resource", pod_request("partner", then(claim_pod(), lambda p: main(p)["resources"][
        "limits"].update({f"deviceclass.resource.kubernetes.io/{EXCLUSIVE}": 1}))), f"deny:{EXTENDED}"),
    Attack("implicit-extended-resource-request", pod_request("serving", then(claim_pod(template(SHARED)), lambda p:
           main(p)["resources"].setdefault("requests", {}).update(
               {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": 1}))), f"deny:{EXTENDED}"),
    # Binding: the scheduler adds its finalizer to the pod's claim (a plain UPDATE); the spec stays gpushare's.
    Attack("scheduler-adds-claim-finalizer", claim_metadata_update("system:kube-scheduler"), ALLOW),
    Attack("tenant-changes-claim-spec", claim_metadata_update("alice", change_spec=True),
           f"deny:{DRA_CLAIMS_POLICY}"),
    Attack("tenant-creates-claim", claim_object("ResourceClaim", "serving"), f"deny:{DRA_CLAIMS_POLICY}"),
    Attack("tenant-creates-template", claim_object("ResourceClaimTemplate", "serving"),
           f"deny:{DRA_CLAIMS_POLICY}"),
]
ATTACKS += [Attack(f"{kind.lower()}-mig-template", pod_request("partner", claim_pod(template(MIG)), kind), ALLOW)
            for kind in CONTROLLERS]
ATTACKS += [Attack(f"{kind.lower()}-shared-claim", pod_request("serving", claim_pod(
    {"name": "gpu", "resourceClaimName": "team-gpu"}), kind), f"deny:{TEMPLATES}") for kind in CONTROLLERS]


def test_dra_policies_replace_the_blanket_refusal() -> None:
    assert "gpushare-no-resource-claims" in workload_policies()
    dra = workload_policies(CLAIMS)
    assert "gpushare-no-resource-claims" not in dra and {TEMPLATES, EXTENDED} <= set(dra)
    shown = {a.expected.split(":", 1)[1] for a in ATTACKS if a.expected != ALLOW}
    assert shown == {TEMPLATES, EXTENDED, DRA_CLAIMS_POLICY}


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.id for a in ATTACKS])
def test_dra_attack(attack: Attack) -> None:
    decision = admit(list(dra_objects()), attack.request())
    if attack.expected == ALLOW:
        assert decision.allowed and not decision.warned, (decision.denied, decision.warned)
        return
    policy = attack.expected.split(":", 1)[1]
    assert set(decision.denied) == {policy}, decision


@pytest.mark.parametrize("user", CLAIM_CONTROLLER_USERS)
def test_the_claim_controller_creates_claims_from_templates(user: str) -> None:
    assert admit(list(dra_objects()), claim_object("ResourceClaim", "partner", user)()).allowed


def test_the_deployer_writes_templates() -> None:
    request = claim_object("ResourceClaimTemplate", "partner")()
    request.username, request.groups = "ci", ("system:masters",)
    assert admit(list(dra_objects()), request).allowed


def test_device_plugin_clusters_still_refuse_every_claim() -> None:
    request = pod_request("partner", claim_pod(template(MIG)))()
    assert set(admit(list(admission_objects()), request).denied) == {"gpushare-no-resource-claims"}


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.id for a in ATTACKS])
def test_dra_attack_objects_are_valid_kubernetes(attack: Attack) -> None:
    kubernetes_validate.validate(attack.request().object, K8S, strict=True)


def test_dra_admission_objects_are_valid_kubernetes() -> None:
    for obj in dra_objects():
        kubernetes_validate.validate(obj, K8S, strict=True)
