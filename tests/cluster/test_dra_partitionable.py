"""DRA as Kubernetes 1.36 and 1.37 ship it, allocated by the real kube-scheduler: gpushare's DeviceClasses and claim
templates (tests/cluster/dra-partitionable.yaml: a DRA cluster of H200s with a dynamic-MIG pool, an exclusive pool and
a time-sliced one) against ResourceSlices in the exact shape NVIDIA's DRA driver v0.5.0 publishes with DynamicMIG and
consumable shares (tests/cluster/dra_slices.py): per GPU a full device and every MIG profile at every placement, one
shared counter set per GPU, `shares` on every device.

What each test shows, and the minor it needs (a test skips on an older API server and says why;
GPUSHARE_FORCE_MINOR_TESTS=1 runs it anyway, to see it fail there):
- the API server keeps the driver's slices whole (partitionable devices and consumable capacity on);
- dynamic MIG claims never overcommit a GPU's counters, and a full-GPU claim does not join a GPU one MIG claim holds;
- time-sliced claims take one share each, never more than the profile's replicas (1.36: a shared device's counters
  are charged once, however many claims share it);
- untrusted tenants' claims take their device whole: nothing shares a GPU with them, partitions included;
- device taints keep claims off a GPU being reconfigured (taints in the slice 1.36, DeviceTaintRule 1.37);
- the driver's own class maps `nvidia.com/gpu` to a DRA device for pods outside tenant namespaces, and gpushare's
  admission refuses that request in tenant namespaces (1.36);
- what the scheduler does about priority preemption when the device is what a higher-priority pod lacks;
- Kueue's own controller counts these claims against the tenant's ClusterQueue: MIG claims as devices, time-sliced
  claims by the `shares` they consume (its consumable-capacity source).
Timings of a run are printed with `-s`."""

from __future__ import annotations

import itertools
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.paths import package_data_path
from tests.cluster.dra_slices import (
    DRIVER,
    Gpu,
    consumed,
    device_index,
    node_gpus,
    node_slices,
    parse_quantity,
    split_slices,
)
from tests.cluster.environments import Applied, gated, tenant_client, tenant_pod
from tests.cluster.kube import Kube, eventually
from tests.cluster.queues import KUEUE_API, Queues, condition, is_true, job

ENV, CLUSTER = "dra-partitionable", "lab-dra"
RESOURCE = "resource.k8s.io/v1"
OPS = "gpu-ops"  # a namespace no tenant owns: what a cluster's operators run there is not gpushare's to refuse
_names = itertools.count()
_started = time.monotonic()


# ---------------------------------------------------------------- the API server's minor


def server_minor(kube: Kube) -> tuple[int, int]:
    """The running API server's Kubernetes minor, from its /version."""
    answer = kube.request("GET", "/version")
    assert answer.allowed, answer.body
    minor = re.match(r"\d+", str(answer.body["minor"]))
    assert minor, answer.body
    return int(answer.body["major"]), int(minor.group())


def require_minor(kube: Kube, minor: tuple[int, int], why: str) -> None:
    """Skip on an API server older than `minor`, saying why; GPUSHARE_FORCE_MINOR_TESTS=1 runs the test anyway."""
    have = server_minor(kube)
    if have < minor and not os.environ.get("GPUSHARE_FORCE_MINOR_TESTS"):
        pytest.skip(f"needs Kubernetes {minor[0]}.{minor[1]}+ (this API server is {have[0]}.{have[1]}): {why}")


# ---------------------------------------------------------------- the cluster with the driver's slices


@dataclass
class Part:
    """The dra-partitionable cluster with gpushare's objects applied and the driver's slices published."""

    a: Applied
    minor: tuple[int, int]
    shares: int | None
    gpus: dict[str, list[Gpu]]  # node -> its GPUs
    generation: dict[str, int] = field(default_factory=dict)  # node -> pool generation published last
    pods: list[dict[str, Any]] = field(default_factory=list)  # every pod a test made, for release()

    @property
    def kube(self) -> Kube:
        return self.a.kube

    def node(self, name: str) -> dict[str, Any]:
        return next(n for n in self.a.nodes if n["name"] == name)

    def tenant(self, name: str) -> dict[str, Any]:
        return next(t for t in self.a.plan["tenants"] if t["name"] == name)

    def publish(self, node: str, taints: dict[str, list[dict[str, Any]]] | None = None) -> list[dict[str, Any]]:
        """The node's slices as the driver publishes them (a new pool generation each time), as the server stored
        them once every one is there."""
        generation = self.generation.get(node, 0) + 1
        slices = node_slices(node, self.gpus[node], self.shares, split_slices(self.minor), generation, taints)
        for s in slices:
            answer = self.kube.apply(s, manager="gpu-kubelet-plugin")
            assert answer.allowed, f"{s['metadata']['name']}: {answer.message}"
        self.generation[node] = generation
        return [self.kube.get(RESOURCE, "ResourceSlice", s["metadata"]["name"]) or {} for s in slices]

    def stored(self, node: str) -> list[dict[str, Any]]:
        return [s for s in self.kube.list(RESOURCE, "ResourceSlice") if s["spec"].get("nodeName") == node]


def preview_shares(a: Applied) -> int | None:
    """The chart's consumableShares as gpushare's values set it (None: off)."""
    folder = Path(a.kube.kubeconfig).parents[1] / f"preview-{ENV}" / "helm-values" / CLUSTER
    (values,) = folder.glob("*dra*.yaml")
    value = yaml.safe_load(values.read_text()).get("consumableShares")
    return int(value) if value not in (None, "disabled") else None


