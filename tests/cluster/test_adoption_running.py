"""Adopting running clusters, for real: three GPU clusters built from NVIDIA's documented setups on Kubernetes' own API
server, scheduler and controllers, with kwok nodes and running workloads (Deployments, Jobs, a CPU-only service, a
pod that asks for 64Gi without a limit), each taken through the whole adoption path:

import --kubeconfig -> drift empty -> check passes -> diff announces -> the first rollout's objects applied
server-side as Pulumi applies them -> ordinary life (`rollout restart` of every Deployment, each Job recreated,
each Deployment scaled up) -> every pod that ran still runs, every new pod is admitted and scheduled, every node's
nvidia.com/device-plugin.config names a key of the ConfigMap the device plugin reads, and drift is empty.

Then the staged enforcement: moving admission to deny is announced by `diff` (the running Deployments are not
queued through Kueue) and `rollout` refuses it without --accept-impact."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.environments import ident, ordered
from tests.cluster.kube import Kube, eventually
from tests.cluster.test_adoption import as_served, populate
from tests.unit.ops.brownfield.helpers import CLUSTERS
from tests.unit.ops.brownfield.test_live import objects_of

ENV = "prod"  # the shipped guardrails' strictest environment, promoted from a pilot the workspace does not have
RESTRICTED = {"runAsNonRoot": True, "runAsUser": 1000, "allowPrivilegeEscalation": False,
              "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def _docs(service_monitor: bool, mid_change: bool) -> dict[str, list[dict[str, Any]]]:
    objects = objects_of(CLUSTERS / "docs-timeslicing")
    if not service_monitor:
        objects["ClusterPolicy"][0]["spec"]["dcgmExporter"].pop("serviceMonitor")
    if service_monitor:  # the stack's own namespace, where gpushare's rules and dashboards join it
        objects["Namespace"].append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitoring"}})
    if mid_change:  # a100-02 part-way through a change to all-1g.10gb: operands paused, old layout still advertised
        node = next(n for n in objects["Node"] if n["metadata"]["name"] == "a100-02")
        node["metadata"]["labels"]["nvidia.com/mig.config.state"] = "pending"
    return objects


# name -> (the cluster's objects, the tenant workloads: namespace -> the GPU resource its pods ask for)
SCENARIOS: dict[str, tuple[Any, dict[str, str]]] = {
    # time-slicing through the operator's device-plugin config (NVIDIA's docs' time-slicing-config-fine), MIG and
    # whole GPUs beside it
    "timeslicing": (lambda: _docs(False, False), {"ml-research": "nvidia.com/gpu", "notebooks": "nvidia.com/gpu",
                                                  "inference": "nvidia.com/mig-1g.10gb"}),
    # MIG mixed through mig-manager, Kueue's queues and namespaces that enforce Pod Security
    "mig-mixed": (lambda: objects_of(CLUSTERS / "quotas-kueue"), {"research": "nvidia.com/gpu",
                                                                  "search": "nvidia.com/mig-1g.10gb"}),
    # a Prometheus stack beside the operator (dcgm-exporter's ServiceMonitor) and a node part-way through a MIG change
    "monitoring-midchange": (lambda: _docs(True, True), {"ml-research": "nvidia.com/gpu",
                                                         "inference": "nvidia.com/mig-1g.10gb"}),
}


def gpushare(workspace: Path, *args: str) -> tuple[int, Any]:
    run = subprocess.run([sys.executable, "-m", "gpushare", *args], cwd=workspace, capture_output=True, text=True,
                         check=False, env={**os.environ, "GPUSHARE_ROOT": str(workspace)})
    try:
        return run.returncode, json.loads(run.stdout)
    except ValueError:
        return run.returncode, run.stdout + run.stderr


def schedulable(objects: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """The dump's nodes with room for pods (a dump of a real node lists `pods`; the fixtures leave it out)."""
    out = copy.deepcopy(objects)
    for node in out.get("Node", []):
        for key in ("capacity", "allocatable"):
            node["status"].setdefault(key, {}).setdefault("pods", "110")
    return out


