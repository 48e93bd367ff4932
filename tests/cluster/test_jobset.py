"""JobSets through Kueue's JobSet integration, with the real JobSet controller (tests/cluster/jobset.py) beside
Kueue's own (tests/cluster/kueue.py) and gpushare's admission policies.

A tenant labels its JobSet with its LocalQueue; Kueue's webhook suspends it and Kueue admits it as one Workload
(a pod set per replicated Job); Kueue resumes it; the JobSet controller, under its own ServiceAccount, then creates
the child Jobs, which carry no queue label of their own (Kueue counts them through their JobSet), and the Job
controller their pods. gpushare's queue policy lets exactly that identity create and resume Jobs that a JobSet
controls, and nobody else: a tenant cannot pass its own Jobs off as a JobSet's, resume a queued JobSet, or submit
a GPU JobSet that no queue counts."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpushare.core.tenancy import DEVELOPER_ROLE
from tests.cluster.environments import TENANT_SERVICE_ACCOUNT, tenant_pod
from tests.cluster.jobset import API
from tests.cluster.kube import eventually
from tests.cluster.queues import QUEUE_LABEL, Queues, is_true, job

_names = itertools.count()


@pytest.fixture
def pilot(queues: Callable[..., Queues]) -> Iterator[Queues]:
    q = queues("pilot", "pilot-metal", name="jobset-pilot-pilot-metal", jobset=True)
    for tenant in ("research", "partner-eval"):
        developer(q, q.namespace(tenant))
    try:
        yield q
    finally:
        q.clean_up()


def developer(q: Queues, namespace: str) -> None:
    """The tenant's ServiceAccount also holds gpushare's developer role there: Kubernetes' `admin` role has no
    rights on JobSets (JobSet's editor role aggregates into no built-in one); gpushare's grants them."""
    q.tenant(namespace)
    answer = q.kube.apply({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "tenant-developer", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": DEVELOPER_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": TENANT_SERVICE_ACCOUNT, "namespace": namespace}]})
    assert answer.allowed, answer.message


def jobset(namespace: str, priority: str, resources: dict[str, int], replicas: int, pods: int,
           queue: str | None = "gpushare") -> dict[str, Any]:
    """A JobSet of `replicas` Jobs of `pods` pods each, every pod the example untrusted pod asking `resources`."""
    spec = {**tenant_pod(namespace, priority, resources)["spec"], "restartPolicy": "Never"}
    return {"apiVersion": API, "kind": "JobSet",
            "metadata": {"name": f"set-{next(_names)}", "namespace": namespace,
                         "labels": {QUEUE_LABEL: queue} if queue else {}},
            "spec": {"replicatedJobs": [{"name": "workers", "replicas": replicas, "template": {"spec": {
                "parallelism": pods, "completions": pods, "backoffLimit": 0,
                "template": {"metadata": {}, "spec": spec}}}}]}}


def child_jobs(q: Queues, obj: dict[str, Any]) -> list[dict[str, Any]]:
    meta = obj["metadata"]
    return [j for j in q.kube.list("batch/v1", "Job", meta["namespace"])
            if any(r["kind"] == "JobSet" and r["name"] == meta["name"]
                   for r in j["metadata"].get("ownerReferences", []))]


def test_a_queued_gpu_jobset_runs_once_kueue_admits_it(pilot: Queues) -> None:
    """research: 2 Jobs x 4 pods x 1 GPU. Kueue admits the JobSet as one Workload of 8 GPUs within the tenant's
    quota; the JobSet controller's Jobs are admitted by gpushare's policies and every pod runs on the pool's GPUs."""
    q = pilot
    ns = q.namespace("research")
    work = jobset(ns, "batch", {"nvidia.com/gpu": 1}, replicas=2, pods=4)
    answer = q.submit(work)
    assert answer.allowed, answer.message
    assert answer.body["spec"].get("suspend") is True, "Kueue's webhook suspends a queued JobSet"
    wl = q.wait_admitted(work)
    requested = sum(ps["count"] for ps in wl["spec"]["podSets"])
    assert requested == 8, wl["spec"]["podSets"]
    pods = q.wait_running(work, timeout=120)
    assert len(pods) == 8
    jobs = child_jobs(q, work)
    assert len(jobs) == 2 and all(QUEUE_LABEL not in j["metadata"].get("labels", {}) for j in jobs), jobs
    eventually(lambda: sum(t for (_, r), (t, _) in q.reservation("tenant-research").items()
                           if r == "nvidia.com/gpu") == 8 or None, what="tenant-research holds the JobSet's 8 GPUs")


def test_a_jobset_beyond_the_tenants_quota_waits_without_jobs(pilot: Queues) -> None:
    """research may hold 12 GPUs and borrow 4: a JobSet of 17 stays suspended; the JobSet controller makes its Jobs
    suspended too, and no pod runs."""
    q = pilot
    ns = q.namespace("research")
    big = jobset(ns, "batch", {"nvidia.com/gpu": 1}, replicas=17, pods=1)
    assert q.submit(big).allowed
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        current = q.get(big)
        assert current is not None and current["spec"].get("suspend") is True, current
        assert not is_true(q.workload(big), "QuotaReserved")
        assert not q.pods(big)
        assert all(j["spec"].get("suspend") is True for j in child_jobs(q, big))
        time.sleep(0.5)
    assert q.workload(big) is not None, "Kueue made no Workload for the queued JobSet"


def test_an_untrusted_tenants_jobset_runs_on_its_isolated_mig_quota(pilot: Queues) -> None:
    """partner-eval (untrusted): its JobSet's pods, created by the Job controller from the JobSet controller's Jobs,
    pass every pod policy (the example pod is Pod Security restricted) and run on MIG instances."""
    q = pilot
    ns = q.namespace("partner-eval")
    work = jobset(ns, "batch", {"nvidia.com/mig-1g.10gb": 1}, replicas=2, pods=2)
    answer = q.submit(work)
    assert answer.allowed, answer.message
    q.wait_admitted(work)
    assert len(q.wait_running(work, timeout=120)) == 4


def test_a_gpu_jobset_no_queue_counts_is_refused(pilot: Queues) -> None:
    """Without the tenant's queue label Kueue would not suspend the JobSet and its Jobs would run outside quota."""
    q = pilot
    ns = q.namespace("research")
    for queue in (None, "other"):
        refused = q.submit(jobset(ns, "batch", {"nvidia.com/gpu": 1}, replicas=1, pods=1, queue=queue))
        assert refused.status == 403 and "gpushare-jobsets-queued" in refused.message, (queue, refused.message)


def test_a_tenant_cannot_pass_its_jobs_off_as_a_jobsets_or_resume_a_queued_jobset(pilot: Queues) -> None:
    """The exemption for a JobSet's Jobs holds for the JobSet controller's identity only: a tenant's own unqueued
    GPU Job naming a JobSet as its controller is refused, and so is the tenant resuming a JobSet Kueue has not
    admitted."""
    q = pilot
    ns = q.namespace("research")
    parked = jobset(ns, "batch", {"nvidia.com/gpu": 1}, replicas=17, pods=1)  # beyond quota: stays suspended
    created = q.submit(parked)
    assert created.allowed, created.message
    owner = {"apiVersion": API, "kind": "JobSet", "name": parked["metadata"]["name"],
             "uid": created.body["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    fake = job(ns, "batch", {"nvidia.com/gpu": 1}, queue=None)
    fake["metadata"]["ownerReferences"] = [owner]
    fake["spec"]["suspend"] = False
    refused = q.submit(fake)
    assert refused.status == 403 and "gpushare-gpu-pods-queued" in refused.message, refused.message
    client = q.tenant(ns)
    resumed = client.request("PATCH", q.kube.path(parked), {"spec": {"suspend": False}},
                             content_type="application/merge-patch+json")
    assert resumed.status == 403 and "gpushare-jobsets-queued" in resumed.message, resumed.message
    current = q.get(parked)
    assert current is not None and current["spec"]["suspend"] is True
    assert all(j["spec"].get("suspend") is True for j in child_jobs(q, parked)) and not q.pods(parked)
    # Nor may the tenant resume one of those suspended Jobs itself (the JobSet controller's identity only).
    jobs = eventually(lambda: child_jobs(q, parked), what="the parked JobSet's (suspended) Jobs")
    resumed = client.request("PATCH", q.kube.path({"apiVersion": "batch/v1", "kind": "Job", **jobs[0]}),
                             {"spec": {"suspend": False}},
                             content_type="application/merge-patch+json")
    assert resumed.status == 403 and "gpushare-gpu-pods-queued" in resumed.message, resumed.message