def strip_extended_resources(kube: Kube, node: str) -> None:
    """A DRA node advertises no nvidia.com/* resources (the device plugin is off): the plan's advertised counts
    describe the device-plugin path, which the kwok node was made with."""
    got = kube.get("v1", "Node", node) or {}
    gone = {k: None for k in got.get("status", {}).get("allocatable", {}) if k.startswith("nvidia.com/")}
    if gone:
        answer = kube.request("PATCH", f"/api/v1/nodes/{node}/status",
                              {"status": {"allocatable": gone, "capacity": gone}},
                              content_type="application/merge-patch+json")
        assert answer.allowed, answer.message
        eventually(lambda: not any(k.startswith("nvidia.com/") for k in (kube.get("v1", "Node", node) or {})
                                   .get("status", {}).get("allocatable", {})), what=f"{node} without nvidia.com/*")


@pytest.fixture(scope="module")
def part(applied: Callable[[str, str], Applied]) -> Iterator[Part]:
    start = time.monotonic()
    a = applied(ENV, CLUSTER)
    p = Part(a, server_minor(a.kube), preview_shares(a),
             {n["name"]: node_gpus(n["name"], n["gpu_model"], n["gpus_per_node"]) for n in a.nodes})
    for node in p.gpus:
        strip_extended_resources(p.kube, node)
        p.publish(node)
    print(f"\n[dra-partitionable] cluster up, objects applied, slices published: {time.monotonic() - start:.1f} s "
          f"(Kubernetes {p.minor[0]}.{p.minor[1]})")
    yield p
    print(f"[dra-partitionable] module: {time.monotonic() - _started:.1f} s")


@pytest.fixture
def fresh(part: Part) -> Iterator[Part]:
    """The cluster, with every pod a test made removed again (and their claims deallocated) afterwards."""
    start = time.monotonic()
    try:
        yield part
    finally:
        release(part, part.pods)
        print(f"  {time.monotonic() - start:.1f} s")


# ---------------------------------------------------------------- pods, claims and allocations


def flavor_for_node(p: Part, node: str) -> dict[str, Any]:
    """What Kueue would add to a pod admitted onto the node's pool, narrowed to that one node (the tests place
    claims on a chosen GPU; a pod that reaches the scheduler outside Kueue could choose a node too)."""
    pool = p.node(node)["pool"]
    (flavor,) = [o["spec"] for o in p.a.objects if o["kind"] == "ResourceFlavor"
                 and o["spec"].get("nodeLabels", {}).get("gpushare.io/pool") == pool]
    return {"nodeLabels": {"kubernetes.io/hostname": node}, "tolerations": flavor.get("tolerations", [])}


def template_pod(namespace: str, priority: str, template: str) -> dict[str, Any]:
    pod = tenant_pod(namespace, priority, {}, name=f"part-{next(_names)}")
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    return gated(pod)


def place(p: Part, tenant: str, template: str, node: str) -> dict[str, Any]:
    """A pod of the tenant claiming through gpushare's template, created by the tenant's ServiceAccount and admitted
    (as Kueue would) onto `node`."""
    t = p.tenant(tenant)
    pod = template_pod(t["namespace"], t["priority"], template)
    made = tenant_client(p.kube, t["namespace"]).create(pod, dry_run=False)
    assert made.allowed, (tenant, template, made.message)
    p.pods.append(pod)
    p.a.kueue.admit(pod, flavor_for_node(p, node))
    return pod


def pod_claims(kube: Kube, pod: dict[str, Any]) -> list[dict[str, Any]]:
    meta = pod["metadata"]
    got = kube.get("v1", "Pod", meta["name"], meta["namespace"]) or {}
    uid = got.get("metadata", {}).get("uid")
    return [c for c in kube.list(RESOURCE, "ResourceClaim", meta["namespace"])
            if any(r.get("uid") == uid for r in c["metadata"].get("ownerReferences", []))]


def scheduled_message(kube: Kube, pod: dict[str, Any]) -> str:
    meta = pod["metadata"]
    got = kube.get("v1", "Pod", meta["name"], meta["namespace"]) or {}
    return " ".join(f"{c.get('reason', '')}: {c.get('message', '')}" for c in got.get("status", {})
                    .get("conditions", []) if c["type"] == "PodScheduled")


def allocated(p: Part, pod: dict[str, Any], timeout: float = 30) -> list[dict[str, Any]]:
    """The device results of the pod's claim once the scheduler has placed the pod."""
    meta = pod["metadata"]

    def done() -> list[dict[str, Any]] | None:
        got = p.kube.get("v1", "Pod", meta["name"], meta["namespace"]) or {}
        claims = pod_claims(p.kube, pod)
        if not got.get("spec", {}).get("nodeName") or not claims:
            return None
        results = [r for c in claims for r in (c.get("status", {}).get("allocation") or {})
                   .get("devices", {}).get("results", [])]
        return results or None

    try:
        found: list[dict[str, Any]] = eventually(done, timeout=timeout, every=0.2,
                                                 what=f"the claim of {meta['name']} allocated")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {scheduled_message(p.kube, pod)}") from None
    return found


