"""Kueue's own controller on gpushare's queues: quotas and borrowing limits, online work preempting batch, untrusted
tenants kept off shared GPUs, and DRA claims counted against the same quotas as device-plugin requests.

Each cluster runs Kueue 0.19.2's controller manager (tests/cluster/kueue.py) with the Configuration gpushare
renders, under Kueue's own ServiceAccount; kwok nodes come from `gpushare plan --json`; tenants submit batch/v1
Jobs with their ServiceAccounts' tokens to their LocalQueue, through Kueue's webhooks and gpushare's admission
policies. Nothing stands in for Kueue: what is admitted, where, and what is preempted is the controller's decision.
Figures (time to admission under a full cohort) are printed with `-s` and quoted in docs/tenancy.md."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.cluster.kube import eventually
from tests.cluster.queues import KUEUE_API, QUEUE_LABEL, Queues, condition, is_true, job
from tests.cluster.test_dra import consumable_shares, slice_for

PILOT = ("pilot", "pilot-metal")


@pytest.fixture
def pilot(queues: Callable[..., Queues]) -> Iterator[Queues]:
    q = queues(*PILOT)
    try:
        yield q
    finally:
        q.clean_up()


def pool_of(q: Queues, pod: dict[str, Any]) -> str:
    node = q.kube.get("v1", "Node", pod["spec"]["nodeName"]) or {}
    return str(node["metadata"]["labels"].get("gpushare.io/pool", ""))


def submit_all(q: Queues, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for j in jobs:
        answer = q.submit(j)
        assert answer.allowed, (j["metadata"]["name"], answer.message)
    return jobs


# ---------------------------------------------------------------- 1. quotas and borrowing limits


def test_the_rendered_queues_are_active_in_kueue(pilot: Queues) -> None:
    """Kueue's webhooks accepted every rendered Kueue object and its controller finds each ClusterQueue usable
    (flavors exist, quotas valid), LocalQueues included."""
    a = pilot.applied
    kueue_objects = [k for k, answer in a.first.items() if k.split()[0] in
                     ("ResourceFlavor", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass")]
    assert len(kueue_objects) >= 10
    refused = {k: a.first[k].message for k in kueue_objects if not a.first[k].allowed}
    assert not refused
    for obj in a.objects:
        if obj["kind"] in ("ClusterQueue", "LocalQueue"):
            meta = obj["metadata"]
            eventually(lambda meta=meta, kind=obj["kind"]: is_true(
                pilot.kube.get(KUEUE_API, kind, meta["name"], meta.get("namespace")), "Active"),
                what=f"{obj['kind']} {meta['name']} active")


def test_a_tenant_gets_its_nominal_quota_and_borrows_only_up_to_its_limit(pilot: Queues) -> None:
    """search: 8 nvidia.com/mig-3g.40gb guaranteed on a100-inference, borrowing_limit 4. Two 4-instance Jobs fit
    the nominal quota, a third borrows 4, a fourth waits although the cohort still has unused 3g.40gb (the
    unassigned queue's on both pools, assistant's): the limit, not capacity, stops it."""
    q = pilot
    ns = q.namespace("search")
    first = submit_all(q, [job(ns, "online", {"nvidia.com/mig-3g.40gb": 4}) for _ in range(2)])
    for j in first:
        assert q.flavors(q.wait_admitted(j)) == {"nvidia.com/mig-3g.40gb": "a100-inference"}
    q.holds("tenant-search", {("a100-inference", "nvidia.com/mig-3g.40gb"): (8, 0)})
    (third,) = submit_all(q, [job(ns, "online", {"nvidia.com/mig-3g.40gb": 4})])
    q.wait_admitted(third)
    q.holds("tenant-search", {("a100-inference", "nvidia.com/mig-3g.40gb"): (12, 4)})
    for j in [*first, third]:
        assert {pool_of(q, p) for p in q.wait_running(j)} == {"a100-inference"}
    (fourth,) = submit_all(q, [job(ns, "online", {"nvidia.com/mig-3g.40gb": 4})])
    q.stays_pending(fourth)
    # The capacity was there: assistant's guaranteed 3g.40gb on the same pool is admitted at once, preempting nothing.
    (other,) = submit_all(q, [job(q.namespace("assistant"), "online", {"nvidia.com/mig-3g.40gb": 4})])
    q.wait_admitted(other)
    assert all(q.admitted(j) for j in [*first, third])
    assert not q.admitted(fourth)


def never_runs(q: Queues, obj: dict[str, Any], seconds: float = 5.0) -> dict[str, Any] | None:
    """The Job stays suspended without pods and its Workload (if Kueue made one) reserves no quota."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        current = q.get(obj)
        assert current is not None and current["spec"].get("suspend") is True, current
        assert not q.pods(obj), obj["metadata"]["name"]
        assert not is_true(q.workload(obj), "QuotaReserved"), q.workload(obj)
        time.sleep(0.5)
    return q.workload(obj)


