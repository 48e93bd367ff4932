"""The CEL vocabulary of every policy: literals, the pod spec and template of whatever object is judged, the
workload variables, "judge only what an UPDATE changed", the namespace's trust and tenant, and the trust
that selects each binding's namespaces."""

from __future__ import annotations

from gpushare.core.namespaces import TENANT_LABEL, TRUST_LABEL, TRUSTED


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

IS_UPDATE = {"name": "isUpdate", "expression": "request.operation == 'UPDATE'"}
# On CREATE the "old" values are the new ones; every use is guarded by `isUpdate`, so no expression meets a null.
WORKLOAD_VARIABLES: list[dict[str, str]] = [
    IS_UPDATE,
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


# Bindings by trust: a label selector's NotIn also matches namespaces without the label (so: untrusted).
ALL_TENANTS = "all"
UNTRUSTED_ONLY = "untrusted"
TRUSTED_ONLY = "trusted"
