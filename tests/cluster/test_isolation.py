"""Isolation, for real: the attack suite of tests/security sent to Kubernetes' own API server as a tenant's
ServiceAccount (a real token), against the admission policies and tenant namespaces gpushare renders for the
suite's fixture. Every request is a dry run (admission runs in full, nothing is stored); the old object of an UPDATE
is created for real beforehand, before the policies are applied (as a pod from before a policy would be), and the
update is the JSON patch from the old object to the new one, as `kubectl edit` or a controller would send it.

The server's answer must be what the offline model (tests/security/cel_admission.py with both CEL engines, and
tests/security/pod_security.py for Pod Security) predicts: allowed or denied, by which policy or Pod Security
level, and with which warnings. Where they disagree the server is right and the offline model is what gets fixed.

Requests come from a ServiceAccount in the tenant's namespace holding the built-in `admin` role there
(environments.tenant_client); those the model sends as Kueue come with a token of Kueue's ServiceAccount, those
it sends as the controller manager or its controllers through impersonation by the admin."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from typing import Any

import jsonpatch
import pytest

from gpushare.core.namespaces import DRA_ADMIN_ACCESS_LABEL, PRIORITY_LABEL, TENANT_LABEL, TRUST_LABEL
from tests.cluster.environments import KueueStandIn, apply_crds, bind_cluster_admin, ident, tenant_client
from tests.cluster.kube import Answer, Kube, eventually
from tests.cluster.nodes import kwok_node
from tests.security.cel_admission import Request, admit
from tests.security.pod_security import violations
from tests.security.tenants import controller, policy_objects, tenancy_objects
from tests.security.test_attacks import ATTACKS, Attack, cpu_only, pod

ENFORCE = "pod-security.kubernetes.io/enforce"


# RuntimeClasses the attacks name: they must exist, or the server refuses the pod before admission.
RUNTIME_CLASSES = ("nvidia", "nvidia-legacy", "runc-unconfined", "kata")
TENANT_USER = "alice"  # the offline model's tenant user: sent as the tenant namespace's ServiceAccount


def name_for(attack_id: str) -> str:
    return "u-" + "".join(c if c.isalnum() else "-" for c in attack_id.lower())[:50].strip("-")


class Tenants:
    """The suite's cluster: tenant namespaces with a ServiceAccount each, the old objects of every UPDATE attack
    created as they were before the policies existed (a pod from before a policy is what such an attack edits), then
    gpushare's policies and tenant objects applied."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        apply_crds(kube)
        # Not the ResourceQuotas: the old objects below would use them up; tests/cluster/test_quotas.py has them.
        objects = [o for o in (*policy_objects(), *tenancy_objects()) if o["kind"] != "ResourceQuota"]
        # The model also sends Job pods as the controller manager itself, as one without
        # --use-service-account-credentials creates them: give that user the rights it has there.
        bind_cluster_admin(kube, "controller-manager-without-service-account-credentials",
                           {"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                            "name": "system:kube-controller-manager"})
        for name in RUNTIME_CLASSES:
            kube.apply({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name},
                        "handler": name.replace("-", "")})
        first = [o for o in objects if o["kind"] in ("Namespace", "PriorityClass")]
        for obj in first:
            # namespaces as they were before gpushare: without its Pod Security levels yet
            if obj["kind"] == "Namespace":
                obj = copy.deepcopy(obj)
                obj["metadata"]["labels"] = {k: v for k, v in obj["metadata"].get("labels", {}).items()
                                             if not k.startswith("pod-security.kubernetes.io/")}
            answer = kube.apply(obj)
            assert answer.allowed, f"{ident(obj)}: {answer.message}"
        self.namespaces = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Namespace"}
        self.clients: dict[str, Kube] = {ns: tenant_client(kube, ns) for ns in self.namespaces}
        self.kueue = KueueStandIn(kube)
        # The node the attacks bind pods to: without it the pod garbage collector removes such pods at once.
        kube.create(kwok_node({"name": "gpu-node-1", "labels": {}, "taints": [], "advertised": {}}), dry_run=False)
        self.relabeled = 0.0  # when labels_as last changed a namespace's labels (time.monotonic)
        self.old: dict[str, Answer] = {}  # attack id -> the creation of its old object
        for attack in ATTACKS:
            request = attack.request()
            if request.operation == "UPDATE" and request.old_object is not None:
                old = copy.deepcopy(request.old_object)
                old["metadata"]["name"] = name_for(attack.id)
                self.old[attack.id] = kube.create(old, dry_run=False)
        for obj in objects:
            if obj not in first or obj["kind"] == "Namespace":
                answer = kube.apply(obj)
                assert answer.allowed, f"{ident(obj)}: {answer.message}"
        # Policies take effect once the API server's policy informer has them: wait for one to deny.
        probe = ATTACKS_BY_ID["host-path-untrusted"].request()
        eventually(lambda: self.send_create(probe).status == 403, what="gpushare's policies in force")

    def client_for(self, request: Request) -> Kube:
        assert request.namespace is not None
        if request.username == TENANT_USER:
            return self.clients[request.namespace["metadata"]["name"]]
        if request.username.startswith("system:serviceaccount:kueue-system:"):
            return self.kueue.kube
        return self.kube.as_user(request.username)  # the controller manager and its controllers' accounts

    def labels_as(self, namespace: dict[str, Any]) -> None:
        """The namespace's labels set to the request's (an attack may have edited them), by the admin. Admission
        reads namespaces from the API server's informer, which sees a relabel a moment later: `relabeled` says
        when the next answer may still come from the old labels."""
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
            self.relabeled = time.monotonic()

    def send_create(self, request: Request) -> Answer:
        assert request.namespace is not None
        self.labels_as(request.namespace)
        return self.client_for(request).create(copy.deepcopy(request.object))

    def send(self, attack: Attack) -> Answer:
        request = attack.request()
        if request.operation == "CREATE":
            return self.send_create(request)
        assert request.namespace is not None and request.old_object is not None
        created = self.old[attack.id]
        assert created.allowed, f"the old object of the update could not be created: {created.message}"
        self.labels_as(request.namespace)
        # The change from the old object to the new, as a JSON patch of what the server stores (defaults and all).
        old, new = copy.deepcopy(request.old_object), copy.deepcopy(request.object)
        for o in (old, new):
            o["metadata"]["name"] = name_for(attack.id)
        operations = jsonpatch.make_patch(_pruned(old), _pruned(new)).patch
        return self.client_for(request).patch(new, operations, subresource=request.sub_resource)


ATTACKS_BY_ID = {a.id: a for a in ATTACKS}


def _pruned(value: Any) -> Any:
    """Empty maps and lists dropped, as the server stores them: a patch must not address what it omits."""
    if isinstance(value, dict):
        out = {k: _pruned(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in ({}, [])}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


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
    # Pod Security judges a pod's creation and every change of its spec (ephemeral containers included), not
    # metadata-only updates, and never controllers (it only warns about their templates).
    judged = request.object["kind"] == "Pod" and (
        request.operation == "CREATE" or (request.old_object or {}).get("spec") != request.object["spec"])
    pod_security = judged and violations(request.object, level)
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


RELABEL_SETTLE_S = 5.0


def _outcome_of(answer: Answer) -> str:
    if answer.allowed:
        return "allow"
    if answer.status == 403 and "violates PodSecurity" in answer.message:
        return "pod-security"
    return "deny" if answer.status in (403, 422) else "other"


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.id for a in ATTACKS])
def test_the_server_decides_as_the_offline_model(tenants: Tenants, attack: Attack) -> None:
    outcome, warned, denying = expected(attack)
    answer = tenants.send(attack)
    # Right after a relabel the server may still judge by the namespace's old labels (its informer lags the
    # write): ask again for a few seconds while the answer's outcome differs. A real disagreement outlasts that.
    while (_outcome_of(answer) != outcome.split(":")[0] and tenants.relabeled
           and time.monotonic() - tenants.relabeled < RELABEL_SETTLE_S):
        time.sleep(0.2)
        answer = tenants.send(attack)
    server_warned = policies_named(answer.warnings)
    if outcome == "allow":
        assert answer.allowed, (answer.status, str(answer.body)[:1500])
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