def test_work_outside_a_tenants_own_queue_gets_nothing(pilot: Queues) -> None:
    """A namespace that is no tenant's (no LocalQueue), a LocalQueue there pointing at a tenant's ClusterQueue
    (whose namespaceSelector names only the tenant's namespace), or at the lending-only unassigned queue (no
    namespaceSelector: Kueue admits from no namespace): Kueue keeps each Job suspended. A tenant naming any queue but
    its own `gpushare` is refused by gpushare's admission policy before Kueue sees it."""
    q = pilot
    stray = "stray-team"
    assert q.kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": stray}},
                         dry_run=False).status in (201, 409)
    q.tenant(stray)  # a ServiceAccount with `admin` there, as a team's CI would hold
    no_queue = job(stray, "batch", {"nvidia.com/gpu": 1})
    assert q.submit(no_queue).allowed
    wl = never_runs(q, no_queue)
    assert wl is not None, "Kueue made no Workload for a queued Job"
    for queue in ("tenant-search", "gpushare-unassigned"):
        local = {"apiVersion": KUEUE_API, "kind": "LocalQueue",
                 "metadata": {"name": f"to-{queue}", "namespace": stray}, "spec": {"clusterQueue": queue}}
        assert q.kube.apply(local).allowed
        stolen = job(stray, "batch", {"nvidia.com/mig-3g.40gb": 1}, queue=f"to-{queue}")
        assert q.submit(stolen).allowed
        wl = never_runs(q, stolen)
        assert wl is not None
        reserved = condition(wl, "QuotaReserved") or {}
        assert reserved.get("status") != "True", wl
    research = q.namespace("research")
    for queue in ("to-tenant-search", "other", None):
        refused = q.submit(job(research, "batch", {"nvidia.com/gpu": 1}, queue=queue))
        assert refused.status == 403 and "gpushare-gpu-pods-queued" in refused.message, (queue, refused.message)


# ---------------------------------------------------------------- 2. priority and preemption


def evicted(q: Queues, namespace: str) -> list[dict[str, Any]]:
    return [w for w in q.kube.list(KUEUE_API, "Workload", namespace) if condition(w, "Evicted")]


