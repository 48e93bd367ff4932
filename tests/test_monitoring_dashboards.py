"""Grafana dashboards: every panel's PromQL passes `promtool check rules` (dashboard variables substituted, each
expression wrapped in a temporary recording rule) and reads only metrics that are exported or recorded."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.guardrails import load_guardrails
from gpushare.core.resolve import ResolvedFleet, resolve_env
from gpushare.render.monitoring import dashboards, prometheus_rule_groups
from gpushare.render.monitoring.fields import exported_fields
from gpushare.render.monitoring.grafana import panel_queries, variable_queries
from gpushare.render.monitoring.promql import metric_names, substitute_variables
from gpushare.render.monitoring.rules import KUBE_STATE_METRICS, KUEUE_METRICS
from tests.conftest import PROFILES
from tests.prometheus.promtool import run_promtool

# What Grafana puts in place of each variable: an "All" selection and its built-in intervals.
VARIABLES = {"pool": ".*", "tenant": ".*", "node": ".*", "__rate_interval": "5m", "__interval": "1m",
             "datasource": "prometheus"}


def _known_metrics(fleet: ResolvedFleet) -> set[str]:
    recorded = {r["record"] for g in prometheus_rule_groups(fleet, load_guardrails()) for r in g["rules"]
                if "record" in r}
    return recorded | {f.name for f in exported_fields()} | KUBE_STATE_METRICS | KUEUE_METRICS


def _checked_rules(boards: dict[str, dict[str, Any]]) -> dict[str, Any]:
    rules = []
    for name, board in sorted(boards.items()):
        for i, (title, expr) in enumerate(panel_queries(board)):
            rules.append({"record": f"dashboard_check:{re.sub(r'[^a-z0-9]+', '_', name)}:{i}",
                          "expr": substitute_variables(expr, VARIABLES),
                          "labels": {"panel": title}})
    return {"groups": [{"name": "dashboard-panels", "rules": rules}]}


@pytest.mark.parametrize("env", ["dev", "pilot", "prod"])
def test_every_panel_query_passes_promtool(tmp_path: Path, env: str) -> None:
    boards = dashboards(resolve_env(env))
    rules = _checked_rules(boards)
    assert len(rules["groups"][0]["rules"]) >= 30
    (tmp_path / "panels.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    result = run_promtool("check", "rules", "panels.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_broken_panel_query_fails_promtool(tmp_path: Path) -> None:
    boards = dashboards(resolve_env("dev"))
    boards["gpushare-overview.json"]["panels"][1]["targets"][0]["expr"] = "sum(gpushare:pool_physical_gpus:planned{"
    (tmp_path / "panels.yaml").write_text(yaml.safe_dump(_checked_rules(boards), sort_keys=False))
    assert run_promtool("check", "rules", "panels.yaml", cwd=tmp_path).returncode == 1


@pytest.mark.parametrize("env", ["dev", "pilot", "prod"])
def test_panels_read_only_exported_or_recorded_metrics(env: str) -> None:
    fleet = resolve_env(env)
    known = _known_metrics(fleet)
    for name, board in dashboards(fleet).items():
        for title, expr in panel_queries(board):
            unknown = metric_names(expr) - known
            assert not unknown, f"{name}: panel {title!r} reads {sorted(unknown)}"
        for variable, query in variable_queries(board):
            match = re.fullmatch(r"label_values\((\w[\w:]*)(\{.*\})?, *(\w+)\)", query)
            assert match, f"{name}: variable {variable} has an unexpected query {query!r}"
            assert match.group(1) in known, f"{name}: variable {variable} reads {match.group(1)}"


def test_the_metric_check_would_catch_a_typo() -> None:
    known = _known_metrics(resolve_env("dev"))
    assert metric_names('sum by (pool) (gpushare:pool_utilisation:ratio{pool=~"x"})') - known == {
        "gpushare:pool_utilisation:ratio"}


def test_dashboards_are_sharing_aware() -> None:
    dev = dashboards(resolve_env("dev"))
    assert set(dev) == {"gpushare-overview.json", "gpushare-tenants.json", "gpushare-health.json",
                        "gpushare-mig.json", "gpushare-showback.json"}
    titles = {title for _, board in dev.items() for title, _ in panel_queries(board)}
    assert {"Advertised, hardware units and physical GPUs per pool", "Utilization per pool", "Memory per replica",
            "Admission wait (p90)", "Utilization per MIG profile", "Last XID per GPU"} <= titles
    for name, board in dev.items():
        assert board["uid"].endswith("-dev") and len(board["uid"]) <= 40, name
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), f"{name}: panel ids repeat"


def test_fleet_without_mig_or_sharing_gets_no_mig_dashboard_or_replica_panel(dev_data: dict[str, Any],
                                                                            write_env: Any) -> None:
    from gpushare.core.resolve import resolve

    dev_data["pools"] = [p for p in dev_data["pools"] if p["profile"] == "exclusive"]
    dev_data["tenants"] = [t for t in dev_data["tenants"] if "nvidia.com/gpu" in t["quota"]]
    boards = dashboards(resolve(write_env(dev_data), PROFILES))
    assert "gpushare-mig.json" not in boards
    titles = {title for title, _ in panel_queries(boards["gpushare-overview.json"])}
    assert "Memory per replica" not in titles