def stays_pending(p: Part, pod: dict[str, Any], seconds: float = 6) -> str:
    """The scheduler found no device for the pod's claim and, for `seconds` more, still does not place it: the
    PodScheduled message."""
    meta = pod["metadata"]
    message = eventually(lambda: (lambda m: m if "Unschedulable" in m else None)(scheduled_message(p.kube, pod)),
                         timeout=30, every=0.2, what=f"{meta['name']} found unschedulable")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = p.kube.get("v1", "Pod", meta["name"], meta["namespace"]) or {}
        assert not got.get("spec", {}).get("nodeName"), (meta["name"], "was placed on", got["spec"]["nodeName"])
        time.sleep(0.5)
    return str(message)


def release(p: Part, pods: list[dict[str, Any]]) -> None:
    """The pods deleted and their claims gone: those of their templates deleted by the claim controller, a claim
    of the pod's own name (ops_claim_pod) by us."""
    for pod in list(pods):
        p.kube.delete(pod)
        p.kube.delete({"apiVersion": RESOURCE, "kind": "ResourceClaim", "metadata": pod["metadata"]})
    def gone(namespace: str, name: str) -> bool:
        return p.kube.get("v1", "Pod", name, namespace) is None and not [
            c for c in p.kube.list(RESOURCE, "ResourceClaim", namespace)
            if c["metadata"]["name"] == name or c["metadata"]["name"].startswith(f"{name}-")]

    for pod in list(pods):
        meta = pod["metadata"]
        eventually(lambda meta=meta: gone(meta["namespace"], meta["name"]), timeout=60,
                   what=f"pod {meta['name']} and its claims gone")
        if pod in p.pods:
            p.pods.remove(pod)


def devices_of(p: Part, node: str) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, int]]]:
    return device_index(p.stored(node))


def attribute(device: dict[str, Any], name: str) -> Any:
    return next(iter(device["attributes"][name].values()))


