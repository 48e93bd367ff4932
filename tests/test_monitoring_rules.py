"""gpushare's Prometheus rules under the real promtool: `check rules` on every shipped environment's rendered file,
`test rules` on tests/promtool/ (every alert fires in one case and stays silent in another; every recording rule
produces its value in one case and nothing in another), and the PrometheusRule object against the
prometheus-operator CRD schema."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpushare.core.guardrails import load_guardrails
from gpushare.core.resolve import ResolvedFleet, resolve, resolve_env
from gpushare.render.monitoring import (
    kube_state_metrics_label_allowlist,
    prometheus_rule,
    prometheus_rule_groups,
    prometheus_rules_file,
)
from gpushare.render.monitoring.fields import REQUIRED_FIELDS, exported_fields
from gpushare.render.monitoring.promql import ksm_label, metric_names
from gpushare.render.monitoring.rules import KUBE_STATE_METRICS, KUEUE_METRICS, PROMOTION_NODE_LABELS
from tests.conftest import PROFILES, WORKSPACE
from tests.prometheus.promtool import MONITORING_ENV, render_tests, run_promtool

ROOT = Path(__file__).resolve().parents[1]
CRD = Path(__file__).resolve().parent / "prometheus" / "crd-monitoring.coreos.com_prometheusrules.yaml"


@pytest.fixture(scope="module")
def fleet() -> ResolvedFleet:
    return resolve(MONITORING_ENV, PROFILES)


@pytest.fixture(scope="module")
def groups(fleet: ResolvedFleet) -> list[dict[str, Any]]:
    return prometheus_rule_groups(fleet, load_guardrails())


@pytest.fixture(scope="module")
def promtool_dir(tmp_path_factory: pytest.TempPathFactory, fleet: ResolvedFleet, groups: list[dict[str, Any]]
                 ) -> tuple[Path, dict[str, dict[str, Any]]]:
    out = tmp_path_factory.mktemp("promtool")
    (out / "rules.yaml").write_text(prometheus_rules_file(fleet, load_guardrails()))
    fractions = {r["labels"]["GPU_I_PROFILE"]: float(r["expr"][len("vector("):-1])
                 for g in groups for r in g["rules"]
                 if r.get("record") == "gpushare:unit_compute:ratio" and "GPU_I_PROFILE" in r.get("labels", {})}
    return out, render_tests(groups, load_guardrails(), fractions, out)


def _rules(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for g in groups for r in g["rules"]]


def test_promtool_unit_tests_pass(promtool_dir: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    out, tests = promtool_dir
    result = run_promtool("test", "rules", *sorted(tests), cwd=out)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(tests)


def test_a_wrong_expectation_fails_under_promtool(promtool_dir: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    """The harness would notice a rule that computes something else: flip one expected value."""
    out, tests = promtool_dir
    data = tests["recording.test.yaml"]
    broken = yaml.safe_load(yaml.safe_dump(data))
    cases = broken["tests"][0]["promql_expr_test"]
    case = next(c for c in cases if c["expr"] == "gpushare:pool_oversubscription:ratio")
    case["exp_samples"][1]["value"] = 2
    (out / "broken.yaml").write_text(yaml.safe_dump(broken, sort_keys=False))
    result = run_promtool("test", "rules", "broken.yaml", cwd=out)
    assert result.returncode == 1
    assert "gpushare:pool_oversubscription:ratio" in result.stdout + result.stderr


def test_every_alert_fires_in_one_case_and_not_in_another(
        groups: list[dict[str, Any]], promtool_dir: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    _, tests = promtool_dir
    fires: set[str] = set()
    silent: set[str] = set()
    for data in tests.values():
        for test in data["tests"]:
            for case in test.get("alert_rule_test", []):
                (fires if case.get("exp_alerts") else silent).add(case["alertname"])
    alerts = {r["alert"] for r in _rules(groups) if "alert" in r}
    assert alerts - fires == set(), "alerts without a firing promtool case"
    assert alerts - silent == set(), "alerts without a silent promtool case"


def test_every_recording_rule_is_tested_both_ways(
        groups: list[dict[str, Any]], promtool_dir: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    _, tests = promtool_dir
    produces: set[str] = set()
    empty: set[str] = set()
    for data in tests.values():
        for test in data["tests"]:
            for case in test.get("promql_expr_test", []):
                for name in metric_names(case["expr"]):
                    (produces if case["exp_samples"] else empty).add(name)
    records = {r["record"] for r in _rules(groups) if "record" in r}
    dynamic = {r["record"] for r in _rules(groups) if "record" in r and not r["expr"].startswith("vector(")}
    dynamic -= {"gpushare:pool_pending:sum"}  # 0 per pool when nothing waits: its promtool case checks the 0s
    assert records - produces == set(), "recording rules without a promtool case that checks their value"
    assert dynamic - empty == set(), "recording rules without a promtool case where they produce nothing"


@pytest.mark.parametrize("env", ["dev", "pilot", "prod"])
def test_shipped_environments_pass_promtool_check_rules(tmp_path: Path, env: str, shipped_workspace: Path) -> None:
    fleet = resolve_env(env)
    files = []
    for cluster in fleet.clusters:
        path = tmp_path / f"{cluster}.yaml"
        path.write_text(prometheus_rules_file(fleet, load_guardrails(), cluster))
        files.append(path.name)
    result = run_promtool("check", "rules", *files, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_check_rules_rejects_a_broken_expression(tmp_path: Path, fleet: ResolvedFleet) -> None:
    text = prometheus_rules_file(fleet, load_guardrails()).replace("avg by (pool) (", "avg by (pool (", 1)
    (tmp_path / "rules.yaml").write_text(text)
    result = run_promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert result.returncode == 1


def test_rendered_rules_file_is_the_prometheus_rule_spec(fleet: ResolvedFleet) -> None:
    g = load_guardrails()
    text = prometheus_rules_file(fleet, g, "test-metal")
    assert yaml.safe_load(text) == {"groups": prometheus_rule_groups(fleet, g, "test-metal")}


@pytest.mark.parametrize("env", ["dev", "pilot", "prod"])
def test_prometheus_rule_validates_against_the_operator_crd(env: str) -> None:
    crd = yaml.safe_load(CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = version["schema"]["openAPIV3Schema"]
    fleet = resolve_env(env)
    for cluster in fleet.clusters:
        obj = prometheus_rule(fleet, load_guardrails(), cluster, labels={"release": "kube-prometheus-stack"})
        _validator(schema).validate(obj)


def _validator(schema: dict[str, Any]) -> jsonschema.Draft7Validator:
    # No check_schema: the CRD's Go patterns use (?i) mid-pattern, which Python's re rejects; gpushare sets
    # none of those fields, and every pattern it does meet compiles.
    return jsonschema.Draft7Validator(schema)


def test_the_crd_schema_catches_a_bad_rule(fleet: ResolvedFleet) -> None:
    crd = yaml.safe_load(CRD.read_text())
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]
    obj = prometheus_rule(fleet, load_guardrails())
    obj["spec"]["groups"][1]["rules"][0]["for"] = "ten minutes"
    with pytest.raises(jsonschema.ValidationError):
        _validator(schema).validate(obj)


def test_rules_read_only_exported_or_recorded_metrics(groups: list[dict[str, Any]]) -> None:
    exported = {f.name for f in exported_fields()}
    recorded = {r["record"] for r in _rules(groups) if "record" in r}
    known = exported | recorded | KUBE_STATE_METRICS | KUEUE_METRICS
    for rule in _rules(groups):
        unknown = metric_names(rule["expr"]) - known
        assert not unknown, f"{rule.get('record') or rule.get('alert')} reads {sorted(unknown)}"
    assert REQUIRED_FIELDS <= exported


def test_thresholds_come_from_the_policy(fleet: ResolvedFleet) -> None:
    g = load_guardrails()
    changed = g.model_copy(update={"monitoring": g.monitoring.model_copy(update={"gpu_temperature_celsius": 77.0,
                                                                                 "memory_full_for": "42m"})})
    alerts = {r["alert"]: r for r in _rules(prometheus_rule_groups(fleet, changed)) if "alert" in r}
    assert alerts["GpushareGpuTemperatureHigh"]["expr"].endswith("> 77")
    assert alerts["GpushareGpuMemoryNearlyFull"]["for"] == "42m"


def test_kube_state_metrics_allowlist_covers_every_node_label_the_rules_read(groups: list[dict[str, Any]]) -> None:
    allowlist = kube_state_metrics_label_allowlist()
    read = set()
    for rule in _rules(groups):
        read |= set(re.findall(r"\b(label_[a-z0-9_]+)\b(?!\s*\()", rule["expr"]))
    # The rest is what `gpushare promote` reads (test_promote.py shows its queries read them).
    assert read | {ksm_label(label) for label in PROMOTION_NODE_LABELS} == {ksm_label(label) for label in allowlist}


def test_gke_managed_pools_are_not_expected_to_export_dcgm() -> None:
    fleet = resolve_env("pilot")
    groups = prometheus_rule_groups(fleet, load_guardrails(), "pilot-gke")
    alerts = {r["alert"] for r in _rules(groups) if "alert" in r}
    assert "GpushareDcgmExporterAbsent" not in alerts and "GpushareDcgmExporterMissingOnNode" not in alerts
    metal = {r["alert"] for r in _rules(prometheus_rule_groups(fleet, load_guardrails(), "pilot-metal"))
             if "alert" in r}
    assert {"GpushareDcgmExporterAbsent", "GpushareDcgmExporterMissingOnNode"} <= metal


def test_render_writes_the_monitoring_files() -> None:
    from gpushare.render.fleet import render_fleet
    from gpushare.render.monitoring.fields import parse_counters

    fleet = resolve_env("pilot")
    files = render_fleet(fleet).files
    assert {"monitoring/pilot-metal/prometheus-rules.yaml", "monitoring/pilot-gke/prometheus-rules.yaml",
            "monitoring/dashboards/gpushare-overview.json"} <= set(files)
    csv = files["monitoring/dcgm-exporter-counters.csv"]
    assert REQUIRED_FIELDS <= {f.name for f in parse_counters(csv)}
    assert "--kubernetes-virtual-gpus" in csv  # pilot time-slices L40S notebooks


@pytest.mark.parametrize(("section", "key", "value", "text"), [
    ("monitoring", "temperature_for", "5 minutes", "should match pattern"),
    ("monitoring", "memory_full_ratio", 1.5, "less than 1"),
    ("capacity", "target_utilization", 0.95, "above capacity.max_p95_utilization"),
    ("capacity", "start_ratio", 0.5, "greater than or equal to 1"),
    ("capacity", "step", "5", "should match pattern"),
])
def test_bad_monitoring_and_capacity_policy_is_an_error(tmp_path: Path, section: str, key: str, value: Any,
                                                        text: str) -> None:
    from gpushare.core.errors import GpushareError

    data = yaml.safe_load((WORKSPACE / "policies" / "guardrails.yaml").read_text())
    data[section][key] = value
    path = tmp_path / "guardrails.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(GpushareError) as info:
        load_guardrails(path)
    assert any(text in str(p) for p in info.value.problems), [str(p) for p in info.value.problems]


def test_pending_demand_counts_once_in_the_pools_that_can_run_it(tmp_path: Path) -> None:
    """tests/promtool/attribution/: a queue reaching four pools, a MIG instance two pools have, pods pinned by their
    gpushare.io/pool node selector; the contended alert fires only where the demand is."""
    fleet = resolve(MONITORING_ENV.parent / "attribution-test.yaml", PROFILES)
    (tmp_path / "rules.yaml").write_text(prometheus_rules_file(fleet, load_guardrails()))
    test = ROOT / "tests" / "promtool" / "attribution" / "attribution.test.yaml"
    (tmp_path / test.name).write_text(test.read_text())
    result = run_promtool("test", "rules", test.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
