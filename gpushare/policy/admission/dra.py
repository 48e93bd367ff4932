"""DRA clusters (docs/dra.md): a pod's claims only from its tenant's gpushare templates, no extended-resource
GPUs, no ResourceClaims or templates of the tenants' own."""

from __future__ import annotations

from typing import Any

from gpushare.policy.admission.cel import _TENANT_NAME, _each_new, _strings
from gpushare.policy.admission.cluster import (
    CLAIM_CONTROLLER_USERS,
    DRA_EXTENDED_RESOURCE,
    IMPLICIT_EXTENDED_PREFIX,
    DraClaims,
)

_NO_CLAIMS_POLICY = "gpushare-no-resource-claims"


def _no_extended_gpu(field: str) -> str:
    return (f"!has(c.resources.{field}) || (!('{DRA_EXTENDED_RESOURCE}' in c.resources.{field}) && "
            f"!c.resources.{field}.exists(k, k.startsWith('{IMPLICIT_EXTENDED_PREFIX}')))")


def dra_workload_policies(claims: DraClaims) -> dict[str, dict[str, Any]]:
    """On DRA clusters these replace gpushare-no-resource-claims: a pod's claims come only from the gpushare
    templates its tenant may use (pairs `tenant/template`, looked up by the namespace's guarded tenant label)."""
    pairs = sorted(f"{tenant}/{t}" for tenant, names in claims.templates.items() for t in names)
    template = "(has(r.resourceClaimTemplateName) ? r.resourceClaimTemplateName : '')"
    allowed = (f"{template} != '' && (variables.tenantName + '/' + {template}) in {_strings(pairs)} && "
               f"(!variables.untrusted || {template} in {_strings(sorted(claims.isolated))})")
    return {
        "gpushare-dra-claim-templates": {
            "variables": [{"name": "tenantName", "expression": _TENANT_NAME}],
            "validations": [{
                "expression": _each_new("resourceClaims", "r", allowed),
                "message": "on this DRA cluster a pod's spec.resourceClaims may only name a gpushare claim template "
                           "its tenant may use (resourceClaimTemplateName gpushare-<profile>; untrusted tenants "
                           "only those of MIG or exclusive profiles); shared claims (resourceClaimName) are refused: "
                           "reference one of those templates (`kubectl get resourceclaimtemplates` in the namespace "
                           "lists them)",
                "reason": "Forbidden",
            }],
        },
        "gpushare-dra-no-extended-gpu": {
            "validations": [{
                "expression": _each_new("containers", "c", f"!has(c.resources) || (({_no_extended_gpu('limits')}) "
                                                           f"&& ({_no_extended_gpu('requests')}))"),
                "message": f"on this DRA cluster {DRA_EXTENDED_RESOURCE} is served by the driver's own DeviceClass "
                           f"(extendedResourceName) and {IMPLICIT_EXTENDED_PREFIX}<class> by any class, outside "
                           "gpushare's profiles, shares and quota: reference a gpushare claim template in "
                           "spec.resourceClaims instead",
                "reason": "Forbidden",
            }],
        },
    }


def _dra_claims_policy() -> dict[str, Any]:
    """Tenants create no ResourceClaims or templates of their own: a claim could name any DeviceClass, a template
    in place of gpushare's could change what `gpushare-<profile>` means. The claim controller and gpushare may."""
    users = ", ".join(f"'{u}'" for u in CLAIM_CONTROLLER_USERS)
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["*"],
                                                "resources": ["resourceclaims", "resourceclaimtemplates"],
                                                "operations": ["CREATE", "UPDATE"]}]},
        "matchConditions": [{"name": "not-claim-controller",
                             "expression": f"!(request.userInfo.username in [{users}])"}],
        # An UPDATE that keeps the spec passes: the scheduler adds its delete-protection finalizer and the garbage
        # collector its owner references while binding; only what a claim asks for is gpushare's alone.
        "validations": [{
            "expression": "request.operation == 'UPDATE' && has(oldObject.spec) && object.spec == oldObject.spec",
            "message": "ResourceClaims and ResourceClaimTemplates in tenant namespaces come from gpushare: reference "
                       "a gpushare claim template (gpushare-<profile>) in the pod's spec.resourceClaims",
            "reason": "Forbidden",
        }],
    }


DRA_CLAIMS_POLICY = "gpushare-dra-no-tenant-claims"
