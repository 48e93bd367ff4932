"""kwok nodes made from `gpushare plan --json`: each planned node with its labels, taints and GPU resources exactly
as planned (allocatable = capacity = what the node advertises), plus the CPU, memory and pod room of a GPU server.
kwok keeps them Ready and plays their kubelet: pods bound to them become Running without containers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.cluster.bins import ROOT

# What a GPU server offers besides its GPUs: enough that only GPU resources, pools and taints decide placement.
HOST_RESOURCES = {"cpu": "128", "memory": "1Ti", "pods": "110", "ephemeral-storage": "2Ti"}
KWOK_ANNOTATION = {"kwok.x-k8s.io/node": "fake"}


def plan_json(env: str, root: Path = ROOT) -> dict[str, Any]:
    """The plan exactly as `gpushare plan --env ENV --json` prints it."""
    out = subprocess.run([sys.executable, "-m", "gpushare", "plan", "--env", env, "--json"], cwd=root,
                         capture_output=True, text=True, check=False,
                         env={**os.environ, "GPUSHARE_ROOT": str(root)})
    assert out.returncode == 0, out.stderr or out.stdout
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def planned_nodes(plan: dict[str, Any], cluster: str) -> list[dict[str, Any]]:
    """The planned nodes of one cluster, one entry per machine (a cloud pool's `count` expanded)."""
    out: list[dict[str, Any]] = []
    for pool in plan["pools"]:
        if pool["cluster"] != cluster:
            continue
        for node in pool["nodes"]:
            names = [node["name"]] if node["count"] == 1 else [f"{node['name']}-{i}" for i in range(node["count"])]
            out.extend({**node, "name": name, "pool": pool["name"]} for name in names)
    return out


def kwok_node(node: dict[str, Any], owners: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The node as a kwok Node; with `owners`, only the labels those owners set (the plan names each label's owner),
    so that the rest must come from applying gpushare's objects."""
    labels = {key: entry["value"] for key, entry in node["labels"].items()
              if owners is None or entry.get("owner") in owners}
    labels.update({"kubernetes.io/hostname": node["name"], "kubernetes.io/os": "linux",
                   "kubernetes.io/arch": "amd64", "type": "kwok"})
    resources = {**HOST_RESOURCES, **{k: str(v) for k, v in node["advertised"].items()}}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node["name"], "labels": labels, "annotations": dict(KWOK_ANNOTATION)},
        "spec": {"taints": [dict(t) for t in node["taints"]]},
        "status": {"allocatable": resources, "capacity": dict(resources)},
    }