# ---- issue 39: namespace labels through subresources, tolerations of taints that are no pool's, claim templates

LABELS_POLICY = "gpushare-tenant-namespace-labels"
POOLS_POLICY = "gpushare-untrusted-pool-tolerations"
INLINE_VOLUMES_POLICY = "gpushare-untrusted-no-inline-volumes"


def settled(tenants: Tenants, attack: Attack, allowed: bool) -> Answer:
    """The server's answer to the attack once a relabel by an earlier attack has reached its informer."""
    answer = tenants.send(attack)
    while (answer.allowed != allowed and tenants.relabeled
           and time.monotonic() - tenants.relabeled < RELABEL_SETTLE_S):
        time.sleep(0.2)
        answer = tenants.send(attack)
    return answer


def _refused_by(answer: Answer, policy: str) -> bool:
    return answer.status == 403 and policy in policies_named([answer.message])


def _past_rbac(send: Callable[[], Answer], what: str) -> Answer:
    """The answer once RBAC granted a moment ago is in force (the authorizer sees a new binding a little later):
    asked again while the server refuses before admission."""
    def attempt() -> Answer | None:
        answer = send()
        return None if answer.status == 403 and "ValidatingAdmissionPolicy" not in answer.message else answer
    found: Answer = eventually(attempt, timeout=30, what=what)
    return found


