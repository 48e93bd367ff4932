"""GPU work through Kueue's own controller on a test cluster: batch/v1 Jobs submitted by tenants' ServiceAccounts
to their LocalQueues, and what Kueue made of them (Workloads, their admission, flavors and evictions; each
ClusterQueue's reservations). A Job's pods run on kwok nodes until the test ends them (kueue.KWOK_STAGES)."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from tests.cluster.environments import Applied, tenant_client, tenant_pod
from tests.cluster.kube import Answer, Kube, eventually
from tests.cluster.kueue import Kueue

KUEUE_API = "kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"  # on every Job and pod a JobSet's controller makes
_names = itertools.count()


def job(namespace: str, priority: str, resources: dict[str, int] | None = None, claims: dict[str, str] | None = None,
        pods: int = 1, queue: str | None = "gpushare", name: str = "") -> dict[str, Any]:
    """A Job of `pods` pods (all at once), each asking for `resources` (device plugin) or one claim per entry of
    `claims` (claim name -> ResourceClaimTemplate), its pod template the example untrusted pod (Pod Security
    restricted: it passes every tenant's policies)."""
    pod = tenant_pod(namespace, priority, resources or {})
    spec = pod["spec"]
    if claims:
        spec["resourceClaims"] = [{"name": c, "resourceClaimTemplateName": t} for c, t in claims.items()]
        spec["containers"][0]["resources"]["claims"] = [{"name": c} for c in claims]
    labels = {QUEUE_LABEL: queue} if queue else {}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name or f"work-{next(_names)}", "namespace": namespace, "labels": labels},
            "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
                     "template": {"metadata": {}, "spec": {**spec, "restartPolicy": "Never"}}}}


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for c in (obj or {}).get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return dict(c)
    return None


def is_true(obj: dict[str, Any] | None, kind: str) -> bool:
    c = condition(obj, kind)
    return bool(c and c["status"] == "True")


