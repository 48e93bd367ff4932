"""DRA, for real: on the DRA example's `lab-dra` cluster, ResourceSlices published the way NVIDIA's DRA driver
publishes them (its driver name, device types and attributes from gpushare/data/dra-driver-nvidia-gpu.yaml; with the
chart's consumableShares on, every GPU and MIG device shareable up to that many claims through capacity `shares`)
for the kwok nodes with the planned GPUs and MIG layouts, and Kubernetes' own scheduler allocating the claims that
tenants' pods make from gpushare's ResourceClaimTemplates. What the driver itself does on a node (prepare the
device, apply the sharing config) needs a GPU."""

from __future__ import annotations

import itertools
from functools import cache
from typing import Any

import pytest
import yaml

from gpushare.core.paths import package_data_path
from tests.cluster.environments import Applied, gated, tenant_client, tenant_pod
from tests.cluster.kube import Kube, eventually

ENV, CLUSTER = "dra", "lab-dra"
_names = itertools.count()


@cache
def driver() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((package_data_path() / "dra-driver-nvidia-gpu.yaml").read_text())
    return data


def consumable_shares(a: Applied) -> int | None:
    """The chart's consumableShares as gpushare's values set it (None: off)."""
    from pathlib import Path

    values_files = list(Path(a.kube.kubeconfig).parents[1].glob(f"preview-{ENV}/helm-values/{CLUSTER}/*dra*.yaml"))
    assert values_files, "no DRA driver values in the preview"
    value = yaml.safe_load(values_files[0].read_text()).get("consumableShares")
    return int(value) if value not in (None, "disabled") else None


def slice_for(node: dict[str, Any], shares: int | None) -> dict[str, Any]:
    """One ResourceSlice per node, as the driver's kubelet plugin publishes it: a GPU in MIG mode shows its MIG
    devices (type mig, with the profile and the parent's UUID), other GPUs show themselves (type gpu)."""
    name = driver()["driver_name"]
    devices: list[dict[str, Any]] = []
    for index in range(node["gpus_per_node"]):
        uuid = f"GPU-{node['name']}-{index:02d}"
        common = {"productName": {"string": node["gpu_model"]}, "brand": {"string": "Nvidia"},
                  "architecture": {"string": "Ampere" if "A100" in node["gpu_model"] else "Hopper"},
                  "cudaComputeCapability": {"version": "8.0.0"}, "driverVersion": {"version": "580.95.5"},
                  "cudaDriverVersion": {"version": "13.0.0"}}
        capacity: dict[str, Any] = {}
        if shares is not None:
            capacity["shares"] = {"value": str(shares), "requestPolicy": {"default": "1", "validRange": {
                "min": "1", "max": str(shares)}}}
        if node.get("mig_layout"):
            for profile, count in node["mig_layout"].items():
                for i in range(count):
                    devices.append({
                        "name": f"gpu-{index}-mig-{profile.replace('.', '-')}-{i}",
                        "attributes": {"type": {"string": "mig"}, "uuid": {"string": f"MIG-{uuid}-{profile}-{i}"},
                                       "parentUUID": {"string": uuid}, "profile": {"string": profile}, **common},
                        "capacity": dict(capacity), **({"allowMultipleAllocations": True} if shares else {})})
        else:
            devices.append({"name": f"gpu-{index}", "attributes": {"type": {"string": "gpu"},
                                                                   "uuid": {"string": uuid}, **common},
                            "capacity": dict(capacity), **({"allowMultipleAllocations": True} if shares else {})})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node['name']}-{name}"},
            "spec": {"driver": name, "nodeName": node["name"],
                     "pool": {"name": node["name"], "generation": 1, "resourceSliceCount": 1}, "devices": devices}}


@pytest.fixture(scope="module")
def dra(applied) -> Applied:  # type: ignore[no-untyped-def]
    a: Applied = applied(ENV, CLUSTER)
    shares = consumable_shares(a)
    for node in a.nodes:
        answer = a.kube.apply(slice_for(node, shares))
        assert answer.allowed, answer.message
    return a


def templates(a: Applied, namespace: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in a.objects
            if o["kind"] == "ResourceClaimTemplate" and o["metadata"]["namespace"] == namespace}


