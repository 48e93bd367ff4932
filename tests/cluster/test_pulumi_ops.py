"""The real engine beyond a first `up` (on a dev stack of its own): node labels shared with another field manager."""

from __future__ import annotations

import pytest

from tests.cluster import pulumi_engine as engine
from tests.cluster.conftest import ClusterFactory
from tests.cluster.kube import Kube
from tests.cluster.test_pulumi_up import Stack, prepare

# What the GPU Operator's feature discovery and mig-manager write on a GPU node (label-ownership.md: not gpushare's).
OPERATOR_LABELS = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8",
                   "nvidia.com/mig.config.state": "success", "feature.node.kubernetes.io/pci-10de.present": "true"}
OPERATOR_MANAGER = "gpu-feature-discovery"


@pytest.fixture(scope="module")
def dev(clusters: ClusterFactory, tmp_path_factory: pytest.TempPathFactory) -> Stack:
    tools = engine.tools_or_skip()
    charts = engine.charts_or_skip(tmp_path_factory.mktemp("charts"))
    stack = prepare("dev", clusters, tmp_path_factory.mktemp("ws-dev-ops"), tools, charts, prefix="ops")
    first = stack.run("up")
    assert first.ok, first.error + first.output[-6000:]
    return stack


def pulumi_labels(stack: Stack, cluster: str) -> dict[str, dict[str, str]]:
    """node -> the labels the plan gives Pulumi on it."""
    return {n["name"]: {k: e["value"] for k, e in n["labels"].items() if e.get("owner") == "pulumi"}
            for n in stack.nodes[cluster] if n["managed_by"] not in ("gke", "eks")}


def node_labels(kube: Kube, name: str) -> dict[str, str]:
    node = kube.get("v1", "Node", name)
    assert node is not None, name
    labels: dict[str, str] = node["metadata"].get("labels", {})
    return labels


def managers(kube: Kube, name: str) -> set[str]:
    node = kube.get("v1", "Node", name)
    assert node is not None
    return {m["manager"] for m in node["metadata"].get("managedFields", [])}


def test_node_labels_coexist_with_another_field_manager(dev: Stack) -> None:
    kube = dev.kubes["dev-metal"]
    owned = pulumi_labels(dev, "dev-metal")
    assert owned and all(owned.values())
    for name, labels in owned.items():
        # The operator's labels, and one of Pulumi's with its value (co-owned, as a second writer may): server-side
        # apply by another manager, the way feature discovery writes node labels.
        shared = next(iter(labels))
        answer = kube.apply({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": name, "labels": {**OPERATOR_LABELS, shared: labels[shared]}}}, manager=OPERATOR_MANAGER)
        assert answer.allowed, answer.message
    # A refresh reads the nodes back as they are; the `up` after it must not fight the other manager.
    refresh = dev.workspace.run("refresh")
    assert refresh.ok, refresh.error + refresh.output[-4000:]
    up = dev.run("up")
    assert up.ok, up.error + up.output[-6000:]
    assert "conflict" not in up.output.lower(), up.output[-4000:]
    for name, labels in owned.items():
        on_server = node_labels(kube, name)
        assert labels.items() <= on_server.items(), (name, labels, on_server)
        assert OPERATOR_LABELS.items() <= on_server.items(), (name, on_server)
        assert OPERATOR_MANAGER in managers(kube, name)