@dataclass
class Queues:
    """One environment's cluster with gpushare's objects applied and Kueue's own controller running."""

    applied: Applied
    kueue: Kueue
    clients: dict[str, Kube] = field(default_factory=dict)
    jobs: list[dict[str, Any]] = field(default_factory=list)  # every Job submitted, for clean_up

    @property
    def kube(self) -> Kube:
        return self.applied.kube

    def tenant(self, namespace: str) -> Kube:
        if namespace not in self.clients:
            self.clients[namespace] = tenant_client(self.kube, namespace)
        return self.clients[namespace]

    def namespace(self, tenant: str) -> str:
        return next(str(t["namespace"]) for t in self.applied.plan["tenants"] if t["name"] == tenant)

    # ---------------------------------------------------------------- submitting and ending work

    def submit(self, obj: dict[str, Any], client: Kube | None = None) -> Answer:
        """Create the Job as the tenant of its namespace (or `client`); kept for clean_up once created."""
        answer = (client or self.tenant(obj["metadata"]["namespace"])).create(obj, dry_run=False)
        if answer.allowed:
            self.jobs.append(answer.body)
        return answer

    def pods(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        """The pods of a Job, or of every Job of a JobSet (which carry the JobSet's name in a label)."""
        meta = obj["metadata"]
        if obj["kind"] == "JobSet":
            return [p for p in self.kube.list("v1", "Pod", meta["namespace"])
                    if p["metadata"].get("labels", {}).get(JOBSET_NAME_LABEL) == meta["name"]]
        return [p for p in self.kube.list("v1", "Pod", meta["namespace"])
                if any(r["kind"] == "Job" and r["name"] == meta["name"]
                       for r in p["metadata"].get("ownerReferences", []))]

    def finish(self, obj: dict[str, Any]) -> None:
        """The Job's work ends: each of its pods succeeds (what the kubelet would report), so the Job completes."""
        for pod in self.pods(obj):
            status = {"phase": "Succeeded", "containerStatuses": [
                {"name": c["name"], "image": c["image"], "ready": False, "restartCount": 0,
                 "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
                for c in pod["spec"]["containers"]]}
            answer = self.kube.request(
                "PATCH", f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}/status",
                {"status": status}, content_type="application/merge-patch+json")
            assert answer.allowed, answer.message
        eventually(lambda: is_true(self.get(obj), "Complete"), what=f"Job {obj['metadata']['name']} complete")

    def delete(self, obj: dict[str, Any]) -> None:
        self.kube.request("DELETE", self.kube.path(obj), {"propagationPolicy": "Background"})

    def clean_up(self) -> None:
        """Every Job (and JobSet) submitted deleted, and their Workloads gone, so the next test finds the queues
        empty."""
        for obj in self.jobs:
            self.delete(obj)
        for obj in self.jobs:
            eventually(lambda obj=obj: self.workload(obj) is None and not self.pods(obj), timeout=90,
                       what=f"Workload and pods of {obj['metadata']['name']} gone")
        self.jobs.clear()

    # ---------------------------------------------------------------- what Kueue made of it

    def get(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        meta = obj["metadata"]
        return self.kube.get(obj["apiVersion"], obj["kind"], meta["name"], meta["namespace"])

    def workload(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """The Workload Kueue's job controller made for the Job (owned by it)."""
        meta = obj["metadata"]
        for wl in self.kube.list(KUEUE_API, "Workload", meta["namespace"]):
            if any(r["kind"] == obj["kind"] and r["name"] == meta["name"]
                   for r in wl["metadata"].get("ownerReferences", [])):
                return wl
        return None

    def admitted(self, obj: dict[str, Any]) -> bool:
        return is_true(self.workload(obj), "Admitted")

    def wait_admitted(self, obj: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
        wl: dict[str, Any] = eventually(lambda: (lambda w: w if is_true(w, "Admitted") else None)(self.workload(obj)),
                                        timeout=timeout, every=0.1, what=f"{obj['metadata']['name']} admitted")
        return wl

    def wait_running(self, obj: dict[str, Any], timeout: float = 60) -> list[dict[str, Any]]:
        """The Job (or JobSet) resumed by Kueue and every pod of it Running on a node."""
        want = (sum(r.get("replicas", 1) * r["template"]["spec"].get("parallelism", 1)
                    for r in obj["spec"]["replicatedJobs"]) if obj["kind"] == "JobSet" else obj["spec"]["parallelism"])

        def running() -> list[dict[str, Any]] | None:
            pods = [p for p in self.pods(obj) if p.get("status", {}).get("phase") == "Running"
                    and not p["metadata"].get("deletionTimestamp")]
            return pods if len(pods) == want else None
        pods: list[dict[str, Any]] = eventually(running, timeout=timeout, what=f"pods of {obj['metadata']['name']}")
        return pods

    def stays_pending(self, obj: dict[str, Any], seconds: float = 5.0) -> dict[str, Any]:
        """The Workload exists and is not admitted for `seconds` (Kueue's scheduler runs in well under that), its
        Job still suspended and without pods."""
        eventually(lambda: self.workload(obj), what=f"Workload of {obj['metadata']['name']}")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            wl = self.workload(obj)
            assert wl is not None and not is_true(wl, "QuotaReserved"), (obj["metadata"]["name"], wl)
            time.sleep(0.5)
        current = self.get(obj)
        assert current is not None and current["spec"]["suspend"] is True, current
        assert not self.pods(obj)
        return self.workload(obj) or {}

    def flavors(self, wl: dict[str, Any]) -> dict[str, str]:
        """resource -> ResourceFlavor Kueue assigned it (every pod set)."""
        out: dict[str, str] = {}
        for ps in wl.get("status", {}).get("admission", {}).get("podSetAssignments", []):
            out.update(ps.get("flavors", {}))
        return out

    def reservation(self, queue: str) -> dict[tuple[str, str], tuple[int, int]]:
        """(flavor, resource) -> (total, borrowed) a ClusterQueue holds, from its status."""
        cq = self.kube.get(KUEUE_API, "ClusterQueue", queue) or {}
        out: dict[tuple[str, str], tuple[int, int]] = {}
        for f in cq.get("status", {}).get("flavorsReservation", []):
            for r in f.get("resources", []):
                total, borrowed = int(r.get("total", 0)), int(r.get("borrowed", 0))
                if total or borrowed:
                    out[(f["name"], r["name"])] = (total, borrowed)
        return out

    def holds(self, queue: str, expected: dict[tuple[str, str], tuple[int, int]], timeout: float = 30) -> None:
        """The ClusterQueue's status reaches `expected` (Kueue writes it shortly after admitting or releasing)."""
        eventually(lambda: self.reservation(queue) == expected or None, timeout=timeout, every=0.2,
                   what=f"{queue} holds {expected} (has {self.reservation(queue)})")

    def settled(self, queue: str) -> dict[tuple[str, str], tuple[int, int]]:
        """The ClusterQueue's reservation once two reads a second apart agree."""
        last = self.reservation(queue)
        for _ in range(30):
            time.sleep(1)
            now = self.reservation(queue)
            if now == last:
                return now
            last = now
        raise AssertionError(f"{queue}'s reservation kept changing: {last}")