def assert_within_counters(p: Part, node: str, results: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """What the allocated devices take of the node's counter sets (a device shared by several claims once), checked
    against what each set holds; memory slices never taken twice. Returns the use per (set, counter)."""
    devices, sets = devices_of(p, node)
    used: Counter[tuple[str, str]] = Counter()
    for name in sorted({r["device"] for r in results if r["pool"] == node}):
        for key, value in consumed(devices[name]).items():
            used[key] += value
    for (counter_set, counter), value in used.items():
        assert value <= sets[counter_set][counter], (node, counter_set, counter, value, sets[counter_set][counter])
    return dict(used)


def template_class(p: Part, namespace: str, template: str) -> str:
    (t,) = [o for o in p.a.objects if o["kind"] == "ResourceClaimTemplate"
            and o["metadata"]["namespace"] == namespace and o["metadata"]["name"] == template]
    return str(t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"])


# ---------------------------------------------------------------- 1. the driver's slices, as the server keeps them


def _normalised(spec: dict[str, Any]) -> dict[str, Any]:
    """A slice spec with every quantity as an integer, so that the server's canonical form compares equal."""
    def fix(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: fix(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [fix(v) for v in value]
        if isinstance(value, str) and key in ("value", "default", "min", "max", "step"):
            return parse_quantity(value)
        return value
    return dict(fix({k: v for k, v in spec.items()}))


def test_the_api_server_keeps_the_drivers_partitionable_slices_whole(part: Part) -> None:
    """Every slice the driver publishes (resource.k8s.io/v1, split from 1.35, combined before) is accepted and read
    back unchanged: shared counter sets, each device's consumesCounters, capacities with request policies and
    allowMultipleAllocations. Without the partitionable-devices and consumable-capacity features the server drops
    those fields and every claim would take a whole device."""
    p = part
    checked = 0
    for node, gpus in p.gpus.items():
        sent = node_slices(node, gpus, p.shares, split_slices(p.minor), p.generation[node])
        stored = {s["metadata"]["name"]: s for s in p.stored(node)}
        assert sorted(stored) == sorted(s["metadata"]["name"] for s in sent), node
        for s in sent:
            assert _normalised(stored[s["metadata"]["name"]]["spec"]) == _normalised(s["spec"]), s["metadata"]["name"]
            checked += 1
        devices, sets = device_index(list(stored.values()))
        partitionable = [g for g in gpus if g.dynamic_mig]
        # an H200: itself and 25 MIG devices (7 profiles at their placements); an L40S: itself
        assert len(sets) == len(partitionable) and len(devices) == 25 * len(partitionable) + len(gpus), node
        for name, counters in sets.items():
            assert counters["multiprocessors"] == 132 and counters["memory"] == 140 * 1024**3, name
            assert [c for c in counters if c.startswith("memory-slice-")] == [f"memory-slice-{i}" for i in range(8)]
    assert checked == sum(len(g) + (1 if split_slices(p.minor) and any(x.dynamic_mig for x in g) else 0)
                          for g in p.gpus.values())


# ---------------------------------------------------------------- 2. dynamic MIG: counters are never overcommitted

COUNTED_FROM_1_36 = ("before 1.36 kube-scheduler subtracts no counters for a device allocated with consumable "
                     "capacity (here every device: the cluster's time-slicing turns the driver's consumable shares "
                     "on), so it hands out one GPU's memory slices again and again (seen on 1.34.4 and 1.35.8); "
                     "gpushare refuses dynamic MIG beside time-slicing there")


def test_dynamic_mig_claims_never_overcommit_a_gpus_counters(fresh: Part) -> None:
    """On dyn-h200-01 (one H200) the search tenant's MIG claims fill the GPU: 2g.35gb, 3g.71gb and two 1g.18gb take
    all eight memory slices, and the next 1g.18gb stays unschedulable although 3 compute slices' worth of SMs are
    free. What was allocated never takes more of a counter than the GPU's set holds, nor a memory slice twice."""
    require_minor(fresh.kube, (1, 36), COUNTED_FROM_1_36)
    p, node = fresh, "dyn-h200-01"
    results = []
    for template in ("gpushare-mig-balanced-2g.35gb", "gpushare-mig-balanced-3g.71gb",
                     "gpushare-mig-balanced-1g.18gb", "gpushare-mig-balanced-1g.18gb"):
        (result,) = allocated(p, place(p, "search", template, node))
        devices, _ = devices_of(p, node)
        device = devices[result["device"]]
        assert attribute(device, "type") == "mig" and result["pool"] == node, result
        assert template.endswith(attribute(device, "profile")), (template, result["device"])
        results.append(result)
    used = assert_within_counters(p, node, results)
    assert used[("gpu-0-counter-set", "multiprocessors")] == 32 + 60 + 16 + 16
    assert all(used[("gpu-0-counter-set", f"memory-slice-{i}")] == 1 for i in range(8))
    message = stays_pending(p, place(p, "search", "gpushare-mig-balanced-1g.18gb", node))
    assert "cannot allocate all claims" in message, message


def test_a_full_gpu_claim_does_not_join_a_gpu_a_mig_claim_holds(fresh: Part) -> None:
    """One 1g.18gb claim on dyn-h200-01's only GPU: an exclusive (full-GPU) claim placed on that node stays
    unschedulable, because the full device consumes every counter of the set; once the MIG claim is released the
    same pending pod gets the full GPU."""
    require_minor(fresh.kube, (1, 36), COUNTED_FROM_1_36)
    p, node = fresh, "dyn-h200-01"
    mig = place(p, "search", "gpushare-mig-balanced-1g.18gb", node)
    (first,) = allocated(p, mig)
    whole = place(p, "search", "gpushare-exclusive", node)
    assert "cannot allocate all claims" in stays_pending(p, whole)
    release(p, [mig])
    (result,) = allocated(p, whole)
    assert result["device"] == "gpu-0" and first["device"].startswith("gpu-0-mig-"), (first, result)
    used = assert_within_counters(p, node, [result])
    _, sets = devices_of(p, node)
    assert used == {("gpu-0-counter-set", k): v for k, v in sets["gpu-0-counter-set"].items()}  # all of it


# ---------------------------------------------------------------- 3. time-sliced shares


def test_time_sliced_claims_never_exceed_the_profiles_shares(fresh: Part) -> None:
    """notebooks-ts4 on nb-l40s-01 (one L40S): four claims share its device, one share each (the claim template asks
    for none, the driver's request policy gives 1), and the fifth stays unschedulable."""
    p, node = fresh, "nb-l40s-01"
    assert p.shares == 4
    results = []
    for _ in range(p.shares):
        (result,) = allocated(p, place(p, "notebooks", "gpushare-notebooks-ts4", node))
        assert result["device"] == "gpu-0" and result["consumedCapacity"] == {"memory": "0", "shares": "1"}, result
        results.append(result)
    assert len({r["shareID"] for r in results}) == p.shares  # four allocations of the one device
    message = stays_pending(p, place(p, "notebooks", "gpushare-notebooks-ts4", node))
    assert "cannot allocate all claims" in message, message


@pytest.fixture(scope="module")
def driver_class(part: Part) -> Iterator[dict[str, Any]]:
    """The driver's own gpu.nvidia.com class on the cluster (its chart installs it beside gpushare's), and the
    namespace no tenant owns where the cluster's operators could use it."""
    cls = driver_gpu_class()
    made = part.kube.apply(cls)
    assert made.allowed, made.message
    part.kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPS}}, dry_run=False)
    yield cls
    part.kube.delete(cls)


def ops_claim_pod(p: Part, node: str, device_class: str = "gpu.nvidia.com") -> dict[str, Any]:
    """A pod outside tenant namespaces with a ResourceClaim of its own on the class (no capacity asked for)."""
    name = f"ops-{next(_names)}"
    claim = {"apiVersion": RESOURCE, "kind": "ResourceClaim", "metadata": {"name": name, "namespace": OPS},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}}}
    assert p.kube.create(claim, dry_run=False).allowed
    pod = ops_pod(name, node, {})
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    assert p.kube.create(pod, dry_run=False).allowed
    p.pods.append(pod)
    return pod


def ops_allocation(p: Part, pod: dict[str, Any], timeout: float = 30) -> list[dict[str, Any]]:
    name = pod["metadata"]["name"]
    try:
        claim = eventually(lambda: (lambda c: c if c and c.get("status", {}).get("allocation") and (
            p.kube.get("v1", "Pod", name, OPS) or {}).get("spec", {}).get("nodeName") else None)(
            p.kube.get(RESOURCE, "ResourceClaim", name, OPS)), timeout=timeout, every=0.2,
            what=f"the claim of {name} allocated")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {scheduled_message(p.kube, pod)}") from None
    return list(claim["status"]["allocation"]["devices"]["results"])