def _namespace_write(client: Kube, name: str, sub: str, labels: dict[str, str],
                     finalizers: list[str] | None = None, dry_run: bool = True) -> Answer:
    """A PUT of the Namespace to its subresource `sub` with these labels (and spec.finalizers), as a client of that
    subresource sends it: the whole object, read first."""
    current = client.get("v1", "Namespace", name)
    assert current is not None, name
    current["metadata"]["labels"] = labels
    if finalizers is not None:
        current["spec"]["finalizers"] = finalizers
    return client.request("PUT", f"/api/v1/namespaces/{name}/{sub}", current,
                          [("dryRun", "All")] if dry_run else [])


def _namespace_policies_in_force(tenants: Tenants) -> None:
    """The namespace policies judge requests: the API server loads policies and bindings a moment after they are
    written, and the suite's own probe waits for a workload policy only. Probed with what even the deployer may not
    do (a tenant has no rights on its Namespace itself)."""
    def refused() -> bool:
        answer = tenants.kube.request(
            "PATCH", "/api/v1/namespaces/partner", {"metadata": {"labels": {DRA_ADMIN_ACCESS_LABEL: "true"}}},
            [("dryRun", "All")], "application/merge-patch+json")
        return _refused_by(answer, "gpushare-tenant-namespace-no-dra-admin")
    eventually(refused, what="gpushare's namespace policies in force")


def test_namespace_subresources_cannot_change_guarded_labels(tenants: Tenants) -> None:
    """RBAC granting namespaces/status or namespaces/finalize (a Role in the tenant's namespace reaches its own
    Namespace object) does not reach the guarded labels: the server stores metadata from both."""
    ns = "partner"
    kube, tenant = tenants.kube, tenants.clients[ns]
    _namespace_policies_in_force(tenants)
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "namespace-subresources", "namespace": ns},
                "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},
                          {"apiGroups": [""], "resources": ["namespaces/status", "namespaces/finalize"],
                           "verbs": ["update", "patch"]}]})
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "namespace-subresources", "namespace": ns},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "namespace-subresources"},
                "subjects": [{"kind": "ServiceAccount", "name": "ci", "namespace": ns}]})
    current = kube.get("v1", "Namespace", ns)
    assert current is not None
    labels = dict(current["metadata"]["labels"])
    escaped = {k: v for k, v in labels.items() if k != TENANT_LABEL} | {ENFORCE: "privileged"}
    for sub in ("status", "finalize"):
        # RBAC lets the tenant write the subresource (RoleBindings reach a while to show up in the authorizer) ...
        kept = _past_rbac(lambda sub=sub: _namespace_write(tenant, ns, sub, {**labels, "team.example.com/cost": "42"}),
                          f"the tenant's Role for namespaces/{sub} in force")
        assert kept.allowed, (sub, kept.status, kept.body)
        assert kept.body["metadata"]["labels"].get("team.example.com/cost") == "42", sub  # the server stores it
        # ... but no change of a guarded label through it
        for change in (escaped, {**labels, TRUST_LABEL: "trusted"}, {**labels, PRIORITY_LABEL: "online"}):
            answer = _namespace_write(tenant, ns, sub, change)
            assert _refused_by(answer, LABELS_POLICY), (sub, change, answer.status, answer.body)
        if sub == "status":  # (finalize takes PUT only)
            answer = tenant.request("PATCH", f"/api/v1/namespaces/{ns}/{sub}",
                                    {"metadata": {"labels": {TENANT_LABEL: None, ENFORCE: "privileged"}}},
                                    [("dryRun", "All")], "application/merge-patch+json")
            assert _refused_by(answer, LABELS_POLICY), (sub, answer.status, answer.body)
        # the deployer (system:masters here) still changes them, through the subresource too
        assert _namespace_write(kube, ns, sub, escaped).allowed, sub


