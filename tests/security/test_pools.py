"""Untrusted tenants stay on their own pools, in every shipped environment: the tolerations Kueue adds when it admits
a workload onto a tenant's flavor pass the pool-toleration policy, another pool's do not. Each tenant is judged as
if untrusted (the policy binds untrusted namespaces), through both CEL engines."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.core.guardrails import load_guardrails
from gpushare.core.namespaces import TRUST_LABEL
from gpushare.core.resolve import resolve, resolve_env
from gpushare.core.tenancy import ClusterTenancy, fleet_tenancy
from gpushare.policy.admission import admission_objects, pool_taints
from tests.conftest import PROFILES
from tests.security.cel_admission import Request, admit, namespace
from tests.security.tenants import FIXTURE, example_pod, kueue_webhook

POLICY = "gpushare-untrusted-pool-tolerations"


def tenancies(env: str) -> dict[str, ClusterTenancy]:
    fleet = resolve(FIXTURE, PROFILES) if env == "fixture" else resolve_env(env)
    return fleet_tenancy(fleet, load_guardrails())


def flavor_tolerations(ct: ClusterTenancy, pool: str) -> list[dict[str, Any]]:
    (flavor,) = [o for o in ct.objects if o["kind"] == "ResourceFlavor" and o["metadata"]["name"] == pool]
    tolerations = flavor["spec"].get("tolerations", [])
    assert isinstance(tolerations, list)
    return tolerations


def untrusted_request(ct: ClusterTenancy, tenant: str, tolerations: list[dict[str, Any]]) -> Request:
    (ns,) = [o for o in ct.objects if o["kind"] == "Namespace" and o["metadata"]["labels"]["gpushare.io/tenant"]
             == tenant]
    pod = example_pod()
    pod["metadata"]["namespace"] = ns["metadata"]["name"]
    pod["spec"]["tolerations"] = tolerations
    labels = {**ns["metadata"]["labels"], TRUST_LABEL: "untrusted"}
    return Request(kueue_webhook(pod), namespace(ns["metadata"]["name"], labels))


@pytest.mark.parametrize("env", ["dev", "pilot", "prod", "fixture"])
def test_kueue_tolerations_pass_and_other_pools_do_not(env: str) -> None:
    own_checked = other_checked = 0
    for ct in tenancies(env).values():
        objects = [o for o in admission_objects(pools=pool_taints(ct))
                   if o["metadata"]["name"] == POLICY or o["spec"].get("policyName") == POLICY]
        allowed = pool_taints(ct).allowed
        for tenant, pools in ct.tenant_pools.items():
            for pool in ct.pool_taints:
                tolerations = flavor_tolerations(ct, pool)
                if not tolerations:
                    continue
                decision = admit(objects, untrusted_request(ct, tenant, tolerations))
                assert decision.matched == [POLICY]
                if pool in pools:
                    assert decision.allowed, (tenant, pool, decision.denied)
                    own_checked += 1
                elif not set(ct.pool_taints[pool]) <= set(allowed.get(tenant, ())):
                    assert POLICY in decision.denied, (tenant, pool)
                    other_checked += 1
    assert own_checked and other_checked