def test_a_shared_claim_takes_a_partitionable_gpu_whole(fresh: Part, driver_class: dict[str, Any]) -> None:
    """Why gpushare refuses time-slicing on GPUs the driver publishes partitionable: a claim through the driver's
    own class on train-h200-02's H200 takes one of its 4 shares and every one of its SMs, engines and (the request
    policy's default) no memory; the SM and engine capacities carry no request policy, so the scheduler consumes them
    whole and a second claim stays unschedulable with 3 shares free. `gpushare validate` refuses a time-sliced pool
    of H200s on this cluster for that reason."""
    from gpushare.core.errors import GpushareError
    from gpushare.core.resolve import resolve
    from tests.cluster.bins import ROOT

    p, node = fresh, "train-h200-02"
    (first,) = ops_allocation(p, ops_claim_pod(p, node))
    assert first["device"] == "gpu-0", first
    assert first["consumedCapacity"] == {"shares": "1", "memory": "0", "multiprocessors": "132", "copyEngines": "8",
                                         "decoders": "7", "encoders": "0", "jpegEngines": "7", "ofaEngines": "1"}
    second = ops_claim_pod(p, node)
    assert "cannot allocate all claims" in stays_pending(p, second)

    env = yaml.safe_load((ROOT / "tests" / "cluster" / "dra-partitionable.yaml").read_text())
    notebooks = next(pool for pool in env["pools"] if pool["name"] == "notebooks")
    notebooks["gpu_model"] = "NVIDIA H200"
    path = Path(p.a.kube.kubeconfig).parent / "h200-time-sliced" / "dra-partitionable.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(env))
    with pytest.raises(GpushareError) as refused:
        resolve(path, ROOT / "profiles")
    assert any("partitionable" in problem.message and "notebooks" in problem.message
               for problem in refused.value.problems), [str(x) for x in refused.value.problems]


# ---------------------------------------------------------------- 4. untrusted tenants: hardware isolation


def test_untrusted_claims_take_their_device_whole_in_the_partitionable_shape(fresh: Part,
                                                                            driver_class: dict[str, Any]) -> None:
    """partner-eval (untrusted) has claim templates only for MIG and exclusive classes, and each takes every share
    of its device. In the partitionable shape nothing else joins a GPU an untrusted claim holds: another tenant's
    MIG claim gets a partition whose memory slices are disjoint from it, and a claim on the whole GPU (through the
    driver's own class, as a pod outside tenant namespaces could) stays unschedulable while the untrusted MIG claim
    is there, as it does on the GPU of an untrusted exclusive claim."""
    require_minor(fresh.kube, (1, 36), COUNTED_FROM_1_36)
    p = fresh
    ns = p.tenant("partner-eval")["namespace"]
    templates = {o["metadata"]["name"] for o in p.a.objects if o["kind"] == "ResourceClaimTemplate"
                 and o["metadata"]["namespace"] == ns}
    assert "gpushare-notebooks-ts4" not in templates and "gpushare-exclusive" in templates
    isolated = [o["metadata"]["name"] for o in p.a.objects if o["kind"] == "DeviceClass"
                and "sharing" not in o["spec"]["config"][0]["opaque"]["parameters"]]
    assert {template_class(p, ns, t) for t in templates} <= set(isolated)

    node = "dyn-h200-01"
    mig = place(p, "partner-eval", "gpushare-mig-balanced-1g.18gb", node)
    (untrusted,) = allocated(p, mig)
    assert untrusted["device"].startswith("gpu-0-mig-1g18gb-19-") and untrusted["consumedCapacity"]["shares"] == "4"
    other = place(p, "search", "gpushare-mig-balanced-1g.18gb", node)
    (neighbour,) = allocated(p, other)
    devices, _ = devices_of(p, node)
    slices = {r["device"]: {k for (_, k) in consumed(devices[r["device"]]) if k.startswith("memory-slice-")}
              for r in (untrusted, neighbour)}
    assert neighbour["device"] != untrusted["device"] and not set.intersection(*slices.values()), slices
    whole = ops_claim_pod(p, node)
    assert "cannot allocate all claims" in stays_pending(p, whole)
    release(p, [mig, other])
    (got,) = ops_allocation(p, whole)  # the same pending claim, once the partitions are released
    assert got["device"] == "gpu-0", got

    (held,) = allocated(p, place(p, "partner-eval", "gpushare-exclusive", "train-h200-03"))
    assert held["device"] == "gpu-0" and held["consumedCapacity"]["shares"] == "4", held
    assert "cannot allocate all claims" in stays_pending(p, ops_claim_pod(p, "train-h200-03"), seconds=3)


# ---------------------------------------------------------------- 5. device taints


TAINT = {"key": "gpushare.io/reconfiguring", "value": "mig", "effect": "NoSchedule"}


