"""gpushare's Prometheus rules (gpushare.render.monitoring): the PrometheusRule object against the
prometheus-operator CRD schema, metrics read only where exported or recorded, thresholds from the policy, the
kube-state-metrics allowlist, and the monitoring files `render` writes. The rules under the real promtool:
tests/promtool/test_rules.py."""

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
from gpushare.render.monitoring.expressions import (
    KUBE_STATE_METRICS,
    KUEUE_METRICS,
    PROCESS_EXPORTER_METRICS,
    PROMOTION_NODE_LABELS,
)
from gpushare.render.monitoring.fields import REQUIRED_FIELDS, exported_fields
from gpushare.render.monitoring.promql import ksm_label, metric_names
from tests.conftest import PROFILES, ROOT, WORKSPACE
from tests.prometheus.promtool import MONITORING_ENV, run_promtool

CRD = ROOT / "tests" / "prometheus" / "crd-monitoring.coreos.com_prometheusrules.yaml"


@pytest.fixture(scope="module")
def fleet() -> ResolvedFleet:
    return resolve(MONITORING_ENV, PROFILES)


@pytest.fixture(scope="module")
def groups(fleet: ResolvedFleet) -> list[dict[str, Any]]:
    return prometheus_rule_groups(fleet, load_guardrails())


def _rules(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for g in groups for r in g["rules"]]


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
    known = exported | recorded | KUBE_STATE_METRICS | KUEUE_METRICS | PROCESS_EXPORTER_METRICS
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
    # The rest is what `gpushare promote` reads (tests/unit/ops/test_promote.py shows its queries read them).
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


def test_shared_gpu_alerts_take_their_thresholds_from_the_policy(fleet: ResolvedFleet) -> None:
    g = load_guardrails()
    assert (g.monitoring.noisy_neighbour_share, g.monitoring.idle_allocation_for) == (0.8, "3d")
    changed = g.model_copy(update={"monitoring": g.monitoring.model_copy(update={
        "noisy_neighbour_share": 0.6, "noisy_neighbour_for": "30m", "idle_allocation_ratio": 0.05,
        "idle_allocation_for": "7d"})})
    alerts = {r["alert"]: r for r in _rules(prometheus_rule_groups(fleet, changed)) if "alert" in r}
    assert "gpushare:gpu_tenant_sm_share:ratio >= 0.6" in alerts["GpushareNoisyNeighbour"]["expr"]
    assert alerts["GpushareNoisyNeighbour"]["for"] == "30m"
    assert alerts["GpushareIdleGpuAllocation"]["expr"].endswith("< 0.05)")
    assert alerts["GpushareIdleGpuAllocation"]["for"] == "7d"
    # Where no pool time-slices or uses MPS, nothing expects the process exporter to run.
    whole = [p for p in fleet.pools if p.sharing not in ("time-slicing", "mps")]
    names = {r["alert"] for g_ in alert_groups_for(fleet, whole) for r in g_["rules"] if "alert" in r}
    assert "GpushareProcessExporterAbsent" not in names and "GpushareProcessExporterDown" in names


def alert_groups_for(fleet: ResolvedFleet, pools: list[Any]) -> list[dict[str, Any]]:
    from gpushare.render.monitoring.alerts import alert_groups

    return alert_groups(fleet, load_guardrails(), pools, {"environment": fleet.environment})
