"""gpushare's Prometheus rules under the real promtool: `check rules` on every shipped environment's rendered file,
and `test rules` on tests/promtool/ (every alert fires in one case and stays silent in another; every recording rule
produces its value in one case and nothing in another). What the rules read without promtool:
tests/unit/render/monitoring/test_rules.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.guardrails import load_guardrails
from gpushare.core.resolve import ResolvedFleet, resolve, resolve_env
from gpushare.render.monitoring import (
    prometheus_rule_groups,
    prometheus_rules_file,
)
from gpushare.render.monitoring.promql import metric_names
from tests.conftest import PROFILES
from tests.prometheus.promtool import MONITORING_ENV, render_tests, run_promtool

pytestmark = pytest.mark.usefixtures("frozen_workspace")  # GPUSHARE_ROOT: the frozen workspace, as in tests/unit


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
