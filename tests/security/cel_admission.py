"""gpushare's ValidatingAdmissionPolicies as an API server would apply them, as far as CEL can show without one:
which policies match a request (resource rules, match conditions), which bindings select its namespace (label
selectors), and what each validation says, evaluated by two independent CEL implementations (cel-python, pure
Python; cel-expr-python, Google's C++ CEL) that must agree. The API server's own type checking, cost limits and
defaulting are not modelled: only a real cluster proves those."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

import celpy
from cel_expr_python import cel

# kind -> (API group, resource) for what gpushare's policies match
RESOURCES = {
    "Pod": ("", "pods"), "Namespace": ("", "namespaces"), "Deployment": ("apps", "deployments"),
    "StatefulSet": ("apps", "statefulsets"), "DaemonSet": ("apps", "daemonsets"),
    "ReplicaSet": ("apps", "replicasets"), "Job": ("batch", "jobs"), "CronJob": ("batch", "cronjobs"),
    "ConfigMap": ("", "configmaps"), "Secret": ("", "secrets"),
    "ResourceClaim": ("resource.k8s.io", "resourceclaims"),
    "ResourceClaimTemplate": ("resource.k8s.io", "resourceclaimtemplates"),
    "JobSet": ("jobset.x-k8s.io", "jobsets"),
}


_CELPY = celpy.Environment()


# Compiling is most of the suite's time and an expression's program does not depend on the request: once each.
@cache
def _celpy_program(expression: str) -> Any:
    return _CELPY.program(_CELPY.compile(expression))


@cache
def _google_program(names: tuple[str, ...], expression: str) -> Any:
    return _google_env(names).compile(expression)


@cache
def _google_env(names: tuple[str, ...]) -> Any:
    return cel.NewEnv(variables={**{k: cel.Type.DYN for k in names}, "variables": cel.Type.DYN})


def eval_celpy(expressions: list[str], variables: list[dict[str, str]], data: dict[str, Any]) -> list[bool]:
    activation: dict[str, Any] = {k: celpy.json_to_cel(v) for k, v in data.items()}
    values: dict[Any, Any] = {}
    activation["variables"] = celpy.celtypes.MapType(values)
    for var in variables:
        value = _celpy_program(var["expression"]).evaluate(activation)
        if isinstance(value, celpy.CELEvalError):
            raise AssertionError(f"cel-python: variable {var['name']}: {value}")
        values[celpy.celtypes.StringType(var["name"])] = value
        activation["variables"] = celpy.celtypes.MapType(values)
    out = []
    for expression in expressions:
        result = _celpy_program(expression).evaluate(activation)
        if not isinstance(result, celpy.celtypes.BoolType):
            raise AssertionError(f"cel-python: {expression!r} gave {result!r}, not a bool")
        out.append(bool(result))
    return out


def eval_google(expressions: list[str], variables: list[dict[str, str]], data: dict[str, Any]) -> list[bool]:
    names = tuple(sorted(data))
    scope: dict[str, Any] = {**data, "variables": {}}
    for var in variables:
        scope["variables"][var["name"]] = _google_program(names, var["expression"]).eval(data=scope).plain_value()
    out = []
    for expression in expressions:
        result = _google_program(names, expression).eval(data=scope).plain_value()
        if not isinstance(result, bool):
            raise AssertionError(f"cel-expr-python: {expression!r} gave {result!r}, not a bool")
        out.append(result)
    return out


def evaluate(expressions: list[str], variables: list[dict[str, str]], data: dict[str, Any]) -> list[bool]:
    """Both engines; they must agree on every expression."""
    ours = eval_celpy(expressions, variables, data)
    google = eval_google(expressions, variables, data)
    assert ours == google, (expressions, ours, google)
    return ours


def namespace(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A Namespace as the API server holds it: it sets kubernetes.io/metadata.name itself."""
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {**labels, "kubernetes.io/metadata.name": name}}}


@dataclass
class Request:
    """One admission request: the object, the old object on UPDATE, the namespace it lives in (None for a
    Namespace itself), the subresource and who asks."""

    object: dict[str, Any]
    namespace: dict[str, Any] | None
    operation: str = "CREATE"
    old_object: dict[str, Any] | None = None
    sub_resource: str = ""
    username: str = "alice"
    groups: tuple[str, ...] = ("tenants", "system:authenticated")

    def data(self) -> dict[str, Any]:
        group, resource = RESOURCES[self.object["kind"]]
        return {
            "object": self.object, "oldObject": self.old_object, "namespaceObject": self.namespace,
            "request": {"operation": self.operation, "subResource": self.sub_resource,
                        "resource": {"group": group, "resource": resource},
                        "userInfo": {"username": self.username, "groups": list(self.groups)}},
        }


@dataclass
class Decision:
    denied: dict[str, list[str]] = field(default_factory=dict)  # policy -> messages
    warned: dict[str, list[str]] = field(default_factory=dict)
    matched: list[str] = field(default_factory=list)  # policies whose rules, conditions and a binding matched

    @property
    def allowed(self) -> bool:
        return not self.denied


def _rule_matches(rule: dict[str, Any], group: str, resource: str, operation: str) -> bool:
    return group in rule["apiGroups"] and resource in rule["resources"] and operation in rule["operations"]


def selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (NotIn and DoesNotExist match where the key is absent)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op = e["key"], e["operator"]
        present = key in labels
        ok = {"In": present and labels.get(key) in e.get("values", []),
              "NotIn": not present or labels.get(key) not in e.get("values", []),
              "Exists": present, "DoesNotExist": not present}[op]
        if not ok:
            return False
    return True


def admit(objects: list[dict[str, Any]], request: Request) -> Decision:
    """What gpushare's policies decide on one request."""
    group, resource = RESOURCES[request.object["kind"]]
    full = f"{resource}/{request.sub_resource}" if request.sub_resource else resource
    policies = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "ValidatingAdmissionPolicy"}
    bindings = [o["spec"] for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    # For a Namespace, a namespaceSelector reads the object's own (new) labels.
    ns_labels = (request.namespace or request.object)["metadata"].get("labels", {})
    data = request.data()
    decision = Decision()
    for name, spec in policies.items():
        rules = spec["matchConstraints"]["resourceRules"]
        if not any(_rule_matches(r, group, full, request.operation) for r in rules):
            continue
        conditions = [c["expression"] for c in spec.get("matchConditions", [])]
        if conditions and not all(evaluate(conditions, [], data)):
            continue
        mine = [b for b in bindings if b["policyName"] == name and selector_matches(
            b.get("matchResources", {}).get("namespaceSelector", {}), ns_labels)]
        if not mine:
            continue
        decision.matched.append(name)
        results = evaluate([v["expression"] for v in spec["validations"]], spec.get("variables", []), data)
        failed = [v["message"] for v, ok in zip(spec["validations"], results, strict=True) if not ok]
        if not failed:
            continue
        for b in mine:
            if "Deny" in b["validationActions"]:
                decision.denied.setdefault(name, []).extend(failed)
            if "Warn" in b["validationActions"]:
                decision.warned.setdefault(name, []).extend(failed)
    return decision
