"""`gpushare preview`: the offline preview's plan, schema validation, manifests, JSON and exit codes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.ops.preview import (
    KUBERNETES_VERSIONS,
    MARKER,
    KubernetesObject,
    Plan,
    PlannedResource,
    check_node_label_allowlist,
    collect_plan,
    kubernetes_objects,
    run_preview,
    validate_object,
)
from tests.conftest import ENVIRONMENTS, ROOT, pool_named
from tests.unit.program.helpers import EKS, FIXTURES, GKE, TAINTS, shipped

runner = CliRunner()
FIXTURE_CONFIGS = {"gke-operator": GKE, "eks": EKS, "taints": TAINTS}


def preview(*args: str) -> Any:
    return runner.invoke(app, ["preview", *args], env={"COLUMNS": "250"})


def test_preview_json_lists_every_resource_with_type_name_and_inputs() -> None:
    result = preview("--env", "dev", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ok"] is True and data["errors"] == []
    assert set(data) >= {"ok", "resources", "errors", "warnings"}
    kinds = {r["type"] for r in data["resources"]}
    assert {"kubernetes:core/v1:NodePatch", "kubernetes:helm.sh/v3:Release", "pulumi:providers:kubernetes",
            "kubernetes:monitoring.coreos.com/v1:PrometheusRule", "gpushare:nvidia:NvidiaStack"} <= kinds
    for r in data["resources"]:
        assert set(r) == {"type", "name", "inputs"} and isinstance(r["inputs"], dict)
    assert any("offline preview" in line for line in data["not_checked"])


def test_preview_prints_the_tree_and_says_what_it_cannot_check(tmp_path: Path) -> None:
    result = preview("--env", "pilot", "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())
    for text in ("gpushare:nvidia:NvidiaStack", "gcp:container/nodePool:NodePool", "TIME_SHARING x2",
                 "chart gpu-operator v26.7.0", "offline preview", "Helm chart rendering",
                 "objects the GPU Operator creates", "cloud API validation",
                 "each cluster's Kubernetes minor, 1.36 (pilot-gke), 1.36 (pilot-metal)"):
        assert text in out, text


@pytest.mark.parametrize("env", ["dev", "pilot", "prod"])
def test_every_object_of_every_shipped_stack_passes_schema_validation(env: str, shipped_workspace: Path) -> None:
    result = run_preview(env)
    assert result.ok, result.errors
    kinds = {o.kind for o in result.objects}
    assert {"Node", "Namespace", "ConfigMap", "PrometheusRule"} <= kinds
    assert all(validate_object(o) == [] for o in result.objects)


@pytest.mark.parametrize("fixture", sorted(FIXTURE_CONFIGS))
def test_every_object_of_the_fixture_stacks_passes_schema_validation(fixture: str) -> None:
    config = {"gpushare:environment": str(FIXTURES / f"{fixture}.yaml"), **FIXTURE_CONFIGS[fixture]}
    result = run_preview(fixture, config=config)
    assert result.ok, result.errors
    assert result.objects


def test_out_writes_every_object_and_each_releases_values(tmp_path: Path) -> None:
    out = tmp_path / "build" / "dev"
    result = run_preview("dev", out)
    assert result.ok
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.yaml"))
    assert len([f for f in files if f.startswith("manifests/")]) == len(result.objects)
    assert "manifests/dev-metal/node-dev-a100-01.yaml" in files
    assert "helm-values/dev-metal/gpu-operator.yaml" in files
    for obj in result.objects:
        written = yaml.safe_load((out / "manifests" / obj.path).read_text())
        assert written == obj.body
    values = yaml.safe_load((out / "helm-values" / "dev-metal" / "gpu-operator.yaml").read_text())
    assert values["mig"] == {"strategy": "mixed"}
    configmap = (out / "manifests" / "dev-metal" / "configmap-gpu-operator-gpushare-device-plugin-configs.yaml")
    assert "  gpushare-default: |\n" in configmap.read_text()  # rendered configs stay readable
    # A second run replaces what the first wrote; `gpushare render` may share the directory.
    assert (out / MARKER).exists()
    assert runner.invoke(app, ["render", "--env", "dev", "--out", str(out)]).exit_code == 0
    assert run_preview("dev", out).ok
    assert (out / "fleet.json").exists() and (out / "manifests").is_dir()


def test_render_into_a_preview_directory_keeps_the_preview(tmp_path: Path) -> None:
    """The README renders and previews into build/<env>: render replaces its own files, not the preview's."""
    out = tmp_path / "build" / "dev"
    assert run_preview("dev", out).ok
    before = {p.relative_to(out): p.read_bytes() for part in ("manifests", "helm-values")
              for p in (out / part).rglob("*") if p.is_file()}
    assert before and (out / ".gpushare-preview").is_file()
    assert runner.invoke(app, ["render", "--env", "dev", "--out", str(out)]).exit_code == 0
    stale = out / "mig-parted" / "from-an-older-render.yaml"
    stale.write_text("old")
    result = runner.invoke(app, ["render", "--env", "dev", "--out", str(out)])
    assert result.exit_code == 0, result.output
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert {p: after.get(p) for p in before} == before  # every manifest and values file, unchanged
    assert (out / ".gpushare-preview").is_file() and run_preview("dev", out).ok  # and preview may write again
    assert (out / "fleet.json").is_file() and not stale.exists()  # render's own part is replaced as a whole


