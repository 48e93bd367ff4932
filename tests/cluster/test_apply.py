"""Every object `gpushare preview` writes, applied to Kubernetes' own API server by server-side apply exactly as
written (CRDs first): dev, pilot, prod and the DRA example, each cluster on an API server of its own. Nothing is
rejected, a second apply changes nothing, and the server's type check of every ValidatingAdmissionPolicy's CEL
finds nothing to warn about."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.environments import ENVIRONMENTS, ident, preview
from tests.cluster.kube import FIELD_MANAGER, eventually


def content(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without what the server keeps about writes (versions, managedFields) and without status."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in ("managedFields", "resourceVersion")}
    return {**{k: v for k, v in obj.items() if k not in ("metadata", "status")}, "metadata": meta}


def owned(obj: dict[str, Any]) -> list[Any]:
    return [e["fieldsV1"] for e in obj["metadata"].get("managedFields", []) if e["manager"] == FIELD_MANAGER]


CLUSTERS = [(env, cluster) for env, clusters in
            {"dev": ["dev-metal"], "pilot": ["pilot-metal", "pilot-gke"], "prod": ["prod-metal", "prod-gke"],
             "dra": ["lab-dra", "lab-plugin"], "dra-partitionable": ["lab-dra"]}.items() for cluster in clusters]


def test_the_clusters_listed_here_are_the_ones_the_previews_write(cluster_folder) -> None:  # type: ignore[no-untyped-def]
    written = [(env, c) for env in ENVIRONMENTS for c in preview(env, cluster_folder / f"preview-{env}")]
    assert sorted(written) == sorted(CLUSTERS)


@pytest.mark.parametrize(("env", "cluster"), CLUSTERS, ids=[f"{e}-{c}" for e, c in CLUSTERS])
def test_every_object_is_accepted_and_a_second_apply_changes_nothing(applied, env: str, cluster: str) -> None:  # type: ignore[no-untyped-def]
    a = applied(env, cluster)
    refused = {name: answer.message for name, answer in a.first.items() if not answer.allowed}
    assert not refused, refused
    warned = {name: answer.warnings for name, answer in a.first.items() if answer.warnings}
    assert not warned, warned
    for obj in a.objects:
        meta = obj["metadata"]
        # What the server holds now (controllers may have written status since the first apply) ...
        before = a.kube.get(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
        assert before is not None, ident(obj)
        again = a.kube.apply(obj)
        assert again.allowed, f"{ident(obj)}: {again.message}"
        # ... is what it holds after the same apply: the same content and the same fields owned by gpushare.
        # (The server may re-stamp the time of gpushare's managedFields entry once, when a status writer came between
        # a create and the next apply; that changes no field.)
        assert content(again.body) == content(before), f"{ident(obj)} changed by a second apply"
        assert owned(again.body) == owned(before), f"{ident(obj)}: a second apply changed what gpushare owns"


@pytest.mark.parametrize(("env", "cluster"), CLUSTERS, ids=[f"{e}-{c}" for e, c in CLUSTERS])
def test_the_server_type_checks_every_policy_without_warnings(applied, env: str, cluster: str) -> None:  # type: ignore[no-untyped-def]
    a = applied(env, cluster)
    names = [o["metadata"]["name"] for o in a.objects if o["kind"] == "ValidatingAdmissionPolicy"]
    assert names

    def checked() -> dict[str, Any] | None:
        out = {}
        for name in names:
            got = a.kube.get("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy", name) or {}
            status = got.get("status", {})
            if status.get("observedGeneration") != got["metadata"]["generation"] or "typeChecking" not in status:
                return None
            out[name] = status["typeChecking"].get("expressionWarnings", [])
        return out

    warnings = eventually(checked, what="the API server type-checks every policy")
    assert not {k: v for k, v in warnings.items() if v}, warnings
