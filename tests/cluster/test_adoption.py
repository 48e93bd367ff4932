"""Live adoption, for real: a brownfield cluster's objects (nodes with their labels, taints and allocatable, the
GPU Operator's ConfigMaps and ClusterPolicy, namespaces, quotas, priority classes, Kueue's queues) created on
Kubernetes' own API server, then `gpushare import --kubeconfig` and `gpushare drift --kubeconfig` read it through
the official client: the same result as from a dump of the same objects, and a change planted on the server is
reported. The dump compared with is taken from the same server, as `kubectl get -o yaml` takes it (the server's
order, and what a real cluster has beside the fixture's objects: its own namespaces, kube-root-ca.crt in every
namespace, the system priority classes)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.paths import package_data_path
from tests.cluster.environments import apply_crds
from tests.cluster.kube import Kube, eventually
from tests.cluster.nodes import KWOK_ANNOTATION
from tests.unit.ops.brownfield.helpers import CLUSTERS, ENV, cli
from tests.unit.ops.brownfield.test_live import objects_of, without_source

FIXTURES = ["timeslicing-mig", "quotas-kueue"]
SERVER_FIELDS = ("resourceVersion", "uid", "creationTimestamp", "managedFields", "selfLink", "generation")


def as_served(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as a real cluster serves it. Kueue 0.19's conversion webhook (not running here) stores v1beta2,
    where a ClusterQueue's `cohort` is `cohortName`. The ClusterPolicy CRD requires spec.daemonsets, dcgm and
    nodeStatusExporter, which the chart always renders (tests/data/brownfield's hand-written dumps leave them out): they
    get the chart's defaults. A dump of such a cluster lists the same objects."""
    obj = copy.deepcopy(obj)
    if obj["kind"] == "ClusterPolicy":
        values = yaml.safe_load((package_data_path() / "gpu-operator-values.yaml").read_text())
        spec = obj.setdefault("spec", {})
        spec.setdefault("daemonsets", {"priorityClassName": values["daemonsets"]["priorityClassName"]})
        spec.setdefault("dcgm", {"enabled": values["dcgm"]["enabled"]})
        spec.setdefault("nodeStatusExporter", {"enabled": values["nodeStatusExporter"]["enabled"]})
    if obj["apiVersion"] == "kueue.x-k8s.io/v1beta1":
        obj["apiVersion"] = "kueue.x-k8s.io/v1beta2"
        if obj["kind"] == "ClusterQueue" and "cohort" in obj.get("spec", {}):
            obj["spec"]["cohortName"] = obj["spec"].pop("cohort")
    return obj


def populate(kube: Kube, objects: dict[str, list[dict[str, Any]]]) -> None:
    apply_crds(kube)
    order = ["Namespace", "PriorityClass", "Node", "ConfigMap", "ResourceQuota", "ClusterPolicy", "ResourceFlavor",
             "ClusterQueue", "LocalQueue"]
    assert set(objects) <= set(order), set(objects) - set(order)
    # the namespaces objects live in, where the dump has no Namespace list (a `kubectl get` of the kinds only)
    for ns in sorted({o["metadata"]["namespace"] for items in objects.values() for o in items
                      if o["metadata"].get("namespace")}):
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, dry_run=False)
    for kind in order:
        for item in objects.get(kind, []):
            obj = copy.deepcopy(item)
            for key in SERVER_FIELDS:
                obj["metadata"].pop(key, None)
            status = obj.pop("status", None) if kind == "Node" else None
            if kind == "Node":  # kwok keeps it Ready; otherwise the node controller would taint it unreachable
                obj["metadata"].setdefault("annotations", {}).update(KWOK_ANNOTATION)
            made = kube.create(obj, dry_run=False)
            if made.status == 409 and kind in ("Namespace", "PriorityClass"):
                continue  # the server's own (default, kube-system, system-cluster-critical) or made just above
            assert made.allowed, f"{kind} {obj['metadata'].get('name')}: {made.message}"
            if status is not None:
                name = obj["metadata"]["name"]
                # kwok writes a new node's status once (its own address among it) and keeps what it finds after:
                # the dump's status goes in after that first write, or kwok's could land on top of it.
                eventually(lambda name=name: any(c.get("type") == "Ready" for c in ((kube.get(
                    "v1", "Node", name) or {}).get("status") or {}).get("conditions") or []),
                    what=f"kwok takes node {name} up")
                patched = kube.request("PATCH", f"/api/v1/nodes/{name}/status",
                                       {"status": status}, content_type="application/merge-patch+json")
                assert patched.allowed, patched.message