def test_a_tenant_namespace_is_still_finalized_when_deleted(tenants: Tenants) -> None:
    """Deletion finalizes a Namespace through namespaces/finalize: the namespace controller's own write, and another
    finalizer's (an identity granted namespaces/finalize by a ClusterRole) that keeps the guarded labels, pass; the
    same write dropping the tenant label does not."""
    name, hold = "partner-finalize-probe", "example.com/hold"
    kube = tenants.kube
    _namespace_policies_in_force(tenants)
    labels = {k: v for k, v in tenants.namespaces["partner"]["metadata"]["labels"].items()
              if k != "kubernetes.io/metadata.name"}
    made = kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels},
                        "spec": {"finalizers": [hold]}}, dry_run=False)
    assert made.allowed, made.message
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "probe-finalizer"},
                "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},
                          {"apiGroups": [""], "resources": ["namespaces/finalize"], "verbs": ["update"],
                           "resourceNames": [name]}]})
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "probe-finalizer"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "probe-finalizer"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "probe-finalizer"}]})
    finalizer = kube.as_user("probe-finalizer")
    gone = kube.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    assert gone.allowed, gone.message
    # The namespace controller empties the namespace and removes its own finalizer through namespaces/finalize.
    eventually(lambda: (kube.get("v1", "Namespace", name) or {}).get("spec", {}).get("finalizers") == [hold],
               what="the namespace controller's finalize of a tenant namespace")
    escaped = {k: v for k, v in labels.items() if k != TENANT_LABEL}
    refused = _past_rbac(lambda: _namespace_write(finalizer, name, "finalize", escaped, []),
                         "the finalizer's ClusterRole in force")
    assert _refused_by(refused, LABELS_POLICY), (refused.status, refused.body)
    done = _namespace_write(finalizer, name, "finalize", {**labels, "kubernetes.io/metadata.name": name}, [],
                            dry_run=False)
    assert done.allowed, (done.status, done.body)
    eventually(lambda: kube.get("v1", "Namespace", name) is None, what=f"namespace {name} deleted")


def test_untrusted_pods_tolerate_no_taint_but_their_pools_and_kubernetes_own(tenants: Tenants) -> None:
    for refused in ("untrusted-tolerates-control-plane", "untrusted-tolerates-other-taint",
                    "untrusted-deployment-tolerates-control-plane", "untrusted-control-plane-toleration-added-later"):
        answer = settled(tenants, ATTACKS_BY_ID[refused], allowed=False)
        assert _refused_by(answer, POOLS_POLICY), (refused, answer.status, answer.body)
    for admitted in ("untrusted-tolerates-api-server-defaults", "untrusted-tolerates-daemonset-defaults",
                     "untrusted-tolerates-own-pool", "untrusted-tolerates-gpu-taint",
                     "trusted-tolerates-control-plane"):
        answer = settled(tenants, ATTACKS_BY_ID[admitted], allowed=True)
        assert answer.allowed, (admitted, answer.status, answer.body)
    # A pod without tolerations gets the API server's defaults (DefaultTolerationSeconds), which pass.
    answer = settled(tenants, ATTACKS_BY_ID["example-pod-untrusted"], allowed=True)
    assert answer.allowed, answer.body
    assert {t["key"] for t in answer.body["spec"]["tolerations"]} == {"node.kubernetes.io/not-ready",
                                                                      "node.kubernetes.io/unreachable"}
    # A DaemonSet's pods, which its controller creates with node.kubernetes.io tolerations of its own, run.
    kube, ns = tenants.kube, "partner"
    daemonset = controller("DaemonSet", pod(ns, cpu_only))
    daemonset["metadata"]["name"] = "tolerations-probe"
    made = tenants.clients[ns].create(daemonset, dry_run=False)
    assert made.allowed, made.message
    try:
        uid = made.body["metadata"]["uid"]
        pods = eventually(lambda: [p for p in kube.list("v1", "Pod", ns) if any(
            o["uid"] == uid for o in p["metadata"].get("ownerReferences", []))], what="the DaemonSet's pod created")
        assert {t["key"] for t in pods[0]["spec"]["tolerations"]} >= {
            "node.kubernetes.io/not-ready", "node.kubernetes.io/unschedulable"}, pods[0]["spec"]["tolerations"]
    finally:
        kube.delete(daemonset)


def test_untrusted_statefulsets_carry_no_claim_templates(tenants: Tenants) -> None:
    answer = settled(tenants, ATTACKS_BY_ID["untrusted-statefulset-volume-claim-templates"], allowed=False)
    assert _refused_by(answer, INLINE_VOLUMES_POLICY), (answer.status, answer.body)
    for admitted in ("statefulset-allowed", "untrusted-statefulset-scales-with-volume-claim-templates",
                     "trusted-statefulset-volume-claim-templates"):
        answer = settled(tenants, ATTACKS_BY_ID[admitted], allowed=True)
        assert answer.allowed, (admitted, answer.status, answer.body)