def test_preview_refuses_a_directory_it_did_not_write(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("keep me")
    result = preview("--env", "dev", "--out", str(tmp_path))
    assert result.exit_code == 2
    assert (tmp_path / "mine.txt").read_text() == "keep me" and not (tmp_path / "manifests").exists()


def test_unknown_stack_fails_clearly_and_writes_nothing(tmp_path: Path) -> None:
    result = preview("--env", "staging", "--out", str(tmp_path / "out"), "--json")
    assert result.exit_code == 2
    data = json.loads(result.stdout)
    assert data["ok"] is False and data["resources"] == []
    assert "no stack named 'staging'" in data["errors"][0]
    assert not (tmp_path / "out").exists()


def test_stack_whose_environment_file_is_missing_fails_and_writes_nothing(tmp_path: Path) -> None:
    stack = tmp_path / "Pulumi.gone.yaml"
    stack.write_text(yaml.safe_dump({"config": {"gpushare:environment": str(tmp_path / "gone.yaml"),
                                                "gpushare:monitoring": {"mode": "install"}}}))
    result = preview("--env", str(stack), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert "file not found" in result.stderr
    assert not (tmp_path / "out").exists()


def write_stack(tmp_path: Path, env_file: Path, config: dict[str, Any], name: str = "bad") -> Path:
    stack = tmp_path / f"Pulumi.{name}.yaml"
    stack.write_text(yaml.safe_dump({"config": {"gpushare:environment": str(env_file), **config}}))
    return stack


def test_a_profile_the_cloud_pool_cannot_express_fails_and_writes_nothing(
        tmp_path: Path, write_env: Callable[..., Path]) -> None:
    data = yaml.safe_load((FIXTURES / "gke-operator.yaml").read_text())
    data["profiles"] = [{"name": "mig-four", "kind": "mig",
                         "mig": {"layouts": {"NVIDIA A100-SXM4-80GB": "1g.10gb=4"}}}]
    pool_named(data, "a100-gke-mig")["profile"] = "mig-four"
    stack = write_stack(tmp_path, write_env(data), GKE)
    result = preview("--env", str(stack), "--out", str(tmp_path / "out"), "--json")
    assert result.exit_code == 1
    (error,) = json.loads(result.stdout)["errors"]
    assert "always creates 7" in error and "pools[1]" in error and error.startswith(str(tmp_path))
    assert not (tmp_path / "out").exists()


def test_an_unknown_chart_value_fails_and_writes_nothing(tmp_path: Path) -> None:
    stack = write_stack(tmp_path, ENVIRONMENTS / "dev.yaml",
                        {"gpushare:monitoring": {"mode": "install"},
                         "gpushare:operatorValues": {"migManager": {"confg": {"name": "x"}}}})
    result = preview("--env", str(stack), "--out", str(tmp_path / "out"))
    assert result.exit_code == 1
    assert "has no value 'migManager.confg'" in " ".join(result.stderr.split())
    assert not (tmp_path / "out").exists()


def test_an_environment_file_is_previewed_with_the_stack_that_names_it() -> None:
    plan = collect_plan(str(ENVIRONMENTS / "pilot.yaml"))
    assert plan.stack == "pilot" and plan.of_type("container/nodePool:NodePool")
    bare = collect_plan(str(FIXTURES / "taints.yaml"))
    assert bare.stack == "taints" and any("no stack names" in w for w in bare.warnings)


def test_collect_plan_gives_policies_types_inputs_parents_and_dependencies() -> None:
    plan = shipped("dev")
    by_urn = plan.by_urn()
    patch = plan.of_type(":NodePatch")[0]
    assert patch.parent is not None and by_urn[patch.parent].type == "gpushare:pools:GpuNodePool"
    release = next(r for r in plan.of_type("helm.sh/v3:Release") if r.inputs["chart"] == "gpu-operator")
    assert patch.urn in release.dependencies
    # Protobuf carries numbers as floats; counts come back as ints, ratios stay floats.
    environment = plan.outputs["environment"]
    assert type(environment["physical_gpus"]) is int and type(environment["oversubscription"]) is float
    pilot = shipped("pilot")
    (pool,) = pilot.of_type("container/nodePool:NodePool")
    assert type(pool.inputs["nodeConfig"]["guestAccelerators"][0]["count"]) is int


def obj(body: dict[str, Any]) -> KubernetesObject:
    resource = PlannedResource(type="kubernetes:test", name="t", urn="urn:t", inputs=body)
    return KubernetesObject("c", resource, body)


def test_kubernetes_validate_catches_a_bad_built_in_object() -> None:
    good = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "n"}, "data": {"k": "v"}}
    assert validate_object(obj(good)) == []
    bad = {**good, "data": {"k": 1}, "extra": True}
    errors = validate_object(obj(bad))
    assert any("data.k" in e for e in errors) and any("extra" in e for e in errors)
    assert {v for v in KUBERNETES_VERSIONS if any(f"Kubernetes {v}" in e for e in errors)} == set(KUBERNETES_VERSIONS)
    unknown = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert any("no schema for Widget" in e for e in validate_object(obj(unknown)))