def _pod(resource: str | None, memory: str = "1Gi") -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "1", "memory": memory}}
    if resource:
        resources["requests"][resource] = "1"
        resources["limits"] = {resource: "1"}
    return {"containers": [{"name": "main", "image": "registry.example/app:1", "resources": resources,
                            "securityContext": dict(RESTRICTED)}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}


def _deployment(ns: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}}


def workloads(tenants: dict[str, str]) -> list[dict[str, Any]]:
    """What teams run: per namespace a GPU Deployment (2 replicas asking 64Gi of memory without a limit), a GPU Job,
    and a CPU-only Deployment; Pod Security restricted-compliant, none queued through Kueue."""
    out: list[dict[str, Any]] = []
    for ns, resource in tenants.items():
        out.append(_deployment(ns, "serve", _pod(resource, "64Gi")))
        out.append(_deployment(ns, "api", _pod(None)))
        out.append({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": ns},
                    "spec": {"backoffLimit": 0, "template": {"spec": {**_pod(resource), "restartPolicy": "Never"}}}})
    return out


def pods(kube: Kube, namespaces: list[str]) -> list[dict[str, Any]]:
    return [p for ns in namespaces for p in kube.list("v1", "Pod", ns)]


def _of_job(pod: dict[str, Any]) -> bool:
    return any(r.get("kind") == "Job" for r in pod["metadata"].get("ownerReferences") or [])


def all_running(kube: Kube, namespaces: list[str], expected: int) -> list[dict[str, Any]] | None:
    """The pods, once there are `expected` and each runs (a Job's pod may have finished: kwok completes them)."""
    found = [p for p in pods(kube, namespaces) if not p["metadata"].get("deletionTimestamp")]
    ok = len(found) == expected and all(p["status"].get("phase") == "Running" or (
        _of_job(p) and p["status"].get("phase") == "Succeeded") for p in found)
    return found if ok else None


def config_keys_exist(kube: Kube) -> list[str]:
    """Nodes whose nvidia.com/device-plugin.config names no key of the ConfigMap the device plugin reads now
    (gpushare's once it is applied, the cluster's own before)."""
    names = [cm for cm in ("gpushare-device-plugin-configs", "time-slicing-config-fine")
             if kube.get("v1", "ConfigMap", cm, "gpu-operator")]
    data = (kube.get("v1", "ConfigMap", names[0], "gpu-operator") or {}).get("data") or {} if names else {}
    return [n["metadata"]["name"] for n in kube.list("v1", "Node")
            if (label := n["metadata"].get("labels", {}).get("nvidia.com/device-plugin.config"))
            and label not in data]


