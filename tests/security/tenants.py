"""Shared pieces of the attack suite: the frozen fixture environment's tenant namespaces and admission objects,
builders for pods and controllers that start from the example untrusted pod, and what Kueue's mutating webhooks
do to them before validating admission runs."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from gpushare.core.guardrails import load_guardrails
from gpushare.core.namespaces import KUEUE_GATE, QUEUE_LABEL, WORKLOAD_PRIORITY_LABEL
from gpushare.core.resolve import resolve
from gpushare.core.tenancy import ClusterTenancy, cluster_tenancy
from gpushare.policy.admission import admission_objects, pool_taints
from tests.conftest import PROFILES, ROOT

FIXTURE = Path(__file__).parent / "tenants.yaml"
EXAMPLE_POD = ROOT / "examples" / "tenants" / "untrusted-gpu-pod.yaml"
CLUSTER = "sec-metal"


@cache
def tenancy() -> ClusterTenancy:
    return cluster_tenancy(resolve(FIXTURE, PROFILES), CLUSTER, load_guardrails())


def tenancy_objects() -> tuple[dict[str, Any], ...]:
    return tuple(tenancy().objects)


@cache
def policy_objects() -> tuple[dict[str, Any], ...]:
    """The fixture cluster's policies as the Pulumi program passes them: with its pools' taints."""
    return tuple(admission_objects(pools=pool_taints(tenancy())))


def tenant_namespace(tenant: str) -> dict[str, Any]:
    """The Namespace object gpushare renders for a tenant of the fixture, found by the tenant label."""
    (ns,) = [o for o in tenancy_objects() if o["kind"] == "Namespace"
             and o["metadata"]["labels"].get("gpushare.io/tenant") == tenant]
    return copy.deepcopy(ns)


def example_pod() -> dict[str, Any]:
    data = yaml.safe_load(EXAMPLE_POD.read_text())
    assert isinstance(data, dict)
    return data


CONTROLLERS = {"Deployment": "apps/v1", "StatefulSet": "apps/v1", "DaemonSet": "apps/v1", "ReplicaSet": "apps/v1",
               "Job": "batch/v1", "CronJob": "batch/v1"}


KUEUE_LABELS = (QUEUE_LABEL, WORKLOAD_PRIORITY_LABEL)


def controller(kind: str, pod: dict[str, Any]) -> dict[str, Any]:
    """A controller of `kind` whose pod template is `pod` (its annotations become the template's). The pod's Kueue
    labels go where a user puts them for Kueue: on a Job, Deployment or StatefulSet itself, on a CronJob's job
    template, on a ReplicaSet's or DaemonSet's pod template (Kueue manages neither; their pods are plain pods)."""
    labels = {"app": "eval"}
    kueue = {k: v for k, v in pod["metadata"].get("labels", {}).items() if k in KUEUE_LABELS}
    template: dict[str, Any] = {"metadata": {**{k: v for k, v in pod["metadata"].items()
                                                if k in ("annotations", "labels")}, "labels": labels},
                                "spec": copy.deepcopy(pod["spec"])}
    meta: dict[str, Any] = {"name": "eval", "namespace": pod["metadata"]["namespace"]}
    if kueue and kind in ("Job", "Deployment", "StatefulSet"):
        meta["labels"] = kueue
    elif kind in ("ReplicaSet", "DaemonSet"):
        template["metadata"]["labels"] = {**labels, **kueue}
    if kind == "CronJob":
        template["spec"]["restartPolicy"] = "Never"
        job_meta = {"metadata": {"labels": kueue}} if kueue else {}
        spec: dict[str, Any] = {"schedule": "0 * * * *",
                                "jobTemplate": {**job_meta, "spec": {"template": template}}}
    elif kind == "Job":
        template["spec"]["restartPolicy"] = "Never"
        spec = {"template": template}
    else:
        template["spec"]["restartPolicy"] = "Always"
        spec = {"selector": {"matchLabels": labels}, "template": template}
        if kind == "StatefulSet":
            spec["serviceName"] = "eval"
    return {"apiVersion": CONTROLLERS[kind], "kind": kind, "metadata": meta, "spec": spec}


def jobset(pod: dict[str, Any], replicas: int = 2) -> dict[str, Any]:
    """A JobSet (jobset.x-k8s.io/v1alpha2) of `replicas` Jobs whose pod template is `pod`; the pod's Kueue labels go
    on the JobSet itself, where Kueue's JobSet integration reads them."""
    job = controller("Job", pod)
    meta = {"name": "eval", "namespace": pod["metadata"]["namespace"], **(
        {"labels": job["metadata"]["labels"]} if "labels" in job["metadata"] else {})}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": meta,
            "spec": {"replicatedJobs": [{"name": "workers", "replicas": replicas,
                                         "template": {"spec": job["spec"]}}]}}


SUSPENDED_BY_PARENT = "kueue.x-k8s.io/pod-suspending-parent"


def kueue_webhook(obj: dict[str, Any]) -> dict[str, Any]:
    """What Kueue 0.19's mutating webhooks do to an object labelled for a queue before validating admission sees it
    (pkg/controller/jobs/{pod,job,deployment,statefulset}): a pod is gated (unless a Job owns it, whose pods Kueue
    leaves to the Job's suspension), a Job suspended, a Deployment's template labelled, a Deployment's or
    StatefulSet's template marked so their pods are gated. Namespace selection and default queues are not modelled:
    gpushare's tenant namespaces are Kueue's by default and have no LocalQueue named `default`."""
    out = copy.deepcopy(obj)
    meta = out["metadata"]
    queued = QUEUE_LABEL in meta.get("labels", {})
    kind = out["kind"]
    if kind == "Pod":
        owned_by_job = any(o.get("controller") and o["kind"] == "Job" for o in meta.get("ownerReferences", []))
        if (queued or SUSPENDED_BY_PARENT in meta.get("annotations", {})) and not owned_by_job:
            gates = out["spec"].setdefault("schedulingGates", [])
            if {"name": KUEUE_GATE} not in gates:
                gates.append({"name": KUEUE_GATE})
            meta.setdefault("finalizers", []).append("kueue.x-k8s.io/managed")
            meta.setdefault("labels", {})["kueue.x-k8s.io/managed"] = "true"
    elif kind in ("Job", "JobSet") and queued:
        out["spec"]["suspend"] = True
    elif kind in ("Deployment", "StatefulSet") and queued:
        template = out["spec"]["template"].setdefault("metadata", {})
        template.setdefault("annotations", {})[SUSPENDED_BY_PARENT] = kind.lower()
        if kind == "Deployment":
            template.setdefault("labels", {}).update({k: v for k, v in meta["labels"].items() if k in KUEUE_LABELS})
    return out
