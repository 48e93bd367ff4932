"""Quotas, for real: each tenant's ResourceQuota, as gpushare renders it, refuses a pod that would take the tenant
past its GPU quota on the resource names the device plugin advertises (MIG profiles, shared and whole GPUs), and
admits one that fills it exactly. Sent as the tenant's ServiceAccount, as dry runs (quota admission runs in full),
with Kueue's scheduling gate as its webhook sets it: a quota counts pods from their creation, gated or not."""

from __future__ import annotations

import pytest

from tests.cluster.environments import gated, tenant_client, tenant_pod

CLUSTERS = [("dev", "dev-metal"), ("pilot", "pilot-metal")]


def quotas(a) -> list[tuple[str, str, int]]:  # type: ignore[no-untyped-def]
    out = []
    for obj in a.objects:
        if obj["kind"] == "ResourceQuota" and obj["metadata"]["name"] == "gpushare-gpu-quota":
            for key, value in obj["spec"]["hard"].items():
                out.append((obj["metadata"]["namespace"], key.removeprefix("requests."), int(value)))
    return out


@pytest.mark.parametrize(("env", "cluster"), CLUSTERS, ids=[c for _, c in CLUSTERS])
def test_quota_refuses_beyond_and_admits_up_to_it(applied, env: str, cluster: str) -> None:  # type: ignore[no-untyped-def]
    a = applied(env, cluster)
    tenants = {t["namespace"]: t for t in a.plan["tenants"]}
    checked = 0
    for namespace, resource, hard in quotas(a):
        tenant = tenants[namespace]
        client = tenant_client(a.kube, namespace)
        over = client.create(gated(tenant_pod(namespace, tenant["priority"], {resource: hard + 1})))
        assert over.status == 403, (namespace, resource, over.status, over.message)
        if hard:  # (a resource the tenant has no quota of may be refused by a policy before quota is counted)
            assert "exceeded quota: gpushare-gpu-quota" in over.message, (namespace, resource, over.message)
            full = client.create(gated(tenant_pod(namespace, tenant["priority"], {resource: hard})))
            assert full.allowed, (namespace, resource, full.message)
            checked += 1
    assert checked >= 3  # every environment here has MIG, whole and shared quotas