def quota_of(a: Applied, namespace: str, device_class: str) -> int:
    key = f"{device_class}.deviceclass.resource.k8s.io/devices"
    return sum(int(o["spec"]["hard"].get(key, 0)) for o in a.objects if o["kind"] == "ResourceQuota"
               and o["metadata"]["namespace"] == namespace and o["metadata"]["name"] == "gpushare-gpu-quota")


def usable(a: Applied) -> list[tuple[dict[str, Any], str, dict[str, Any]]]:
    """(tenant, template name, its DeviceClass) for every template a tenant has quota to use: per class, the
    first tenant with quota for it."""
    classes = {o["metadata"]["name"]: o for o in a.objects if o["kind"] == "DeviceClass"}
    out, seen = [], set()
    for tenant in a.plan["tenants"]:
        for name, template in templates(a, tenant["namespace"]).items():
            cls = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
            if cls not in seen and quota_of(a, tenant["namespace"], cls) > 0:
                seen.add(cls)
                out.append((tenant, name, classes[cls]))
    return out


def flavor_for(a: Applied, cls: dict[str, Any]) -> dict[str, Any]:
    """The ResourceFlavor of the pool serving the class's profile: Kueue admits the workload onto it."""
    pools = {n["pool"] for n in a.nodes if n["profile"] == cls["metadata"]["labels"]["gpushare.io/profile"]}
    (flavor,) = [o["spec"] for o in a.objects if o["kind"] == "ResourceFlavor"
                 and o["spec"].get("nodeLabels", {}).get("gpushare.io/pool") in pools]
    return dict(flavor)


def claim_pod(namespace: str, priority: str, template: str) -> dict[str, Any]:
    pod = tenant_pod(namespace, priority, {}, name=f"dra-{next(_names)}")
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    return gated(pod)