def preview_objects(workspace: Path, out: Path) -> list[dict[str, Any]]:
    code, text = gpushare(workspace, "preview", "--env", ENV, "--out", str(out))
    assert code == 0, text
    docs: list[dict[str, Any]] = []
    for path in sorted((out / "manifests" / ENV).glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


@pytest.fixture(scope="module")
def adopted(clusters, tmp_path_factory):  # type: ignore[no-untyped-def]
    """scenario -> (kube, workspace, the diff's JSON, the running pods' names before the rollout), each cluster
    running its workloads, imported and diffed."""
    done: dict[str, Any] = {}

    def get(name: str) -> Any:
        if name in done:
            return done[name]
        make, tenants = SCENARIOS[name]
        cluster, kube = clusters(f"running-{name}")
        populate(kube, {k: [as_served(o) for o in v] for k, v in schedulable(make()).items()})
        for obj in workloads(tenants):
            made = kube.create(obj, dry_run=False)
            assert made.allowed, f"{ident(obj)}: {made.message}"
        namespaces = sorted(tenants)
        before = eventually(lambda: all_running(kube, namespaces, 5 * len(tenants)), timeout=120,
                            what="the workloads run")
        workspace = tmp_path_factory.mktemp(name) / "ws"
        from gpushare.cli.init import write_workspace

        write_workspace(workspace)
        code, imported = gpushare(workspace, "import", "--kubeconfig", str(cluster.kubeconfig), "--context",
                                  cluster.name, "--env", ENV, "--out", str(workspace), "--json")
        assert code == 0, imported
        code, drift = gpushare(workspace, "drift", "--env", ENV, "--kubeconfig", str(cluster.kubeconfig),
                               "--context", cluster.name, "--json")
        assert code == 0 and drift["drift"] == [], drift
        code, checked = gpushare(workspace, "check", "--env", ENV, "--json")
        assert code == 0, checked
        code, diff = gpushare(workspace, "diff", "--env", ENV, "--kubeconfig", str(cluster.kubeconfig),
                              "--context", cluster.name, "--json")
        assert code == 0, diff
        effects: dict[str, int] = {}
        for i in diff["impact"]:
            effects[i["effect"]] = effects.get(i["effect"], 0) + 1
        print(f"\n{name}: diff announced {len(diff['changes'])} changed fields in "
              f"{len({c['object'] for c in diff['changes']})} objects, impact {effects}: "
              + "; ".join(f"{i['effect']} {i['workload']}" for i in diff["impact"]))
        done[name] = (kube, cluster, workspace, imported, diff,
                      {p["metadata"]["name"] for p in before if not _of_job(p)}, namespaces)
        return done[name]

    yield get
    # Stopped with the module, not the session: each API server holds inotify instances (128 per user by default),
    # which the later tests' programs (the device plugin's file watcher) need too.
    for entry in done.values():
        entry[1].stop()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_first_rollout_keeps_what_runs(adopted, tmp_path: Path, name: str) -> None:  # type: ignore[no-untyped-def]
    kube, cluster, workspace, imported, diff, before, namespaces = adopted(name)
    tenants = SCENARIOS[name][1]
    # The diff announces what the first rollout does, and that it breaks no running workload of a team: what it
    # names are the GPU Operator's operands (restarted, the driver container turned off) and nothing else.
    assert diff["refused"] == [], diff["refused"]
    broken = [i for i in diff["impact"] if i["effect"] in ("denied", "pending", "evicted", "refused")]
    assert all(i["workload"].startswith("DaemonSet gpu-operator/") for i in broken), broken
    assert any(c["object"].startswith("ResourceQuota ") for c in diff["changes"])  # quotas adopted in place
    changed = {c["object"] for c in diff["changes"]}
    assert not any(o.startswith("LimitRange ") for o in changed)  # host defaults staged
    assert not [o for o in changed if o.startswith("ResourceQuota ") and not o.endswith("/gpu-quota")], changed

    assert config_keys_exist(kube) == []
    objects = preview_objects(workspace, tmp_path / "preview")
    for ns in ("kueue-system", "monitoring"):  # what the Helm releases of the rollout create
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, dry_run=False)
    for obj in ordered(objects):
        answer = kube.apply(obj)
        assert answer.allowed, f"{ident(obj)}: {answer.message}"
        assert not [w for w in answer.warnings if "violate" in w], (ident(obj), answer.warnings)
    assert config_keys_exist(kube) == []  # the cluster's own keys are kept beside gpushare's
    # Every pod that ran still runs, and no quota beside the cluster's own was made.
    still = {p["metadata"]["name"] for p in pods(kube, namespaces) if p["status"].get("phase") == "Running"}
    assert before <= still
    for ns in namespaces:
        assert [q["metadata"]["name"] for q in kube.list("v1", "ResourceQuota", ns)] == ["gpu-quota"]
        assert kube.list("v1", "LimitRange", ns) == []

    # Ordinary life: restart and scale every Deployment, recreate every Job.
    for ns in namespaces:
        for d in kube.list("apps/v1", "Deployment", ns):
            d = {**d, "apiVersion": "apps/v1", "kind": "Deployment"}  # a list's items carry neither
            patch = {"spec": {"replicas": 3, "template": {"metadata": {"annotations": {
                "kubectl.kubernetes.io/restartedAt": "2026-12-06T06:00:00Z"}}}}}
            answer = kube.request("PATCH", kube.path(d), patch, content_type="application/merge-patch+json")
            assert answer.allowed, answer.message
        job = kube.get("batch/v1", "Job", "train", ns)
        assert job is not None
        deleted = kube.request("DELETE", kube.path(job), {"propagationPolicy": "Background"})
        assert deleted.allowed, deleted.message
        eventually(lambda ns=ns: kube.get("batch/v1", "Job", "train", ns) is None, what="the Job is gone")
        fresh = next(o for o in workloads({ns: tenants[ns]}) if o["kind"] == "Job")
        made = kube.create(fresh, dry_run=False)
        assert made.allowed, made.message
        assert not [w for w in made.warnings if "violate" in w], made.warnings
    # 3 + 3 Deployment pods and one Job pod per namespace, all admitted and Running on the kwok nodes.
    eventually(lambda: all_running(kube, namespaces, 7 * len(namespaces)), timeout=180,
               what="every restarted, scaled and recreated pod runs")
    events = [e for ns in namespaces for e in kube.list("v1", "Event", ns)
              if e.get("reason") in ("FailedCreate", "FailedScheduling")]
    assert not [e["message"] for e in events if "gpushare" in e["message"] or "quota" in e["message"]], events
    assert config_keys_exist(kube) == []
    code, drift = gpushare(workspace, "drift", "--env", ENV, "--kubeconfig", str(cluster.kubeconfig), "--context",
                           cluster.name, "--json")
    assert code == 0 and drift["drift"] == [], drift


