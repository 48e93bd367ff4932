"""`pulumi up` for real: the Pulumi CLI and the Kubernetes provider (built from their Go modules) apply the dev and
pilot stacks and the DRA example to API servers of their own, with kwok nodes from `gpushare plan --json` that exist
before the first `up` (the machines are there before Pulumi labels them); nothing of the preview is applied
beforehand: `pulumi up` creates every object. Then every object the offline preview printed is on the server with
the preview's fields, a second `up` changes nothing and a refresh finds no drift.

Test-only settings of the stacks (docs/pulumi.md): the charts come from ../shared/charts (gpushare:localCharts),
releases do not wait for workloads kwok never runs (gpushare:skipAwait), and Kueue and the monitoring stack are
`existing` (their CRDs applied first): Kueue's chart registers admission webhooks with failurePolicy Fail whose
server never runs on kwok nodes, so no ClusterQueue could be created after its release. pilot's GKE cluster is left
out: its node pool needs Google's API and the pulumi-gcp provider."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.paths import package_data_path
from tests.cluster import pulumi_engine as engine
from tests.cluster.conftest import ClusterFactory
from tests.cluster.environments import ENVIRONMENTS, apply_crds, ident, preview
from tests.cluster.kube import Kube
from tests.cluster.nodes import kwok_node, plan_json, planned_nodes

# What the test API servers stand in for: clusters that already run Kueue and kube-prometheus-stack.
EXISTING = {"gpushare:kueue": {"mode": "existing"},
            "gpushare:monitoring": {"mode": "existing", "release": "kube-prometheus-stack", "namespace": "monitoring"}}
PREEXISTING_NAMESPACES = ("kueue-system", "monitoring")
DROP = {"pilot": ("pilot-gke",)}
STACKS = {"dev": "dev", "pilot": "pilot", "dra": "dra"}
SYSTEM_NODE = "system-1"  # a kwok node without GPUs or taints


@pytest.fixture(scope="session")
def pulumi_tools() -> dict[str, Path]:
    return engine.built_tools()


@pytest.fixture(scope="session")
def charts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return engine.charts_or_skip(tmp_path_factory.mktemp("charts"))


def existing_crds(kube: Kube) -> None:
    """Kueue's and prometheus-operator's CRDs (copies in gpushare/data), as the clusters' own installs left them."""
    apply_crds(kube, [d for p in sorted(package_data_path().glob("crd-*.yaml"))
                      if "kueue" in p.name or "monitoring.coreos.com" in p.name
                      for d in yaml.safe_load_all(p.read_text()) if d])


@dataclass
class Stack:
    env: str
    workspace: engine.Workspace
    kubes: dict[str, Kube]  # environment cluster -> client of its API server
    nodes: dict[str, list[dict[str, Any]]]
    answers: list[engine.Answer] = field(default_factory=list)

    def run(self, op: str, *packs: Path) -> engine.Answer:
        answer = self.workspace.run(op, *packs)
        self.answers.append(answer)
        return answer


def prepare(env: str, clusters: ClusterFactory, folder: Path, tools: dict[str, Path], charts: dict[str, str],
            settings: dict[str, Any] | None = None, prefix: str = "pulumi") -> Stack:
    """API servers for the environment's clusters, each with its kwok nodes, the CRDs and namespaces of what it
    already runs; and a workspace whose stack points at them. Nothing of gpushare's is applied."""
    source = ENVIRONMENTS[env]
    plan = plan_json(str(engine.ROOT / source) if source.endswith(".yaml") else source)
    names = sorted({p["cluster"] for p in plan["pools"]} - set(DROP.get(env, ())))
    kubes: dict[str, Kube] = {}
    kubeconfigs: list[Path] = []
    contexts: dict[str, str] = {}
    nodes: dict[str, list[dict[str, Any]]] = {}
    for name in names:
        cluster, kube = clusters(f"{prefix}-{env}-{name}")
        kubes[name], contexts[name] = kube, cluster.name
        kubeconfigs.append(cluster.kubeconfig)
        existing_crds(kube)
        for ns in PREEXISTING_NAMESPACES:
            kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, dry_run=False)
        # Every real cluster has nodes for its system workloads, and every GPU pool here is tainted: the chart's
        # hook Jobs (the GPU Operator's CRD upgrade before an upgrade, its cleanup before an uninstall) run there.
        kube.create(kwok_node({"name": SYSTEM_NODE, "labels": {}, "taints": [], "advertised": {}}), dry_run=False)
        nodes[name] = planned_nodes(plan, name)
        for node in nodes[name]:
            owners = None if node["managed_by"] in ("gke", "eks") else ("ansible",)
            answer = kube.create(kwok_node(node, owners=owners), dry_run=False)
            assert answer.allowed or answer.status == 409, answer.message
    environment = source if source.endswith(".yaml") else f"environments/{source}.yaml"
    workspace = engine.Workspace(folder, STACKS[env], environment, kubeconfigs, contexts, tools, charts,
                                 settings={**EXISTING, **(settings or {})}, drop_clusters=DROP.get(env, ()))
    return Stack(env, workspace, kubes, nodes)


