"""Workload policies on priority: the PriorityClass of the tenant's priority, and Kueue's WorkloadPriorityClass
label wherever Kueue or its webhooks read it."""

from __future__ import annotations

from typing import Any

from gpushare.core.namespaces import PRIORITY_CLASSES, PRIORITY_LABEL, WORKLOAD_PRIORITY_LABEL
from gpushare.policy.admission.cel import _each_new, _labels, _lit, _template_labels

_PRIORITY = "(has(variables.podSpec.priorityClassName) ? variables.podSpec.priorityClassName : '')"
_OLD_PRIORITY = "(has(variables.oldPodSpec.priorityClassName) ? variables.oldPodSpec.priorityClassName : '')"
_ONLINE_NAMESPACE = (f"(has(namespaceObject.metadata.labels) && '{PRIORITY_LABEL}' in namespaceObject.metadata.labels "
                     f"&& namespaceObject.metadata.labels['{PRIORITY_LABEL}'] == 'online')")


def _workload_priorities(obj: str) -> str:
    """Every WorkloadPriorityClass label of the object: its own, its pod template's, a CronJob's job template's."""
    def pick(labels: str) -> str:
        return f"({_lit(WORKLOAD_PRIORITY_LABEL)} in {labels} ? [{labels}[{_lit(WORKLOAD_PRIORITY_LABEL)}]] : [])"
    cron = pick(_template_labels(f"{obj}.spec.jobTemplate")) + " + " + pick(
        _template_labels(f"{obj}.spec.jobTemplate.spec.template"))
    return (f"{pick(_labels(obj))} + ({obj}.kind == 'Pod' ? [] : {obj}.kind == 'CronJob' ? {cron} : "
            f"{pick(_template_labels(f'{obj}.spec.template'))})")


_PRIORITY_VARIABLES = [
    {"name": "workloadPriorities", "expression": _workload_priorities("object")},
    {"name": "oldWorkloadPriorities",
     "expression": f"variables.isUpdate ? {_workload_priorities('oldObject')} : []"},
]


def _priority_policy(names: dict[str, str]) -> dict[str, Any]:
    """Tenant pods name the PriorityClass of their tenant's priority (`names`: gpushare's own, or the cluster's own
    an adopted environment keeps, adoption.priority_classes); Kueue workloads gpushare's WorkloadPriorityClasses."""
    online, batch = names["online"], names["batch"]
    return {
        # The namespace's priority label is the environment file's; only the deployer changes it (namespace policy).
        "variables": _PRIORITY_VARIABLES,
        "validations": [
            {
                "expression": f"(variables.isUpdate && {_PRIORITY} == {_OLD_PRIORITY}) || "
                              f"({_PRIORITY} in ['{online}', '{batch}'] && "
                              f"({_PRIORITY} != '{online}' || {_ONLINE_NAMESPACE}))",
                "message": f"pods and pod templates in tenant namespaces use {batch}, or {online} where the "
                           "tenant's priority is online: set spec.priorityClassName to one of them (the environment "
                           "file sets the tenant's priority)",
                "reason": "Forbidden",
            },
            {
                "expression": _each_new("workloadPriorities", "p", f"p == '{PRIORITY_CLASSES['batch']}' || "
                                        f"(p == '{PRIORITY_CLASSES['online']}' && {_ONLINE_NAMESPACE})"),
                "message": f"Kueue orders, preempts and reclaims by the WorkloadPriorityClass in "
                           f"{WORKLOAD_PRIORITY_LABEL}: set it to {PRIORITY_CLASSES['batch']}, or "
                           f"{PRIORITY_CLASSES['online']} where the tenant's priority is online, or leave it out "
                           "(Kueue then reads the pods' priority class)",
                "reason": "Forbidden",
            },
        ],
    }