def test_moving_admission_to_deny_is_announced_and_refused_by_the_rollout(adopted) -> None:  # type: ignore[no-untyped-def]
    kube, cluster, workspace, _, _, _, namespaces = adopted("timeslicing")
    if not kube.list("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"):
        pytest.skip("needs the first rollout's objects (test_the_first_rollout_keeps_what_runs[timeslicing])")
    env_file = workspace / "environments" / f"{ENV}.yaml"
    env_file.write_text(env_file.read_text().replace("  admission: warn\n", "  admission: deny\n"))
    code, diff = gpushare(workspace, "diff", "--env", ENV, "--kubeconfig", str(cluster.kubeconfig), "--context",
                          cluster.name, "--json", "--fail-on-impact")
    assert code == 1, diff
    denied: dict[str, set[str]] = {}
    for i in diff["impact"]:
        if i["effect"] == "denied":
            denied.setdefault(i["workload"], set()).add(i["reason"].split("ValidatingAdmissionPolicy '")[1]
                                                        .split("'")[0])
    # Once Deny is on, every workload is refused where it runs today: the GPU ones are not queued through Kueue,
    # and none names the tenant's priority class (the CPU-only one included), each said with the policy's reason.
    for ns in namespaces:
        for workload in (f"Deployment {ns}/serve", f"Job {ns}/train"):
            assert denied[workload] == {"gpushare-gpu-pods-queued", "gpushare-tenant-priority-class"}, denied
        assert denied[f"Deployment {ns}/api"] == {"gpushare-tenant-priority-class"}, denied
    # The same as text at 80 columns: the summary first, every line whole.
    code, text = gpushare(workspace, "diff", "--env", ENV, "--kubeconfig", str(cluster.kubeconfig), "--context",
                          cluster.name, "--fail-on-impact")
    assert code == 1 and isinstance(text, str)
    lines = text.splitlines()
    assert lines[0].startswith(f"gpushare diff: {ENV} (cluster {ENV}):") and "running workload(s) broken" in text
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    assert "gpushare-gpu-pods-queued" in text
    code, out = gpushare(workspace, "rollout", "--env", ENV, "--dry-run", "--kubeconfig", str(cluster.kubeconfig),
                         "--accept-drift", "--json")
    assert code == 1 and "gpushare-gpu-pods-queued" in json.dumps(out), out
    code, out = gpushare(workspace, "rollout", "--env", ENV, "--dry-run", "--kubeconfig", str(cluster.kubeconfig),
                         "--accept-drift", "--accept-impact", "--json")
    assert code == 0, out