def brought_up(env: str, clusters: ClusterFactory, tmp_path_factory: pytest.TempPathFactory, prefix: str) -> Stack:
    """A stack of its own (API servers named by `prefix`) after a first `pulumi up`; skips without the programs."""
    tools = engine.built_tools()
    charts = engine.charts_or_skip(tmp_path_factory.mktemp("charts"))
    stack = prepare(env, clusters, tmp_path_factory.mktemp(f"ws-{env}-{prefix}"), tools, charts, prefix=prefix)
    first = stack.run("up")
    assert first.ok, first.error + first.output[-6000:]
    return stack


def missing(expected: Any, actual: Any, where: str = "") -> list[str]:
    """Where `actual` lacks what `expected` holds: maps by key, lists element by element (each expected element
    somewhere in the actual list: the server may keep others' entries, e.g. taints), scalars by value (a number the
    server writes back as a string, as quantities, is equal)."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{where}: {actual!r} is not a map"]
        return [m for k, v in expected.items() for m in missing(v, actual.get(k), f"{where}.{k}")]
    if isinstance(expected, list):
        if not isinstance(actual, list):
            return [f"{where}: {actual!r} is not a list"]
        return [f"{where}[{i}]: {e!r} not in {actual!r}" for i, e in enumerate(expected)
                if not any(not missing(e, a) for a in actual)]
    if actual is None and expected in (False, "", 0):
        return []  # the API server leaves zero values of omitempty fields out (a PriorityClass's globalDefault)
    return [] if expected == actual or str(expected) == str(actual) else [f"{where}: {actual!r} != {expected!r}"]


def server_object(kube: Kube, obj: dict[str, Any]) -> dict[str, Any] | None:
    meta = obj["metadata"]
    return kube.get(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))


@pytest.fixture(scope="session")
def stacks(clusters: ClusterFactory, pulumi_tools: dict[str, Path], charts: dict[str, str],
           tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Stack]:
    """`stacks(env)`: the environment brought up by a first `pulumi up`, then a second `up` and a refresh."""
    done: dict[str, Stack] = {}

    def get(env: str) -> Stack:
        if env not in done:
            stack = prepare(env, clusters, tmp_path_factory.mktemp(f"ws-{env}"), pulumi_tools, charts)
            first = stack.run("up")
            assert first.ok, first.error + first.output[-6000:]
            stack.run("up")
            stack.run("refresh")
            done[env] = stack
        return done[env]

    return get


@pytest.mark.parametrize("env", ["dev", "pilot", "dra"])
def test_up_creates_every_previewed_object_with_its_fields(env: str, stacks: Callable[[str], Stack],
                                                          tmp_path: Path) -> None:
    stack = stacks(env)
    first = stack.answers[0]
    assert first.changed().get("create", 0) > 0, first.changes
    objects = preview(env, tmp_path / "preview")
    assert set(stack.kubes) <= set(objects), (sorted(stack.kubes), sorted(objects))
    problems: list[str] = []
    for cluster, kube in stack.kubes.items():
        for obj in objects[cluster]:
            found = server_object(kube, obj)
            if found is None:
                problems.append(f"{cluster}: {ident(obj)} is not on the server")
                continue
            expected = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "status")}
            problems.extend(f"{cluster}: {ident(obj)}{m}" for m in missing(expected, found))
    assert not problems, "\n".join(problems[:40])


@pytest.mark.parametrize("env", ["dev", "pilot", "dra"])
def test_every_registered_object_exists(env: str, stacks: Callable[[str], Stack]) -> None:
    """What the engine's state holds for each Kubernetes resource is on the server under that name (Helm releases:
    their release Secret, as Helm keeps it)."""
    stack = stacks(env)
    state = stack.answers[0].registered()
    assert state
    by_context = {c: k for c, k in stack.kubes.items()}
    absent = []
    for resource in state:
        outputs = resource["outputs"]
        kind = str(resource["type"]).rsplit(":", 1)[-1]
        if kind == "Release":
            status = outputs.get("status") or {}
            assert status.get("status") == "deployed", (resource["urn"], status)
            continue
        meta = outputs.get("metadata") or {}
        if not meta.get("name"):
            continue
        if not any(kube.get(outputs["apiVersion"], outputs["kind"], meta["name"], meta.get("namespace"))
                   for kube in by_context.values()):
            absent.append(resource["urn"])
    assert not absent, absent


@pytest.mark.parametrize("env", ["dev", "pilot", "dra"])
def test_second_up_changes_nothing(env: str, stacks: Callable[[str], Stack]) -> None:
    second = stacks(env).answers[1]
    assert second.ok, second.error + second.output[-4000:]
    assert second.changed() == {}, second.output[-6000:]


@pytest.mark.parametrize("env", ["dev", "pilot", "dra"])
def test_refresh_finds_no_drift(env: str, stacks: Callable[[str], Stack]) -> None:
    refresh = stacks(env).answers[2]
    assert refresh.ok, refresh.error + refresh.output[-4000:]
    assert refresh.changed() == {}, refresh.output[-6000:]


def test_pilot_up_times(stacks: Callable[[str], Stack]) -> None:
    """The figures docs/pulumi.md gives: a first and a second `up` of pilot (printed with -s)."""
    first, second = stacks("pilot").answers[:2]
    print(f"pilot: first up {first.seconds} s, second up {second.seconds} s")
    assert second.seconds < first.seconds