def test_a_device_taint_keeps_claims_off_a_gpu_being_reconfigured(fresh: Part) -> None:
    """The driver republishes dyn-h200-02's slices with a NoSchedule taint on every device of its GPU 0 (the full
    device and all its partitions): gpushare's templates carry no tolerations, so two 3g.71gb claims go to GPU 1 and
    a third stays unschedulable although GPU 0 is empty; without the taint the pending claim gets GPU 0."""
    p, node = fresh, "dyn-h200-02"
    require_minor(p.kube, (1, 36), "device taints in ResourceSlices (DRADeviceTaints) are beta and on by default "
                  "from 1.36, GA in 1.37; before, the API server drops the field and the scheduler ignores it")
    claim_templates = [o for o in p.a.objects if o["kind"] == "ResourceClaimTemplate"]
    assert claim_templates and not any("tolerations" in r.get("exactly", {}) for t in claim_templates
                                       for r in t["spec"]["spec"]["devices"]["requests"])
    gpu0 = [d["name"] for d in p.gpus[node][0].devices(p.shares)]
    try:
        stored = p.publish(node, taints={name: [TAINT] for name in gpu0})
        devices, _ = device_index(stored)
        assert all(devices[name].get("taints", [{}])[0].get("key") == TAINT["key"] for name in gpu0), \
            "the API server dropped the devices' taints"
        first = [allocated(p, place(p, t, "gpushare-mig-balanced-3g.71gb", node))[0]
                 for t in ("search", "search")]
        assert sorted(r["device"] for r in first) == ["gpu-1-mig-3g71gb-9-0", "gpu-1-mig-3g71gb-9-4"], first
        third = place(p, "research", "gpushare-mig-balanced-3g.71gb", node)
        assert "cannot allocate all claims" in stays_pending(p, third)
        p.publish(node)
        (result,) = allocated(p, third)
        assert result["device"].startswith("gpu-0-mig-3g71gb-9-"), result
    finally:
        if any(d.get("taints") for s in p.stored(node) for d in s["spec"].get("devices") or []):
            p.publish(node)


def test_a_device_taint_rule_keeps_claims_off_the_devices_it_names(fresh: Part) -> None:
    """A DeviceTaintRule (resource.k8s.io/v1, GA in 1.37) naming train-h200-01's full GPU keeps the research
    tenant's exclusive claim pending; deleted, the claim is allocated. A rule selects by driver, pool and one device
    name (its CEL selectors are tombstoned since 1.35): the GPU's MIG devices, not named, stay allocatable, so taking
    a whole GPU out by rules takes one rule per device."""
    p, node = fresh, "train-h200-01"
    require_minor(p.kube, (1, 37), "DeviceTaintRule is served as resource.k8s.io/v1 from 1.37 (DRADeviceTaintRules "
                  "GA); 1.36 serves it only as v1beta2 with that gate off by default")
    rule = {"apiVersion": RESOURCE, "kind": "DeviceTaintRule", "metadata": {"name": "reconfigure-train-h200-01-gpu-0"},
            "spec": {"deviceSelector": {"driver": DRIVER, "pool": node, "device": "gpu-0"}, "taint": TAINT}}
    made = p.kube.create(rule, dry_run=False)
    assert made.allowed, made.message
    try:
        whole = place(p, "research", "gpushare-exclusive", node)
        assert "cannot allocate all claims" in stays_pending(p, whole)
        mig = place(p, "research", "gpushare-mig-balanced-3g.71gb", node)
        (partition,) = allocated(p, mig)
        assert partition["device"].startswith("gpu-0-mig-3g71gb-9-"), partition
        release(p, [mig])
    finally:
        p.kube.delete(rule)
    (result,) = allocated(p, whole)
    assert result["device"] == "gpu-0", result


# ---------------------------------------------------------------- 6. nvidia.com/gpu through the driver's class


def driver_gpu_class() -> dict[str, Any]:
    """The driver's own DeviceClass gpu.nvidia.com as its chart renders it on resource.k8s.io/v1
    (templates/deviceclass-gpu.yaml: the selector and extendedResourceName nvidia.com/gpu, copied into
    gpushare/data/dra-driver-nvidia-gpu.yaml)."""
    facts = yaml.safe_load((package_data_path() / "dra-driver-nvidia-gpu.yaml").read_text())
    return {"apiVersion": RESOURCE, "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression": facts["driver_device_classes"]["gpu.nvidia.com"]}}],
                     "extendedResourceName": facts["extended_resource_name"]}}


def ops_pod(name: str, node: str, resources: dict[str, str], priority: str | None = None) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": OPS},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "restartPolicy": "Never",
                 "tolerations": [{"operator": "Exists"}],
                 "containers": [{"name": "c", "image": "nvcr.io/nvidia/cuda:12.8.1-base-ubuntu24.04",
                                 "resources": {"limits": resources}}]}}
    if priority:
        pod["spec"]["priorityClassName"] = priority
    return pod


def test_the_driver_class_maps_nvidia_gpu_to_a_dra_device_outside_tenant_namespaces(
        fresh: Part, driver_class: dict[str, Any]) -> None:
    """With the driver's gpu.nvidia.com class (extendedResourceName nvidia.com/gpu), a pod in a namespace no tenant
    owns asking for `nvidia.com/gpu: 1` on train-h200-02, whose node advertises no such resource, is placed: the
    scheduler makes a claim for it and allocates a GPU device. In a tenant namespace gpushare's admission refuses the
    same request, and the implicit deviceclass.resource.kubernetes.io/<class> form."""
    p, node = fresh, "train-h200-02"
    require_minor(p.kube, (1, 36), "DRAExtendedResource is beta and on by default from 1.36 (GA, locked on, in "
                  "1.37); before, the scheduler counts nvidia.com/gpu only against the node's allocatable")
    pod = ops_pod(f"ext-{next(_names)}", node, {"nvidia.com/gpu": "1"})
    try:
        assert p.kube.create(pod, dry_run=False).allowed
        p.pods.append(pod)
        (result,) = allocated(p, pod)
        devices, _ = devices_of(p, node)
        assert result["pool"] == node and attribute(devices[result["device"]], "type") == "gpu", result
        got = p.kube.get("v1", "Pod", pod["metadata"]["name"], OPS) or {}
        status = got["status"].get("extendedResourceClaimStatus") or {}
        assert status.get("requestMappings", [{}])[0].get("resourceName") == "nvidia.com/gpu", got["status"]
        assert status.get("resourceClaimName") in {c["metadata"]["name"] for c in pod_claims(p.kube, pod)}

        research = p.tenant("research")
        client = tenant_client(p.kube, research["namespace"])
        for resource in ("nvidia.com/gpu", "deviceclass.resource.kubernetes.io/gpushare-exclusive"):
            asking = gated(tenant_pod(research["namespace"], research["priority"], {resource: 1},
                                      name=f"ext-{next(_names)}"))
            answer = client.create(asking, dry_run=False)
            assert not answer.allowed and "gpushare-dra-no-extended-gpu" in answer.message, (resource, answer.body)
    finally:
        release(p, [pod])


