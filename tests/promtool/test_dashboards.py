"""Grafana dashboards under the real promtool: every panel's PromQL passes `promtool check rules` (dashboard
variables substituted, each expression wrapped in a temporary recording rule), and a broken one fails it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.resolve import resolve_env
from gpushare.render.monitoring import dashboards
from gpushare.render.monitoring.grafana import panel_queries
from gpushare.render.monitoring.promql import substitute_variables
from tests.prometheus.promtool import run_promtool

pytestmark = pytest.mark.usefixtures("frozen_workspace")  # GPUSHARE_ROOT: the frozen workspace, as in tests/unit


# What Grafana puts in place of each variable: an "All" selection and its built-in intervals.
VARIABLES = {"pool": ".*", "tenant": ".*", "node": ".*", "__rate_interval": "5m", "__interval": "1m",
             "datasource": "prometheus"}


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