# What `kubectl get <kind> -A -o yaml` lists for a dump, as docs/adoption.md says to write it.
DUMPED = [("v1", "Node"), ("v1", "ConfigMap"), ("v1", "Namespace"), ("v1", "ResourceQuota"),
          ("scheduling.k8s.io/v1", "PriorityClass"), ("nvidia.com/v1", "ClusterPolicy"),
          ("kueue.x-k8s.io/v1beta2", "ResourceFlavor"), ("kueue.x-k8s.io/v1beta2", "ClusterQueue"),
          ("kueue.x-k8s.io/v1beta2", "LocalQueue")]


def write_dump(kube: Kube, folder: Path) -> Path:
    """A dump of the server, one file per kind, as kubectl writes it (the server's order, its own objects too)."""
    folder.mkdir(parents=True)
    for api_version, kind in DUMPED:
        items = kube.list(api_version, kind)
        for item in items:
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        (folder / f"{kind.lower()}s.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List",
                                                                      "items": items}))
    return folder


@pytest.fixture(scope="module")
def live(clusters, tmp_path_factory):  # type: ignore[no-untyped-def]
    """fixture name -> (kubeconfig, context, a dump of the server's objects)."""
    out: dict[str, tuple[Path, str, Path]] = {}

    def get(name: str) -> tuple[Path, str, Path]:
        if name not in out:
            objects = {kind: [as_served(o) for o in items] for kind, items in objects_of(CLUSTERS / name).items()}
            cluster, kube = clusters(f"adopt-{name}")
            populate(kube, objects)
            out[name] = (cluster.kubeconfig, cluster.name, write_dump(kube, tmp_path_factory.mktemp(name) / "dump"))
        return out[name]

    return get


def import_into(workspace: Path, *source: str) -> dict[str, Any]:
    from gpushare.cli.init import write_workspace

    write_workspace(workspace)
    code, out = cli("import", *source, "--env", ENV, "--out", str(workspace))
    assert code == 0, out
    return dict(out)


@pytest.mark.parametrize("name", FIXTURES)
def test_live_import_equals_the_import_of_a_dump(live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
                                                 name: str) -> None:
    kubeconfig, context, dump = live(name)
    from_dump = import_into(tmp_path / "dump", "--from", str(dump))
    from_server = import_into(tmp_path / "live", "--kubeconfig", str(kubeconfig), "--context", context)
    for key in ("mapping", "unsupported", "files"):
        assert from_server[key] == from_dump[key], key
    for rel in from_server["files"]:
        mine = without_source((tmp_path / "live" / rel).read_text())
        if rel.startswith("environments/"):  # the context it was read through is the only addition
            assert [c.pop("kubeconfig_context") for c in mine["clusters"]] == [context]
        assert mine == without_source((tmp_path / "dump" / rel).read_text()), rel


def test_live_drift_equals_the_dump_drift_and_sees_a_planted_change(live, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    kubeconfig, context, dump = live("timeslicing-mig")
    workspace = tmp_path / "ws"
    import_into(workspace, "--from", str(dump))
    monkeypatch.setenv("GPUSHARE_ROOT", str(workspace))
    code_dump, from_dump = cli("drift", "--env", ENV, "--from", str(dump))
    code_live, from_server = cli("drift", "--env", ENV, "--kubeconfig", str(kubeconfig), "--context", context)
    assert code_live == code_dump, (from_server, from_dump)
    assert from_server["drift"] == from_dump["drift"] and from_server["pending"] == from_dump["pending"]

    kube = Kube(kubeconfig)
    node = next(n for n in objects_of(dump)["Node"] if "nvidia.com/device-plugin.config" in n["metadata"]["labels"])
    name = node["metadata"]["name"]
    planted = {"metadata": {"labels": {"nvidia.com/device-plugin.config": "hand-edited"}}}
    answer = kube.request("PATCH", f"/api/v1/nodes/{name}", planted, content_type="application/merge-patch+json")
    assert answer.allowed, answer.message
    try:
        code, after = cli("drift", "--env", ENV, "--kubeconfig", str(kubeconfig), "--context", context)
        assert code == 1
        new = [d for d in after["drift"] if d not in from_server["drift"]]
        assert new and all(name in str(d) for d in new), new
        assert any("hand-edited" in str(d) for d in new), new
    finally:
        old = node["metadata"]["labels"]["nvidia.com/device-plugin.config"]
        kube.request("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": {
            "nvidia.com/device-plugin.config": old}}}, content_type="application/merge-patch+json")
