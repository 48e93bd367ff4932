"""Scheduling, for real: kwok nodes made from `gpushare plan --json` (labels, taints and allocatable exactly as
planned; the Pulumi-owned labels arrive by applying the preview's Node patches), and Kubernetes' own scheduler
placing tenants' pods. Kueue is not running here: a tenant's pod is created gated, as Kueue's webhook leaves it,
and then given what Kueue's controller adds when it admits the workload onto a ResourceFlavor (the flavor's node
labels, its tolerations, the gate lifted; environments.KueueStandIn), which is how a queued pod reaches a pool."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tests.cluster.environments import gated, tenant_client, tenant_pod
from tests.cluster.kube import Kube, eventually

CLUSTERS = [("dev", "dev-metal"), ("pilot", "pilot-metal")]
SHARED = ("time-slicing", "mps", "mig-time-slicing")
_names = itertools.count()


def flavors(a) -> dict[str, dict[str, Any]]:  # type: ignore[no-untyped-def]
    return {o["metadata"]["name"]: o["spec"] for o in a.objects if o["kind"] == "ResourceFlavor"}


def queue_flavors(a, tenant: str) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    """(flavor, resource) pairs the tenant's ClusterQueue gives it any quota of (nominal or borrowing)."""
    out = []
    for o in a.objects:
        if o["kind"] == "ClusterQueue" and o["metadata"]["name"] == f"tenant-{tenant}":
            for group in o["spec"]["resourceGroups"]:
                for flavor in group["flavors"]:
                    for r in flavor["resources"]:
                        if r["name"].startswith("nvidia.com/") and (
                                int(r["nominalQuota"]) or int(r.get("borrowingLimit", 0) or 0)):
                            out.append((flavor["name"], r["name"]))
    return out


def node_of(kube: Kube, pod: dict[str, Any]) -> str:
    meta = pod["metadata"]
    return str(eventually(lambda: (kube.get("v1", "Pod", meta["name"], meta["namespace"]) or {})
                          .get("spec", {}).get("nodeName"), what=f"pod {meta['name']} scheduled"))


def unschedulable(kube: Kube, pod: dict[str, Any]) -> bool:
    meta = pod["metadata"]

    def reason() -> str | None:
        got = kube.get("v1", "Pod", meta["name"], meta["namespace"]) or {}
        assert not got.get("spec", {}).get("nodeName"), f"placed on {got['spec']['nodeName']}"
        for c in got.get("status", {}).get("conditions", []):
            if c["type"] == "PodScheduled" and c["status"] == "False":
                return str(c.get("reason"))
        return None

    return eventually(reason, what=f"the scheduler rules on pod {meta['name']}") == "Unschedulable"


def nodes_by_name(a) -> dict[str, dict[str, Any]]:  # type: ignore[no-untyped-def]
    return {n["name"]: n for n in a.nodes}


@pytest.mark.parametrize(("env", "cluster"), CLUSTERS, ids=[c for _, c in CLUSTERS])
def test_queued_pods_land_on_their_flavors_pool_where_the_resource_is_advertised(  # type: ignore[no-untyped-def]
        applied, env: str, cluster: str) -> None:
    a = applied(env, cluster)
    nodes, flavor_specs = nodes_by_name(a), flavors(a)
    placed = 0
    for tenant in a.plan["tenants"]:
        if cluster not in (tenant.get("clusters") or [cluster]):
            continue
        client = tenant_client(a.kube, tenant["namespace"])
        for flavor, resource in queue_flavors(a, tenant["name"]):
            spec = flavor_specs[flavor]
            pod = gated(tenant_pod(tenant["namespace"], tenant["priority"], {resource: 1},
                                   name=f"q-{next(_names)}"))
            made = client.create(pod, dry_run=False)
            assert made.allowed, (tenant["name"], flavor, resource, made.message)
            try:
                a.kueue.admit(pod, spec)
                node = nodes[node_of(a.kube, pod)]
            finally:
                a.kube.delete(pod)
            assert all(node["labels"].get(k, {}).get("value") == v for k, v in spec.get("nodeLabels", {}).items())
            assert node["advertised"].get(resource, 0) > 0, (node["name"], resource)
            if tenant["trust"] == "untrusted":
                assert node["sharing"] not in SHARED, (tenant["name"], node["name"], node["sharing"])
            placed += 1
    assert placed >= 4


@pytest.mark.parametrize(("env", "cluster"), CLUSTERS, ids=[c for _, c in CLUSTERS])
def test_an_untrusted_pod_never_lands_on_a_shared_node(applied, env: str, cluster: str) -> None:  # type: ignore[no-untyped-def]
    """Even aimed at the node by name (a node selector, which admission allows), with no GPU asked for."""
    a = applied(env, cluster)
    shared = [n for n in a.nodes if n["sharing"] in SHARED]
    untrusted = [t for t in a.plan["tenants"] if t["trust"] == "untrusted"
                 and cluster in (t.get("clusters") or [cluster])]
    assert shared and untrusted
    for tenant in untrusted:
        client = tenant_client(a.kube, tenant["namespace"])
        for node in shared:
            pod = tenant_pod(tenant["namespace"], tenant["priority"], {}, name=f"cpu-{next(_names)}")
            pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node["name"]}
            made = client.create(pod, dry_run=False)
            assert made.allowed, made.message
            try:
                assert unschedulable(a.kube, pod), node["name"]
            finally:
                a.kube.delete(pod)


@pytest.mark.parametrize(("env", "cluster"), CLUSTERS, ids=[c for _, c in CLUSTERS])
def test_a_mig_request_lands_only_where_that_profile_is_advertised(applied, env: str, cluster: str) -> None:  # type: ignore[no-untyped-def]
    """The scheduler alone (every pool taint tolerated, no selector): the resource name decides."""
    a = applied(env, cluster)
    profiles = sorted({r for n in a.nodes for r in n["advertised"] if r.startswith("nvidia.com/mig-")})
    assert profiles
    for resource in profiles:
        pod = tenant_pod("default", "batch", {resource: 1}, name=f"mig-{next(_names)}")
        del pod["metadata"]["labels"]
        pod["spec"].pop("priorityClassName")
        pod["spec"]["tolerations"] = [{"operator": "Exists"}]
        made = a.kube.create(pod, dry_run=False)
        assert made.allowed, made.message
        try:
            node = nodes_by_name(a)[node_of(a.kube, pod)]
        finally:
            a.kube.delete(pod)
        assert node["advertised"].get(resource, 0) > 0, (resource, node["name"], node["advertised"])
