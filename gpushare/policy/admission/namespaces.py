"""Namespace policies: tenants never edit the labels that decide their own trust, priority and Pod Security
(through the Namespace and its status and finalize subresources), nor give themselves DRA admin access."""

from __future__ import annotations

from typing import Any

from gpushare.core.namespaces import (
    DRA_ADMIN_ACCESS_LABEL,
    POD_SECURITY_PREFIX,
    PRIORITY_LABEL,
    TENANT_LABEL,
    TRUST_LABEL,
)
from gpushare.policy.admission.cel import _labels
from gpushare.policy.admission.cluster import Deployer


def _guarded(key: str) -> str:
    return (f"({key} in ['{TRUST_LABEL}', '{TENANT_LABEL}', '{PRIORITY_LABEL}'] || "
            f"{key}.startsWith('{POD_SECURITY_PREFIX}'))")


# A binding's namespaceSelector reads a Namespace's new labels, so removing the tenant label would escape it:
# these policies match every namespace and select tenant ones (before or after the change) with a condition.
_TENANT_NAMESPACE_CONDITION = {
    "name": "tenant-namespace",
    "expression": f"'{TENANT_LABEL}' in {_labels('object')} || "
                  f"(request.operation == 'UPDATE' && '{TENANT_LABEL}' in {_labels('oldObject')})",
}

# The API server stores a Namespace's metadata from writes to namespaces/status and namespaces/finalize as well (a
# status write keeps only the old spec, a finalize only the old status): RBAC granting either reaches the labels.
_NAMESPACE_RULES = [
    {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["namespaces"], "operations": ["CREATE", "UPDATE"]},
    {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["namespaces/status", "namespaces/finalize"],
     "operations": ["UPDATE"]},
]

NAMESPACE_VARIABLES: list[dict[str, str]] = [
    {"name": "labels", "expression": _labels("object")},
    {"name": "oldLabels", "expression": f"request.operation == 'UPDATE' ? {_labels('oldObject')} : {{}}"},
]

NAMESPACE_POLICIES: dict[str, dict[str, Any]] = {
    "gpushare-tenant-namespace-labels": {
        "deployer_exempt": True,
        "validations": [{
            "expression": f"variables.labels.all(k, !{_guarded('k')} || "
                          "(k in variables.oldLabels && variables.oldLabels[k] == variables.labels[k])) && "
                          f"variables.oldLabels.all(k, !{_guarded('k')} || k in variables.labels)",
            "message": f"only gpushare's deployer sets a tenant namespace's {TRUST_LABEL}, {TENANT_LABEL}, "
                       f"{PRIORITY_LABEL} and {POD_SECURITY_PREFIX}* labels (admission trusts them): change the "
                       "tenant in the environment file instead",
            "reason": "Forbidden",
        }],
    },
    "gpushare-tenant-namespace-no-dra-admin": {
        "deployer_exempt": False,
        "validations": [{
            # Through a subresource it may stay as it was: the namespace controller's finalize of a namespace that
            # carried it before the policies must not leave the namespace terminating for ever.
            "expression": f"!('{DRA_ADMIN_ACCESS_LABEL}' in variables.labels) || (request.subResource != '' && "
                          f"'{DRA_ADMIN_ACCESS_LABEL}' in variables.oldLabels && "
                          f"variables.oldLabels['{DRA_ADMIN_ACCESS_LABEL}'] == "
                          f"variables.labels['{DRA_ADMIN_ACCESS_LABEL}'])",
            "message": f"tenant namespaces never carry {DRA_ADMIN_ACCESS_LABEL}: DRA admin access reaches devices "
                       "that other pods hold: remove the label (device monitoring runs outside tenant namespaces)",
            "reason": "Forbidden",
        }],
    },
}


def _deployer_condition(deployer: Deployer) -> dict[str, str]:
    users = ", ".join(f"'{u}'" for u in deployer.users)
    groups = ", ".join(f"'{g}'" for g in deployer.groups)
    return {
        "name": "not-gpushare-deployer",
        "expression": f"!(request.userInfo.username in [{users}] || (has(request.userInfo.groups) && "
                      f"request.userInfo.groups.exists(g, g in [{groups}])))",
    }