def test_crd_schemas_catch_bad_custom_resources() -> None:
    rule = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "r", "namespace": "m"},
            "spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up == 0"}]}]}}
    assert validate_object(obj(rule)) == []
    rule["spec"]["groups"][0]["rules"][0]["for"] = 5
    rule["spec"]["groups"][0]["rules"][0]["severity"] = "critical"  # belongs under labels: pruned silently
    errors = validate_object(obj(rule))
    assert any("rules.0.for" in e and "CRD" in e for e in errors)
    assert any("spec.groups[0].rules[0].severity: unknown field" in e for e in errors)


def test_the_preview_checks_the_kube_state_metrics_allowlist() -> None:
    plan = shipped("dev")
    assert check_node_label_allowlist(plan) == []
    rule = plan.of_type(":PrometheusRule")[0]
    spec = json.loads(json.dumps(rule.inputs["spec"]))
    spec["groups"][0]["rules"].append({"alert": "X", "expr": 'kube_node_labels{label_team_example_com_owner!=""}'})
    changed = Plan(plan.stack, [r if r is not rule else PlannedResource(
        r.type, r.name, r.urn, {**r.inputs, "spec": spec}, r.parent, r.dependencies, r.provider)
        for r in plan.resources], plan.outputs)
    (error,) = check_node_label_allowlist(changed)
    assert "label_team_example_com_owner" in error and "--metric-labels-allowlist" in error


def test_kubernetes_objects_exclude_releases_and_components() -> None:
    plan = shipped("dev")
    objects = kubernetes_objects(plan)
    assert {o.resource.type for o in objects}.isdisjoint(
        {"kubernetes:helm.sh/v3:Release", "pulumi:providers:kubernetes", "gpushare:nvidia:NvidiaStack"})
    assert all(o.body["apiVersion"] and o.body["kind"] and o.body["metadata"]["name"] for o in objects)


