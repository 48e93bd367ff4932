"""Grafana dashboards (gpushare.render.monitoring.grafana): panels read only metrics that are exported or recorded,
and the dashboards follow the fleet's sharing (their PromQL under the real promtool:
tests/promtool/test_dashboards.py)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from gpushare.core.guardrails import load_guardrails
from gpushare.core.resolve import ResolvedFleet, resolve_env
from gpushare.render.monitoring import dashboards, prometheus_rule_groups
from gpushare.render.monitoring.expressions import KUBE_STATE_METRICS, KUEUE_METRICS, PROCESS_EXPORTER_METRICS
from gpushare.render.monitoring.fields import exported_fields
from gpushare.render.monitoring.grafana import panel_queries, variable_queries
from gpushare.render.monitoring.promql import metric_names
from tests.conftest import PROFILES


def _known_metrics(fleet: ResolvedFleet) -> set[str]:
    recorded = {r["record"] for g in prometheus_rule_groups(fleet, load_guardrails()) for r in g["rules"]
                if "record" in r}
    return (recorded | {f.name for f in exported_fields()} | KUBE_STATE_METRICS | KUEUE_METRICS
            | PROCESS_EXPORTER_METRICS)


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
                        "gpushare-mig.json", "gpushare-showback.json", "gpushare-shared-gpus.json"}
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
    assert "gpushare-mig.json" not in boards and "gpushare-shared-gpus.json" not in boards
    titles = {title for title, _ in panel_queries(boards["gpushare-overview.json"])}
    assert "Memory per replica" not in titles


def test_shared_gpu_dashboard_shows_who_uses_a_shared_gpu() -> None:
    """Per pod and tenant on time-sliced and MPS GPUs, from the per-process exporter's recording rules; only for
    fleets that share GPUs."""
    fleet = resolve_env("pilot")
    board = dashboards(fleet)["gpushare-shared-gpus.json"]
    queries = dict(panel_queries(board))
    assert "gpushare:pod_gpu_sm_utilization_ratio:avg5m" in queries["SM use per pod, per GPU"]
    assert "gpushare:gpu_tenant_sm_utilization_ratio:avg5m" in queries["SM use per tenant, per GPU"]
    assert "gpushare:pod_gpu_memory_used_bytes:avg5m" in queries["GPU memory per pod"]
    assert "gpushare:pod_gpu_allocated_shares:sum" in queries["Idle allocations per pod"]
    assert {name for name, _ in variable_queries(board)} == {"pool", "tenant", "node"}
    unshared = dataclasses.replace(fleet, pools=[p for p in fleet.pools if p.sharing not in ("time-slicing", "mps")])
    assert "gpushare-shared-gpus.json" not in dashboards(unshared)
