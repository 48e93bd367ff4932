"""Shared pieces of the attack suite: the frozen fixture environment's tenant namespaces and admission objects,
and builders for pods and controllers that start from the example untrusted pod."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from gpushare.core.guardrails import load_guardrails
from gpushare.core.resolve import resolve
from gpushare.core.tenancy import cluster_tenancy
from gpushare.policy.admission import admission_objects
from tests.conftest import PROFILES, ROOT

FIXTURE = Path(__file__).parent / "tenants.yaml"
EXAMPLE_POD = ROOT / "examples" / "tenants" / "untrusted-gpu-pod.yaml"
CLUSTER = "sec-metal"


@cache
def tenancy_objects() -> tuple[dict[str, Any], ...]:
    return tuple(cluster_tenancy(resolve(FIXTURE, PROFILES), CLUSTER, load_guardrails()).objects)


@cache
def policy_objects() -> tuple[dict[str, Any], ...]:
    return tuple(admission_objects())


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


def controller(kind: str, pod: dict[str, Any]) -> dict[str, Any]:
    """A controller of `kind` whose pod template is `pod` (its metadata becomes the template's)."""
    labels = {"app": "eval"}
    template: dict[str, Any] = {"metadata": {**{k: v for k, v in pod["metadata"].items()
                                                if k in ("annotations", "labels")}, "labels": labels},
                                "spec": copy.deepcopy(pod["spec"])}
    meta = {"name": "eval", "namespace": pod["metadata"]["namespace"]}
    if kind == "CronJob":
        template["spec"]["restartPolicy"] = "Never"
        spec: dict[str, Any] = {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": template}}}
    elif kind == "Job":
        template["spec"]["restartPolicy"] = "Never"
        spec = {"template": template}
    else:
        template["spec"]["restartPolicy"] = "Always"
        spec = {"selector": {"matchLabels": labels}, "template": template}
        if kind == "StatefulSet":
            spec["serviceName"] = "eval"
    return {"apiVersion": CONTROLLERS[kind], "kind": kind, "metadata": meta, "spec": spec}
