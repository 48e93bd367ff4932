"""What the Pulumi program's tests share: plans collected under the SDK's mock engine (the frozen stacks' once per
session), the cloud fixtures' stack settings, and lookups in a plan."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

from gpushare.ops.preview import Plan, PlannedResource, collect_plan
from tests.conftest import ROOT, WORKSPACE

FIXTURES = ROOT / "tests" / "data" / "infra"
GKE = {"gpushare:monitoring": {"mode": "install"},
       "gpushare:clusters": {"test-gke": {"kubeconfigContext": "gke-test", "gke": {
           "project": "p", "location": "europe-west4", "cluster": "test",
           "driverInstallerManifest": "https://mirror.example/nvidia-driver-installer/cos/daemonset-preloaded.yaml"}}}}
EKS = {"gpushare:monitoring": {"mode": "existing"},
       "gpushare:clusters": {"test-eks": {"kubeconfigContext": "eks-test", "eks": {
           "cluster": "test", "nodeRoleArn": "arn:aws:iam::123456789012:role/gpu-nodes", "subnetIds": ["subnet-1"]}}}}
TAINTS = {"gpushare:monitoring": {"mode": "install"}}


@functools.cache
def shipped(env: str) -> Plan:
    """A frozen fixture stack's plan, collected once per test session (tests only read it)."""
    return collect_plan(env)


def plan_of(env_file: Path | str, extra: dict[str, Any] | None = None, stack: str = "test") -> Plan:
    config = {"gpushare:environment": str(env_file), **(extra or {})}
    return collect_plan(stack, config)


def dev_config(**changes: Any) -> dict[str, Any]:
    config = dict(yaml.safe_load((WORKSPACE / "Pulumi.dev.yaml").read_text())["config"])
    config.update({f"gpushare:{k}": v for k, v in changes.items()})
    return config


def operator_release(plan: Plan, cluster: str | None = None) -> PlannedResource:
    (release,) = [r for r in plan.of_type("helm.sh/v3:Release") if r.inputs["chart"] == "gpu-operator"
                  and (cluster is None or plan.cluster_of(r) == cluster)]
    return release


def env_of(values: dict[str, Any], section: str) -> dict[str, str]:
    return {e["name"]: e["value"] for e in values[section].get("env", [])}


def by_name(plan: Plan, suffix: str) -> dict[str, PlannedResource]:
    return {r.name: r for r in plan.of_type(suffix)}
