"""The real engine beyond a first `up` (on a dev stack of its own): node labels shared with another field manager,
and the policy pack under `pulumi preview --policy-pack`."""

from __future__ import annotations

import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import pulumi_engine as engine
from tests.cluster.conftest import ClusterFactory
from tests.cluster.kube import Kube
from tests.cluster.test_pulumi_up import Stack, brought_up

# What the GPU Operator's feature discovery and mig-manager write on a GPU node (label-ownership.md: not gpushare's).
OPERATOR_LABELS = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8",
                   "nvidia.com/mig.config.state": "success", "feature.node.kubernetes.io/pci-10de.present": "true"}
OPERATOR_MANAGER = "gpu-feature-discovery"


@pytest.fixture(scope="module")
def dev(clusters: ClusterFactory, tmp_path_factory: pytest.TempPathFactory) -> Stack:
    return brought_up("dev", clusters, tmp_path_factory, "ops")


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


def shim(folder: Path, pack: Path) -> Path:
    """An executable analyzer that serves the workspace's policy pack: `pulumi preview --policy-pack` starts a pack
    directory through the Python language host, which cannot be built from the module proxy; an executable is
    started directly (docs/pulumi.md). Its PulumiPolicy.yaml is the pack's own."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "PulumiPolicy.yaml").write_text((pack / "PulumiPolicy.yaml").read_text())
    exe = folder / "pulumi-analyzer-gpushare"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} -u {pack / '__main__.py'} \"$@\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def preview_workspace(dev: Stack, folder: Path, defaults: dict[str, Any] | None = None) -> engine.Workspace:
    """A workspace of its own (its own state, so its preview is a first one) on dev's API server, the environment's
    defaults optionally changed."""
    config = yaml.safe_load((dev.workspace.folder / "Pulumi.dev.yaml").read_text())["config"]
    ws = engine.Workspace(folder, "dev", "environments/dev.yaml",
                          dev.workspace.kubeconfigs,
                          {c: s["kubeconfigContext"] for c, s in config["gpushare:clusters"].items()},
                          dev.workspace.tools, config["gpushare:localCharts"],
                          settings={k: config[k] for k in ("gpushare:kueue", "gpushare:monitoring")})
    if defaults:
        path = ws.folder / "environments" / "dev.yaml"
        env = yaml.safe_load(path.read_text())
        env["defaults"].update(defaults)
        path.write_text(yaml.safe_dump(env, sort_keys=False))
    return ws


# What pulumi_policy reports when a stack policy reads a value the preview does not know: the policy did not run.
NOT_RUN = "can't run policy"


def test_policy_pack_passes_a_clean_stack(dev: Stack, tmp_path: Path) -> None:
    ws = preview_workspace(dev, tmp_path / "ws")
    answer = ws.run("preview", shim(tmp_path / "pack", ws.folder / "policies" / "pack"))
    assert answer.ok, answer.error + answer.output[-6000:]
    assert "gpushare-guardrails" in answer.output, answer.output[-3000:]
    assert NOT_RUN not in answer.output, answer.output[-3000:]
    assert "mandatory" not in answer.output.lower(), answer.output[-3000:]


def test_policy_pack_stops_a_first_preview_that_breaks_a_guardrail(dev: Stack, tmp_path: Path) -> None:
    """A toolkit below the CVE floor, on a stack's first preview (every Helm release's status unknown): the pack's
    mandatory policy must stop it with its own message, not be skipped."""
    ws = preview_workspace(dev, tmp_path / "ws", {"toolkit_version": "1.17.3"})
    answer = ws.run("preview", shim(tmp_path / "pack", ws.folder / "policies" / "pack"))
    assert not answer.ok, answer.output[-6000:]
    text = answer.output + answer.error
    assert NOT_RUN not in text, text[-3000:]
    assert "toolkit-cve-floor" in text and "1.17.3" in text, text[-6000:]
