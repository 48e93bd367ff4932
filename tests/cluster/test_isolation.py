"""Isolation, for real: the attack suite of tests/security sent to Kubernetes' own API server as a tenant's
ServiceAccount (a real token), against the admission policies and tenant namespaces gpushare renders for the
suite's fixture. Every request is a dry run (admission runs in full, nothing is stored), except the old object of an
UPDATE, which is created first and removed after.

The server's answer must be what the offline model (tests/security/cel_admission.py with both CEL engines, and
tests/security/pod_security.py for Pod Security) predicts: allowed or denied, by which policy or Pod Security
level, and with which warnings. Where they disagree the server is right and the offline model is what gets fixed.

Requests come from a ServiceAccount in the tenant's namespace holding the built-in `admin` role there
(environments.tenant_client)."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from gpushare.core.namespaces import TRUST_LABEL
from tests.cluster.environments import apply_crds, ident, tenant_client
from tests.cluster.kube import Answer, Kube
from tests.security.cel_admission import Request, admit
from tests.security.pod_security import violations
from tests.security.tenants import policy_objects, tenancy_objects
from tests.security.test_attacks import ATTACKS, Attack

ENFORCE = "pod-security.kubernetes.io/enforce"
_names = itertools.count()


class Tenants:
    """The suite's cluster: gpushare's policies and tenant objects applied, a ServiceAccount per tenant namespace."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        apply_crds(kube)
        objects = [*policy_objects(), *tenancy_objects()]
        for obj in sorted(objects, key=lambda o: o["kind"] != "Namespace"):
            answer = kube.apply(obj)
            assert answer.allowed, f"{ident(obj)}: {answer.message}"
        self.namespaces = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Namespace"}
        self.clients: dict[str, Kube] = {}
        for ns in self.namespaces:
            self.clients[ns] = tenant_client(kube, ns)

    def labels_as(self, namespace: dict[str, Any]) -> None:
        """The namespace's labels set to the request's (an attack may have edited them), by the admin."""
        name = namespace["metadata"]["name"]
        wanted = {k: v for k, v in namespace["metadata"].get("labels", {}).items()
                  if k != "kubernetes.io/metadata.name"}
        current = self.kube.get("v1", "Namespace", name)
        assert current is not None
        have = {k: v for k, v in current["metadata"].get("labels", {}).items() if k != "kubernetes.io/metadata.name"}
        if have != wanted:
            patch = {"metadata": {"labels": {**{k: None for k in have if k not in wanted}, **wanted}}}
            answer = self.kube.request("PATCH", f"/api/v1/namespaces/{name}", patch,
                                       content_type="application/merge-patch+json")
            assert answer.allowed, answer.message

    def send(self, request: Request) -> Answer:
        assert request.namespace is not None
        ns = request.namespace["metadata"]["name"]
        self.labels_as(request.namespace)
        tenant = self.clients[ns]
        obj = copy.deepcopy(request.object)
        if request.operation == "CREATE":
            return tenant.create(obj)
        assert request.operation == "UPDATE" and request.old_object is not None
        old = copy.deepcopy(request.old_object)
        name = f"{old['metadata'].get('name', 'eval')}-{next(_names)}"
        old["metadata"]["name"] = obj["metadata"]["name"] = name
        created = tenant.create(old, dry_run=False)
        assert created.allowed, f"the old object of the update was refused: {created.message}"
        try:
            obj["metadata"]["resourceVersion"] = created.body["metadata"]["resourceVersion"]
            return tenant.update(obj, subresource=request.sub_resource)
        finally:
            self.kube.delete(old)


@pytest.fixture(scope="module")
def tenants(clusters) -> Iterator[Tenants]:  # type: ignore[no-untyped-def]
    _, kube = clusters("security")
    yield Tenants(kube)


def expected(attack: Attack) -> tuple[str, set[str], set[str]]:
    """What the offline model says: ("allow" | "deny:<policy>" | "pod-security:<level>"), warned policies, and the
    policies that deny (any of which the server may name: it stops at the first)."""
    request = attack.request()
    decision = admit(list(policy_objects()), request)
    assert request.namespace is not None
    level = request.namespace["metadata"].get("labels", {}).get(ENFORCE, "privileged")
    pod_security = (request.object["kind"] == "Pod" and request.operation == "CREATE"
                    and violations(request.object, level))
    if pod_security:
        return f"pod-security:{level}", set(decision.warned), set(decision.denied)
    if decision.denied:
        return "deny", set(decision.warned), set(decision.denied)
    return "allow", set(decision.warned), set()


def policies_named(texts: list[str]) -> set[str]:
    """gpushare policies a message or warnings name (`ValidatingAdmissionPolicy 'gpushare-x' with binding ...`)."""
    found = set()
    for text in texts:
        for part in text.split("ValidatingAdmissionPolicy '")[1:]:
            found.add(part.split("'", 1)[0])
    return found


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.id for a in ATTACKS])
def test_the_server_decides_as_the_offline_model(tenants: Tenants, attack: Attack) -> None:
    outcome, warned, denying = expected(attack)
    answer = tenants.send(attack.request())
    server_warned = policies_named(answer.warnings)
    if outcome == "allow":
        assert answer.allowed, answer.message
        assert server_warned == warned, answer.warnings
    elif outcome == "deny":
        assert answer.status in (403, 422), (answer.status, answer.body)
        named = policies_named([answer.message])
        assert named and named <= denying, answer.message
    else:
        assert answer.status == 403 and "violates PodSecurity" in answer.message, answer.message
        assert f'"{outcome.split(":")[1]}:' in answer.message, answer.message


def test_a_tenant_cannot_relabel_or_create_namespaces(tenants: Tenants) -> None:
    for ns, obj in tenants.namespaces.items():
        tenant = tenants.clients[ns]
        for label, value in ((TRUST_LABEL, "trusted"), (ENFORCE, "privileged")):
            answer = tenant.request("PATCH", f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {label: value}}},
                                    content_type="application/merge-patch+json")
            assert answer.status == 403, (ns, label, answer.status, answer.body)
        made = tenant.create({"apiVersion": "v1", "kind": "Namespace",
                              "metadata": {"name": f"{ns}-2", "labels": dict(obj["metadata"]["labels"])}})
        assert made.status == 403, (ns, made.status, made.body)