def test_online_work_is_admitted_promptly_by_preempting_borrowed_batch(pilot: Queues,
                                                                      record_property: Any) -> None:
    """The h100-training pool's 16 GPUs: research (batch) holds 12 guaranteed plus 4 borrowed from assistant's
    idle guarantee, with more batch waiting. assistant's online Job for its 4 guaranteed GPUs is admitted by
    reclaiming them (reclaimWithinCohort: Any): Kueue evicts exactly the research Job running on borrowed quota,
    whose pods go; when the online work ends, batch takes the GPUs back."""
    q = pilot
    research, assistant = q.namespace("research"), q.namespace("assistant")
    batch = submit_all(q, [job(research, "batch", {"nvidia.com/gpu": 4}) for _ in range(4)])
    for j in batch:
        q.wait_admitted(j)
    waiting = submit_all(q, [job(research, "batch", {"nvidia.com/gpu": 4})])[0]
    q.stays_pending(waiting, seconds=2)
    q.holds("tenant-research", {("h100-training", "nvidia.com/gpu"): (16, 4)})
    for j in batch:
        q.wait_running(j)

    online = job(assistant, "online", {"nvidia.com/gpu": 4})
    start = time.monotonic()
    assert q.submit(online).allowed
    wl = q.wait_admitted(online)
    admitted_after = time.monotonic() - start
    pods = q.wait_running(online)
    running_after = time.monotonic() - start
    assert {pool_of(q, p) for p in pods} == {"h100-training"}
    assert admitted_after < 30, admitted_after

    gone = evicted(q, research)
    assert len(gone) == 1, [w["metadata"]["name"] for w in gone]
    victim = next(j for j in batch if q.workload(j) and q.workload(j)["metadata"]["uid"] == gone[0]["metadata"]["uid"])
    why = condition(gone[0], "Evicted") or {}
    preempted = condition(gone[0], "Preempted") or {}
    assert why.get("reason") == "Preempted", why
    assert preempted.get("reason") == "InCohortReclamation", preempted
    eventually(lambda: not q.pods(victim) and (q.get(victim) or {})["spec"]["suspend"] is True,
               what="the preempted Job suspended and its pods gone")
    q.holds("tenant-research", {("h100-training", "nvidia.com/gpu"): (12, 0)})
    assert not q.admitted(waiting)
    print(f"\nonline Job admitted {admitted_after:.2f} s after submission under a full cohort (pods Running after "
          f"{running_after:.2f} s); preempted: {victim['metadata']['name']} (research, batch, 4 GPUs borrowed), "
          f"Evicted/{why.get('reason')}, Preempted/{preempted.get('reason')}: {preempted.get('message')}")
    record_property("online_admission_seconds", round(admitted_after, 2))
    assert wl

    start = time.monotonic()
    q.finish(online)
    eventually(lambda: q.reservation("tenant-research") == {("h100-training", "nvidia.com/gpu"): (16, 4)},
               timeout=60, every=0.1, what="batch back on the freed GPUs")
    print(f"batch took the GPUs back {time.monotonic() - start:.2f} s after the online Job completed")
    assert sum(q.admitted(j) for j in [*batch, waiting]) == 4


def test_online_work_preempts_its_own_tenants_batch_not_another_tenants_guarantee(pilot: Queues) -> None:
    """withinClusterQueue: LowerPriority. research fills its 12 guaranteed GPUs, assistant its 4 with batch work:
    assistant's online Job then preempts assistant's own batch Job, and no research Job (within its nominal
    quota, which nobody can reclaim)."""
    q = pilot
    research, assistant = q.namespace("research"), q.namespace("assistant")
    theirs = submit_all(q, [job(research, "batch", {"nvidia.com/gpu": 4}) for _ in range(3)])
    own_batch = submit_all(q, [job(assistant, "batch", {"nvidia.com/gpu": 4})])[0]
    for j in [*theirs, own_batch]:
        q.wait_admitted(j)
    online = submit_all(q, [job(assistant, "online", {"nvidia.com/gpu": 4})])[0]
    q.wait_admitted(online)
    (gone,) = evicted(q, assistant)
    assert (condition(gone, "Preempted") or {}).get("reason") == "InClusterQueue", gone["status"]["conditions"]
    assert not evicted(q, research)
    assert all(q.admitted(j) for j in theirs)


# ---------------------------------------------------------------- 3. isolation


def test_an_untrusted_tenant_is_never_admitted_onto_a_shared_flavor(pilot: Queues) -> None:
    """partner-eval (untrusted) holds 16 nvidia.com/mig-1g.10gb on a100-inference and nothing else. Its Jobs land
    there and only there; it cannot borrow the unassigned 1g.10gb beside them; a Job for time-sliced GPUs is refused
    by admission, and a Workload for them that reached Kueue anyway (written by an admin) is never admitted, although
    the time-sliced l40s-notebooks pool is idle and its owner lends it to the cohort."""
    q = pilot
    ns = q.namespace("partner-eval")
    mine = submit_all(q, [job(ns, "batch", {"nvidia.com/mig-1g.10gb": 4}) for _ in range(4)])
    for j in mine:
        assert set(q.flavors(q.wait_admitted(j)).values()) == {"a100-inference"}
        assert {pool_of(q, p) for p in q.wait_running(j)} == {"a100-inference"}
    q.holds("tenant-partner-eval", {("a100-inference", "nvidia.com/mig-1g.10gb"): (16, 0)})
    (more,) = submit_all(q, [job(ns, "batch", {"nvidia.com/mig-1g.10gb": 1})])
    q.stays_pending(more)

    refused = q.submit(job(ns, "batch", {"nvidia.com/gpu.shared": 1}))
    assert refused.status == 403, refused.message
    template = job(ns, "batch", {"nvidia.com/gpu.shared": 1})["spec"]["template"]
    workload = {"apiVersion": KUEUE_API, "kind": "Workload",
                "metadata": {"name": "shared-by-hand", "namespace": ns, "labels": {QUEUE_LABEL: "gpushare"}},
                "spec": {"queueName": "gpushare", "priorityClassName": "gpushare-batch",
                         "podSets": [{"name": "main", "count": 1, "template": template}]}}
    answer = q.kube.create(workload, dry_run=False)
    assert answer.allowed, answer.message
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            got = q.kube.get(KUEUE_API, "Workload", "shared-by-hand", ns)
            assert not is_true(got, "QuotaReserved"), got
            time.sleep(0.5)
        reason = condition(got, "QuotaReserved") or {}
        print(f"\nKueue on partner-eval's Workload for a time-sliced GPU: {reason.get('reason')}: "
              f"{reason.get('message')}")
        assert "l40s-notebooks" in reason.get("message", "") or reason.get("reason") == "Pending", reason
    finally:
        q.kube.delete(workload)
    # The shared pool was free to lend: the notebooks tenant (trusted) gets it at once.
    (notebook,) = submit_all(q, [job(q.namespace("notebooks"), "batch", {"nvidia.com/gpu.shared": 16})])
    assert q.flavors(q.wait_admitted(notebook)) == {"nvidia.com/gpu.shared": "l40s-notebooks"}


