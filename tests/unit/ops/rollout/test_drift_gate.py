"""`gpushare rollout --kubeconfig` refuses to start on drift it cannot explain, unless --accept-drift; it reads
the hosts through kubectl, here a test double on PATH that answers `get node NAME -o json` from the fixture."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.resolve import resolve_env
from gpushare.ops.rollout.drift_gate import unexplained_drift
from tests.unit.ops.brownfield.helpers import CLUSTERS, ENV

Imported = Callable[[str], tuple[Path, dict[str, Any]]]
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def fixture_nodes(name: str) -> dict[str, dict[str, Any]]:
    return {n["metadata"]["name"]: n for n in yaml.safe_load((CLUSTERS / name / "nodes.yaml").read_text())["items"]}


class FixtureKubectl:
    """The rollout's Kubectl interface over fixture nodes; it records the nodes asked for."""

    def __init__(self, nodes: dict[str, dict[str, Any]]) -> None:
        self.nodes = nodes
        self.asked: list[str] = []

    def node(self, context: str | None, name: str) -> dict[str, Any]:
        self.asked.append(name)
        if name not in self.nodes:
            raise GpushareError(Problem(f'kubectl get node {name} -o json: nodes "{name}" not found'), exit_code=2)
        return self.nodes[name]

    def cordon(self, context: str | None, name: str) -> None:
        raise AssertionError("the drift gate only reads")

    uncordon = cordon

    def label(self, context: str | None, name: str, labels: dict[str, str]) -> None:
        raise AssertionError("the drift gate only reads")


@pytest.mark.parametrize(("name", "expected"), [
    ("default-operator", set()),
    ("quotas-kueue", set()),
    # Before the first rollout the label names a config only the cluster's ConfigMap holds, which the gate does
    # not read: `gpushare drift` finds this one (test_drift); after adoption the gate does (below).
    ("not-taken-effect", set()),
    ("timeslicing-mig", {("a100-02", "mig-state"), ("a100-02", "paused-operand"), ("a100-03", "mig-state")}),
])
def test_gate_finds_the_unexplained_drift(imported: Imported, name: str, expected: set[tuple[str, str]]) -> None:
    imported(name)
    fleet = resolve_env(ENV)
    kube = FixtureKubectl(fixture_nodes(name))
    assert {(d.node, d.kind) for d in unexplained_drift(fleet, kube, NOW)} == expected
    assert sorted(kube.asked) == sorted(n.name for n in fleet.nodes)


def test_gate_finds_a_config_not_taken_effect_after_adoption(imported: Imported) -> None:
    imported("not-taken-effect")
    fleet = resolve_env(ENV)
    nodes = fixture_nodes("not-taken-effect")
    for git in fleet.nodes:  # as the first rollout left them: Git's config names, l4-12's plugin still stale
        assert git.device_plugin_config is not None
        nodes[git.name]["metadata"]["labels"]["nvidia.com/device-plugin.config"] = git.device_plugin_config
    drift = unexplained_drift(fleet, FixtureKubectl(nodes), NOW)
    assert [(d.node, d.kind, d.field) for d in drift] == [("l4-12", "advertised", "status.capacity"),
                                                         ("l4-12", "advertised", "status.allocatable")]


def test_gate_reports_a_host_the_cluster_lacks(imported: Imported) -> None:
    imported("default-operator")
    nodes = fixture_nodes("default-operator")
    del nodes["gpu-a100-02"]
    drift = unexplained_drift(resolve_env(ENV), FixtureKubectl(nodes), NOW)
    assert [(d.node, d.kind) for d in drift] == [("gpu-a100-02", "missing-host")]


KUBECTL = '''#!{python}
import json, sys
args = [a for a in sys.argv[1:] if not a.startswith(("--kubeconfig", "--context"))]
nodes = json.load(open({nodes!r}))
if args[:2] == ["get", "node"] and args[2] in nodes:
    print(json.dumps(nodes[args[2]]))
    sys.exit(0)
print("unexpected kubectl call: " + " ".join(args), file=sys.stderr)
sys.exit(1)
'''


def test_rollout_refuses_on_drift_unless_accepted(imported: Imported, tmp_path: Path) -> None:
    workspace, _ = imported("timeslicing-mig")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "nodes.json").write_text(json.dumps(fixture_nodes("timeslicing-mig")))
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(KUBECTL.format(python=sys.executable, nodes=str(tmp_path / "nodes.json")))
    kubectl.chmod(0o755)
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\nkind: Config\n")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "GPUSHARE_ROOT": str(workspace)}
    cmd = [sys.executable, "-m", "gpushare", "rollout", "--env", ENV, "--kubeconfig", str(tmp_path / "kubeconfig"),
           "--journal", str(tmp_path / "journal.jsonl"), "--json"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    errors = json.loads(done.stdout)["errors"]
    assert "4 drift items the rollout cannot explain" in errors[0]
    assert any("a100-03" in e and "mig-state" in e for e in errors[1:])
    accepted = subprocess.run([*cmd, "--accept-drift"], env=env, capture_output=True, text=True, timeout=300)
    assert "cannot explain" not in accepted.stdout + accepted.stderr  # it went on, to whatever comes next