def test_warnings_are_printed_whole() -> None:
    result = preview("--env", "pilot")
    assert result.exit_code == 0
    assert "nodes=[gpushare.io/pool," in " ".join(result.stdout.split())


# ---------------------------------------------------------------- DRA (docs/dra.md)

DRA_EXAMPLE = ROOT / "examples" / "environments" / "dra.yaml"


def test_dra_kinds_are_checked_at_the_minors_that_serve_them() -> None:
    from gpushare.ops.preview import DRA_KUBERNETES_VERSIONS, versions_for

    assert versions_for("v1", KUBERNETES_VERSIONS) == KUBERNETES_VERSIONS
    assert versions_for("resource.k8s.io/v1", ("1.31", "1.33")) == DRA_KUBERNETES_VERSIONS == ("1.34", "1.37")
    assert versions_for("resource.k8s.io/v1", ("1.33", "1.35")) == ("1.34", "1.35", "1.37")


def test_the_shipped_dra_example_previews_clean(tmp_path: Path) -> None:
    result = preview("--env", str(DRA_EXAMPLE), "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    # The summary says at which minor each cluster's objects were checked: the cluster's own.
    assert "each cluster's Kubernetes minor, 1.37 (lab-dra), 1.37 (lab-plugin)" in " ".join(result.output.split())
    written = {p.name for p in (tmp_path / "out" / "manifests" / "lab-dra").iterdir()}
    assert "deviceclass-gpushare-exclusive.yaml" in written
    assert "resourceclaimtemplate-partner-eval-gpushare-mig-balanced-1g.10gb.yaml" in written
    assert not (tmp_path / "out" / "manifests" / "lab-plugin" / "deviceclass-gpushare-exclusive.yaml").exists()
    assert [p.name for p in (tmp_path / "out" / "helm-values" / "lab-dra").iterdir() if "dra" in p.name]


def test_a_bad_dra_object_fails_the_preview() -> None:
    plan = collect_plan(str(DRA_EXAMPLE))
    (obj,) = [o for o in kubernetes_objects(plan) if o.kind == "DeviceClass"
              and o.body["metadata"]["name"] == "gpushare-exclusive"]
    bad = KubernetesObject(obj.cluster, obj.resource, {**obj.body, "spec": {**obj.body["spec"], "selector": []}})
    errors = validate_object(bad)
    assert any("selector" in e and "1.34" in e for e in errors) and any("1.37" in e for e in errors)


# ---------------------------------------------------------------- the cluster's own Kubernetes minor


def test_objects_are_validated_against_their_clusters_minor() -> None:
    # The pod-group field was workloadRef in 1.35 and is schedulingGroup from 1.36: only the minor's own schema
    # says which one a cluster accepts.
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "n"},
           "spec": {"containers": [{"name": "c", "image": "i"}], "schedulingGroup": {"podGroupName": "g"}}}
    assert validate_object(obj(pod), ("1.37",)) == []
    assert any("schedulingGroup" in e and "Kubernetes 1.35" in e for e in validate_object(obj(pod), ("1.35",)))


@pytest.mark.parametrize(("version", "checked"), [("1.35", "1.35"), ("1.37", "1.37"), ("1.39", "1.37"),
                                                  ("1.33", "1.33")])
def test_the_preview_checks_each_cluster_at_its_kubernetes_version(version: str, checked: str) -> None:
    data = (ROOT / "environments" / "dev.yaml").read_text().replace('kubernetes_version: "1.36"',
                                                                     f'kubernetes_version: "{version}"')
    path = ROOT / "build" / f"test-preview-minor-{version}" / "dev.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data)
    try:
        result = run_preview(str(path))
    finally:
        path.unlink()
        path.parent.rmdir()
    assert result.ok, result.errors
    assert result.checked_at == {"dev-metal": checked}
    labels = next(o.body["metadata"]["labels"] for o in result.objects if o.kind == "Namespace"
                  and "pod-security.kubernetes.io/enforce-version" in o.body["metadata"].get("labels", {}))
    assert labels["pod-security.kubernetes.io/enforce-version"] == f"v{version}"
    outside = [w for w in result.plan.warnings if "minors gpushare supports" in w] if result.plan else []
    assert bool(outside) == (version in ("1.39", "1.33")), outside