def allocation(kube: Kube, pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The devices allocated to the pod's claim (after the scheduler has placed it)."""
    meta = pod["metadata"]

    def claim() -> dict[str, Any] | None:
        got = kube.get("v1", "Pod", meta["name"], meta["namespace"]) or {}
        statuses = got.get("status", {}).get("resourceClaimStatuses", [])
        if not statuses or not got.get("spec", {}).get("nodeName"):
            return None
        c = kube.get("resource.k8s.io/v1", "ResourceClaim", statuses[0]["resourceClaimName"], meta["namespace"])
        return c if c and c.get("status", {}).get("allocation") else None

    def why() -> str:
        got = kube.get("v1", "Pod", meta["name"], meta["namespace"]) or {}
        return str([c for c in got.get("status", {}).get("conditions", []) if c["type"] == "PodScheduled"]
                   + [got.get("spec", {}).get("schedulingGates"), got.get("status", {}).get("resourceClaimStatuses")])

    try:
        found = eventually(claim, timeout=30, what=f"the claim of pod {meta['name']} allocated")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the pod: {why()}") from None
    return list(found["status"]["allocation"]["devices"]["results"])


def device_attributes(a: Applied, node: str, device: str) -> dict[str, Any]:
    got = a.kube.get("resource.k8s.io/v1", "ResourceSlice", f"{node}-{driver()['driver_name']}") or {}
    (dev,) = [d for d in got["spec"]["devices"] if d["name"] == device]
    return {k: next(iter(v.values())) for k, v in dev["attributes"].items()}


def allocate(a: Applied, tenant: dict[str, Any], template: str, cls: dict[str, Any]) -> dict[str, Any]:
    """The device the real scheduler allocates to a pod of the tenant claiming through the template (the pod is
    created gated, admitted onto the flavor of the class's pool, and removed again)."""
    client = tenant_client(a.kube, tenant["namespace"])
    pod = claim_pod(tenant["namespace"], tenant["priority"], template)
    made = client.create(pod, dry_run=False)
    assert made.allowed, (template, made.message)
    try:
        a.kueue.admit(pod, flavor_for(a, cls))
        (result,) = allocation(a.kube, pod)
        return result
    finally:
        a.kube.delete(pod)


def test_each_template_is_allocated_exactly_its_model_and_profile(dra: Applied) -> None:
    checked = 0
    for tenant, name, cls in usable(dra):
        result = allocate(dra, tenant, name, cls)
        attrs = device_attributes(dra, result["pool"], result["device"])
        expression = cls["spec"]["selectors"][0]["cel"]["expression"]
        assert f"'{attrs['productName']}'" in expression, (name, attrs)
        if attrs["type"] == "mig":
            assert f"== '{attrs['profile']}'" in expression, (name, attrs)
        else:
            assert "type == 'gpu'" in expression, (name, attrs)
        checked += 1
    assert checked >= 4


def test_a_claim_beyond_the_tenants_quota_is_refused(dra: Applied) -> None:
    """The claim controller's claim counts against the namespace's ResourceQuota of DeviceClass devices."""
    tenant = next(t for t in dra.plan["tenants"] if t["trust"] == "untrusted")
    (name, cls) = next((n, t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"])
                       for n, t in templates(dra, tenant["namespace"]).items()
                       if quota_of(dra, tenant["namespace"], t["spec"]["spec"]["devices"]["requests"][0]["exactly"][
                           "deviceClassName"]) == 0)
    client = tenant_client(dra.kube, tenant["namespace"])
    pod = claim_pod(tenant["namespace"], tenant["priority"], name)
    assert client.create(pod, dry_run=False).allowed
    try:
        meta = pod["metadata"]
        events = eventually(lambda: [e for e in dra.kube.list("v1", "Event", meta["namespace"])
                                     if e["involvedObject"]["name"] == meta["name"]
                                     and e["reason"] == "FailedResourceClaimCreation"],
                            what="the claim controller reports the refused claim")
        assert "exceeded quota: gpushare-gpu-quota" in events[0]["message"] and cls in events[0]["message"]
        assert not dra.kube.list("resource.k8s.io/v1", "ResourceClaim", meta["namespace"])
    finally:
        dra.kube.delete(pod)


def test_an_untrusted_tenant_cannot_claim_a_shared_class_or_admin_access(dra: Applied) -> None:
    tenant = next(t for t in dra.plan["tenants"] if t["trust"] == "untrusted")
    client = tenant_client(dra.kube, tenant["namespace"])
    shared = [o["metadata"]["name"] for o in dra.objects if o["kind"] == "DeviceClass"
              and o["spec"]["config"][0]["opaque"]["parameters"].get("sharing", {}).get("strategy")
              in ("TimeSlicing", "MPS")]
    assert shared
    assert not any(n in templates(dra, tenant["namespace"]) for n in shared)  # none rendered for it
    for cls in shared:
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": f"own-{cls}", "namespace": tenant["namespace"]},
                 "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls}}]}}}
        answer = client.create(claim)
        assert answer.status in (403, 422), (cls, answer.status, answer.body)
        made = client.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                              "metadata": {"name": f"own-{cls}", "namespace": tenant["namespace"]},
                              "spec": {"spec": claim["spec"]}})
        assert made.status in (403, 422), (cls, made.status, made.body)
    for who in (tenant, next(t for t in dra.plan["tenants"] if t["trust"] == "trusted")):
        admin = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": "admin", "namespace": who["namespace"]},
                 "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                     "deviceClassName": "gpushare-exclusive", "adminAccess": True}}]}}}
        answer = tenant_client(dra.kube, who["namespace"]).create(admin)
        assert answer.status in (403, 422), (who["name"], answer.status, answer.body)


def test_exclusive_and_mig_claims_take_their_device_whole(dra: Applied) -> None:
    """With consumable shares on for the cluster (for time-slicing), every GPU and MIG device is published as
    shareable: a claim from an exclusive or MIG template must still consume all of its device's shares, so that no
    other claim, of any tenant, is allocated the same device."""
    shares = consumable_shares(dra)
    assert shares is not None
    checked = 0
    for tenant, name, cls in usable(dra):
        if cls["spec"]["config"][0]["opaque"]["parameters"].get("sharing", {}).get("strategy") in ("TimeSlicing",
                                                                                                    "MPS"):
            continue
        result = allocate(dra, tenant, name, cls)
        consumed = result.get("consumedCapacity", {}).get("shares")
        assert consumed == str(shares), f"{name}: the claim took {consumed} of {shares} shares of {result['device']}"
        checked += 1
    assert checked >= 4