# ---------------------------------------------------------------- 7. priority preemption


def bound(p: Part, pod: dict[str, Any]) -> str:
    """The node the pod is bound to ('' while it is not)."""
    got = p.kube.get("v1", "Pod", pod["metadata"]["name"], pod["metadata"]["namespace"]) or {}
    return str(got.get("spec", {}).get("nodeName", ""))


def preemption_signs(p: Part, victim: dict[str, Any]) -> dict[str, Any]:
    meta = victim["metadata"]
    got = p.kube.get("v1", "Pod", meta["name"], meta["namespace"])
    if got is None:
        return {"deleted": True, "disruption": []}
    return {"deleted": bool(got["metadata"].get("deletionTimestamp")),
            "disruption": [c for c in got.get("status", {}).get("conditions", []) if c["type"] == "DisruptionTarget"]}


def test_what_the_scheduler_does_about_preemption_for_dra_devices(fresh: Part, driver_class: dict[str, Any]) -> None:
    """gpushare gives online work a priority class that preempts (gpushare-online, PreemptLowerPriority) and batch
    one that yields. On a device-plugin node the scheduler evicts a batch pod holding the node's only nvidia.com/gpu
    for an online pod (the control). With DRA, research's batch pod holding train-h200-01's only GPU through
    gpushare's exclusive template is not evicted for search's online pod asking for the same: the online pod stays
    unschedulable, nominated nowhere, and the batch pod keeps its node and device (kube-scheduler's DynamicResources
    plugin does not free a victim's devices in the preemption simulation: its PreFilterExtensions returns nil)."""
    p = fresh
    control_node = "preempt-control"
    made = p.kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": control_node, "labels": {"kubernetes.io/hostname": control_node, "type": "kwok"},
        "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": {"taints": [{"key": "gpushare.io/test-control", "value": "true", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "pods": "20", "nvidia.com/gpu": "1"},
                   "capacity": {"cpu": "8", "memory": "64Gi", "pods": "20", "nvidia.com/gpu": "1"}}}, dry_run=False)
    assert made.allowed or made.status == 409, made.message
    low = ops_pod(f"batch-{next(_names)}", control_node, {"nvidia.com/gpu": "1"}, "gpushare-batch")
    high = ops_pod(f"online-{next(_names)}", control_node, {"nvidia.com/gpu": "1"}, "gpushare-online")
    p.pods += [low, high]
    assert p.kube.create(low, dry_run=False).allowed
    eventually(lambda: bound(p, low) == control_node, what="the control's batch pod placed")
    assert p.kube.create(high, dry_run=False).allowed
    eventually(lambda: (lambda signs: signs["deleted"] or signs["disruption"])(preemption_signs(p, low)),
               timeout=30, what="the scheduler preempts the control's batch pod")
    eventually(lambda: bound(p, high) == control_node, timeout=60, what="the online pod placed on the control node")

    node = "train-h200-01"
    batch = place(p, "research", "gpushare-exclusive", node)
    (held,) = allocated(p, batch)
    assert held["device"] == "gpu-0"
    online = place(p, "search", "gpushare-exclusive", node)
    message = stays_pending(p, online, seconds=15)
    got = p.kube.get("v1", "Pod", online["metadata"]["name"], online["metadata"]["namespace"]) or {}
    assert got["spec"]["priorityClassName"] == "gpushare-online" and not got["status"].get("nominatedNodeName")
    assert preemption_signs(p, batch) == {"deleted": False, "disruption": []} and bound(p, batch) == node
    assert pod_claims(p.kube, batch)[0]["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    print(f"\n  online pod on DRA: {message}")


# ---------------------------------------------------------------- 8. Kueue's own controller


@pytest.fixture(scope="module")
def kueue_part(queues: Callable[..., Queues]) -> Iterator[Queues]:
    start = time.monotonic()
    q = queues(ENV, CLUSTER)
    print(f"\n[dra-partitionable] Kueue cluster up: {time.monotonic() - start:.1f} s")
    try:
        yield q
    finally:
        q.clean_up()


def claim_job(q: Queues, tenant: str, template: str) -> dict[str, Any]:
    t = next(x for x in q.applied.plan["tenants"] if x["name"] == tenant)
    return job(t["namespace"], t["priority"], claims={"gpu": template})


def publish_all(q: Queues) -> tuple[int, int]:
    minor = server_minor(q.kube)
    shares = preview_shares(q.applied)
    for n in q.applied.nodes:
        strip_extended_resources(q.kube, n["name"])
        for s in node_slices(n["name"], node_gpus(n["name"], n["gpu_model"], n["gpus_per_node"]), shares,
                             split_slices(minor)):
            answer = q.kube.apply(s, manager="gpu-kubelet-plugin")
            assert answer.allowed, answer.message
    return minor


def test_kueue_counts_time_sliced_claims_by_the_shares_they_consume(kueue_part: Queues) -> None:
    """Kueue's configuration maps gpushare-notebooks-ts4 to nvidia.com/gpu.shared with a capacity source: Kueue
    charges each claim the `shares` it consumes on the driver's devices. Before the driver has published any slice
    Kueue cannot know that and keeps the Job's Workload inadmissible; once the slices are there each Job is charged
    one share, and the tenant's 8 are admitted and no ninth."""
    q = kueue_part
    first = claim_job(q, "notebooks", "gpushare-notebooks-ts4")
    assert q.submit(first).allowed
    wl = eventually(lambda: (lambda w: w if w and "capacity" in str(w.get("status", {}).get("conditions")) else None)(
        q.workload(first)), timeout=60, what="Kueue says what the shared claim lacks")
    assert not is_true(wl, "QuotaReserved"), wl
    print(f"\n  before the driver's slices: {[c.get('message') for c in wl['status']['conditions']]}")
    publish_all(q)
    q.wait_admitted(first, timeout=90)
    jobs = [first] + [claim_job(q, "notebooks", "gpushare-notebooks-ts4") for _ in range(7)]
    for j in jobs[1:]:
        assert q.submit(j).allowed
    for j in jobs:
        q.wait_admitted(j)
    q.holds("tenant-notebooks", {("notebooks", "nvidia.com/gpu.shared"): (8, 0)})
    extra = claim_job(q, "notebooks", "gpushare-notebooks-ts4")
    assert q.submit(extra).allowed
    q.stays_pending(extra)
    usage = [ps.get("resourceUsage", {}) for ps in (q.workload(jobs[0]) or {})["status"]["admission"]
             ["podSetAssignments"]]
    assert usage == [{"nvidia.com/gpu.shared": "1"}], usage


def test_kueue_admits_exactly_the_tenants_mig_quota_on_partitionable_devices(kueue_part: Queues) -> None:
    """search's 4 nvidia.com/mig-1g.18gb: four Jobs claiming through gpushare's 1g.18gb template are admitted onto
    dyn-mig and placed by the scheduler on the H200s' partitionable MIG devices; a fifth is not admitted."""
    q = kueue_part
    if not q.kube.list(RESOURCE, "ResourceSlice"):
        publish_all(q)
    jobs = [claim_job(q, "search", "gpushare-mig-balanced-1g.18gb") for _ in range(4)]
    for j in jobs:
        assert q.submit(j).allowed
    for j in jobs:
        assert q.flavors(q.wait_admitted(j)) == {"nvidia.com/mig-1g.18gb": "dyn-mig"}
    q.holds("tenant-search", {("dyn-mig", "nvidia.com/mig-1g.18gb"): (4, 0)})
    for j in jobs:
        (pod,) = q.wait_running(j)
        (claim,) = [c for c in q.kube.list(RESOURCE, "ResourceClaim", pod["metadata"]["namespace"])
                    if c["metadata"]["name"].startswith(pod["metadata"]["name"])]
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert re.fullmatch(r"gpu-\d-mig-1g18gb-19-\d", result["device"]), result
    extra = claim_job(q, "search", "gpushare-mig-balanced-1g.18gb")
    assert q.submit(extra).allowed
    q.stays_pending(extra)


def evicted(q: Queues, namespace: str) -> list[dict[str, Any]]:
    return [w for w in q.kube.list(KUEUE_API, "Workload", namespace) if is_true(w, "Evicted")]


def test_kueue_preempts_borrowed_batch_claims_for_online_claims(kueue_part: Queues) -> None:
    """The preemption that works on DRA is Kueue's, by quota: research (batch) holds its one guaranteed 3g.71gb and
    one borrowed from search's idle guarantee; search's two online Jobs are admitted by reclaiming it, Kueue evicts
    the research Job on borrowed quota (its pod and claim go), and the scheduler gives search's claims partitions."""
    q = kueue_part
    if not q.kube.list(RESOURCE, "ResourceSlice"):
        publish_all(q)
    batch = [claim_job(q, "research", "gpushare-mig-balanced-3g.71gb") for _ in range(2)]
    for j in batch:
        assert q.submit(j).allowed
    for j in batch:
        q.wait_admitted(j)
        q.wait_running(j)
    q.holds("tenant-research", {("dyn-mig", "nvidia.com/mig-3g.71gb"): (2, 1)})
    online = [claim_job(q, "search", "gpushare-mig-balanced-3g.71gb") for _ in range(2)]
    start = time.monotonic()
    for j in online:
        assert q.submit(j).allowed
    for j in online:
        q.wait_admitted(j)
    (gone,) = evicted(q, q.namespace("research"))
    assert (condition(gone, "Preempted") or {}).get("reason") == "InCohortReclamation", gone["status"]["conditions"]
    for j in online:
        (pod,) = q.wait_running(j)
        (claim,) = [c for c in q.kube.list(RESOURCE, "ResourceClaim", pod["metadata"]["namespace"])
                    if c["metadata"]["name"].startswith(pod["metadata"]["name"])]
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert re.fullmatch(r"gpu-\d-mig-3g71gb-9-[04]", result["device"]), result
    print(f"\n  online DRA Jobs admitted and running {time.monotonic() - start:.1f} s after submission, "
          f"research's borrowed Job evicted")
    q.holds("tenant-research", {("dyn-mig", "nvidia.com/mig-3g.71gb"): (1, 0)})