# ---------------------------------------------------------------- 4. DRA claims against the same quotas

DRA_CASES = [  # tenant, device-plugin resource, the claim template of the same profile, per-pod count of Jobs
    ("research", "nvidia.com/gpu", "gpushare-exclusive", [2, 2, 1]),
    ("search", "nvidia.com/mig-3g.40gb", "gpushare-mig-balanced-3g.40gb", [4, 2, 1]),
    ("notebooks", "nvidia.com/gpu.shared", "gpushare-notebooks-ts4", [8, 1]),
]


@pytest.fixture(scope="module")
def labs(queues: Callable[..., Queues]) -> dict[str, Queues]:
    plugin, dra = queues("dra", "lab-plugin"), queues("dra", "lab-dra")
    shares = consumable_shares(dra.applied)
    for node in dra.applied.nodes:  # what NVIDIA's DRA driver publishes for the planned nodes
        answer = dra.kube.apply(slice_for(node, shares))
        assert answer.allowed, answer.message
    return {"lab-plugin": plugin, "lab-dra": dra}


def _dra_job(q: Queues, cluster: str, tenant: str, resource: str, template: str, pods: int) -> dict[str, Any]:
    ns = q.namespace(tenant)
    priority = next(t["priority"] for t in q.applied.plan["tenants"] if t["name"] == tenant)
    if cluster == "lab-dra":
        return job(ns, priority, claims={"gpu": template}, pods=pods)
    return job(ns, priority, {resource: 1}, pods=pods)


@pytest.mark.parametrize(("tenant", "resource", "template", "sizes"), DRA_CASES, ids=[c[0] for c in DRA_CASES])
def test_dra_claims_count_against_the_same_quota_as_device_plugin_requests(
        labs: dict[str, Queues], tenant: str, resource: str, template: str, sizes: list[int]) -> None:
    """The same Jobs, one pod per GPU resource: on lab-plugin each pod asks for the device-plugin resource, on
    lab-dra for one claim from gpushare's template of the same profile (Kueue maps its DeviceClass to that resource
    through deviceClassMappings). Kueue admits the same Jobs on both, reserves the same totals and borrowing,
    and stops at the same one."""
    seen: dict[str, list[tuple[bool, dict[str, tuple[int, int]]]]] = {}
    for cluster, q in labs.items():
        try:
            outcome = []
            for pods in sizes:
                (j,) = submit_all(q, [_dra_job(q, cluster, tenant, resource, template, pods)])
                try:
                    q.wait_admitted(j, timeout=10)
                    admitted = True
                except AssertionError:
                    q.stays_pending(j, seconds=2)
                    admitted = False
                held = {r: n for (_, r), n in q.settled(f"tenant-{tenant}").items()}
                outcome.append((admitted, held))
            seen[cluster] = outcome
        finally:
            q.clean_up()
    assert seen["lab-dra"] == seen["lab-plugin"], seen
    assert [admitted for admitted, _ in seen["lab-dra"]] == [True] * (len(sizes) - 1) + [False]
    assert all(resource in held for _, held in seen["lab-dra"])
