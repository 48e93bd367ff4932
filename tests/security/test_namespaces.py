"""Tenants cannot change what decides their own isolation: the trust, tenant and Pod Security labels of a tenant
namespace change only through gpushare's deployer identity, and DRA's admin-access label never lands on one.
Namespaces as gpushare renders them for the frozen fixture; both CEL engines through the admission model."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest

from gpushare.core.namespaces import DRA_ADMIN_ACCESS_LABEL, PRIORITY_LABEL, TENANT_LABEL, TRUST_LABEL
from gpushare.policy.admission import Deployer, admission_objects
from tests.security.cel_admission import Request, admit, namespace
from tests.security.tenants import policy_objects, tenant_namespace

LABELS_POLICY = "gpushare-tenant-namespace-labels"
DRA_POLICY = "gpushare-tenant-namespace-no-dra-admin"


@dataclass(frozen=True)
class User:
    username: str
    groups: tuple[str, ...]


TENANT_USER = User("partner-admin", ("partner-team", "system:authenticated"))
DEPLOYER = User("kubernetes-admin", ("system:masters", "system:authenticated"))


def rendered(tenant: str) -> dict[str, Any]:
    ns = tenant_namespace(tenant)
    return namespace(ns["metadata"]["name"], ns["metadata"]["labels"])


def relabel(tenant: str, user: User, set_: dict[str, str] | None = None,
            remove: tuple[str, ...] = (), objects: list[dict[str, Any]] | None = None,
            sub_resource: str = "", old_labels: dict[str, str] | None = None) -> tuple[bool, list[str]]:
    old = rendered(tenant)
    old["metadata"]["labels"].update(old_labels or {})
    new = copy.deepcopy(old)
    labels = new["metadata"]["labels"]
    labels.update(set_ or {})
    for key in remove:
        labels.pop(key)
    if sub_resource == "finalize":  # what the namespace controller sends once the namespace's content is gone
        old["spec"], new["spec"] = {"finalizers": ["kubernetes"]}, {"finalizers": []}
    decision = admit(objects or list(policy_objects()), Request(
        new, None, operation="UPDATE", old_object=old, sub_resource=sub_resource, username=user.username,
        groups=user.groups))
    return decision.allowed, sorted(decision.denied)


@pytest.mark.parametrize(("set_", "remove"), [
    ({TRUST_LABEL: "trusted"}, ()),
    ({}, (TRUST_LABEL,)),
    ({TENANT_LABEL: "serving"}, ()),
    ({}, (TENANT_LABEL,)),
    ({"pod-security.kubernetes.io/enforce": "privileged"}, ()),
    ({"pod-security.kubernetes.io/enforce-version": "v1.24"}, ()),
    ({}, ("pod-security.kubernetes.io/warn",)),
    ({"pod-security.kubernetes.io/exempt": "true"}, ()),
    # the priority-class policy trusts this label: a batch tenant relabelling itself online would preempt others
    ({PRIORITY_LABEL: "online"}, ()),
    ({}, (PRIORITY_LABEL,)),
], ids=["trust-raised", "trust-removed", "tenant-renamed", "tenant-removed", "enforce-privileged",
        "enforce-version-old", "warn-removed", "new-pod-security-key", "priority-raised", "priority-removed"])
def test_tenant_cannot_change_guarded_labels(set_: dict[str, str], remove: tuple[str, ...]) -> None:
    assert relabel("partner", TENANT_USER, set_, remove) == (False, [LABELS_POLICY])


# The API server stores a Namespace's metadata from writes to namespaces/status and namespaces/finalize too: RBAC
# granting either (to a tenant, an operator, a finalizer controller) must not reach the guarded labels.
SUBRESOURCES = ("status", "finalize")


@pytest.mark.parametrize("sub_resource", SUBRESOURCES)
@pytest.mark.parametrize(("set_", "remove"), [
    ({"pod-security.kubernetes.io/enforce": "privileged"}, (TENANT_LABEL,)),
    ({TRUST_LABEL: "trusted"}, ()),
    ({PRIORITY_LABEL: "online"}, ()),
    ({}, ("pod-security.kubernetes.io/enforce",)),
], ids=["tenant-dropped-and-privileged", "trust-raised", "priority-raised", "enforce-removed"])
def test_subresources_cannot_change_guarded_labels(sub_resource: str, set_: dict[str, str],
                                                   remove: tuple[str, ...]) -> None:
    assert relabel("partner", TENANT_USER, set_, remove, sub_resource=sub_resource) == (False, [LABELS_POLICY])


@pytest.mark.parametrize("sub_resource", SUBRESOURCES)
def test_subresource_writes_are_judged_and_pass_when_guarded_labels_stay(sub_resource: str) -> None:
    ns = rendered("partner")
    decision = admit(list(policy_objects()), Request(
        ns, None, operation="UPDATE", old_object=copy.deepcopy(ns), sub_resource=sub_resource,
        username=TENANT_USER.username, groups=TENANT_USER.groups))
    assert decision.allowed and LABELS_POLICY in decision.matched
    assert relabel("partner", TENANT_USER, {"team.example.com/cost-center": "42"},
                   sub_resource=sub_resource) == (True, [])
    assert relabel("partner", DEPLOYER, {TRUST_LABEL: "trusted"}, (TENANT_LABEL,),
                   sub_resource=sub_resource) == (True, [])


@pytest.mark.parametrize("sub_resource", SUBRESOURCES)
def test_dra_admin_access_not_added_through_subresources(sub_resource: str) -> None:
    allowed, denied = relabel("serving", DEPLOYER, {DRA_ADMIN_ACCESS_LABEL: "true"}, sub_resource=sub_resource)
    assert not allowed and denied == [DRA_POLICY]
    # a namespace that carried it before the policies still finishes its deletion (finalize keeps it as it was)
    assert relabel("serving", DEPLOYER, old_labels={DRA_ADMIN_ACCESS_LABEL: "true"},
                   sub_resource=sub_resource) == (True, [])


def test_tenant_may_add_its_own_labels() -> None:
    assert relabel("partner", TENANT_USER, {"team.example.com/cost-center": "42"}) == (True, [])


def test_deployer_changes_trust_and_pod_security() -> None:
    assert relabel("partner", DEPLOYER, {TRUST_LABEL: "trusted",
                                         "pod-security.kubernetes.io/enforce": "baseline"}) == (True, [])


def test_deployer_changes_priority() -> None:
    assert relabel("partner", DEPLOYER, {PRIORITY_LABEL: "online"}) == (True, [])


def test_deployer_identity_comes_from_the_stack() -> None:
    ci = User("system:serviceaccount:ci:pulumi", ("system:serviceaccounts",))
    objects = admission_objects(Deployer(users=(ci.username,), groups=()))
    assert relabel("partner", ci, {TRUST_LABEL: "trusted"}, objects=objects) == (True, [])
    # system:masters is only the default: once the stack names its deployer, it is that one alone
    assert relabel("partner", DEPLOYER, {TRUST_LABEL: "trusted"}, objects=objects) == (False, [LABELS_POLICY])


@pytest.mark.parametrize("user", [TENANT_USER, DEPLOYER], ids=["tenant", "deployer"])
def test_dra_admin_access_never_on_tenant_namespaces(user: User) -> None:
    allowed, denied = relabel("serving", user, {DRA_ADMIN_ACCESS_LABEL: "true"})
    assert not allowed and DRA_POLICY in denied


def test_claiming_a_namespace_as_a_tenant_needs_the_deployer() -> None:
    ns = namespace("sneaky", {TENANT_LABEL: "partner", TRUST_LABEL: "trusted"})
    tenant = admit(list(policy_objects()), Request(ns, None, username=TENANT_USER.username,
                                                   groups=TENANT_USER.groups))
    assert tenant.denied.keys() == {LABELS_POLICY}
    deployer = admit(list(policy_objects()), Request(ns, None, username=DEPLOYER.username,
                                                     groups=DEPLOYER.groups))
    assert deployer.allowed


def test_other_namespaces_are_not_judged() -> None:
    # the operator's own namespace is privileged by design, and no tenant's
    ns = namespace("gpu-operator", {"pod-security.kubernetes.io/enforce": "privileged"})
    decision = admit(list(policy_objects()), Request(ns, None, username=TENANT_USER.username,
                                                     groups=TENANT_USER.groups))
    assert decision.allowed and decision.matched == []


def test_rendered_tenant_namespaces_never_carry_dra_admin_access() -> None:
    for tenant in ("partner", "serving", "lab"):
        assert DRA_ADMIN_ACCESS_LABEL not in rendered(tenant)["metadata"]["labels"]
