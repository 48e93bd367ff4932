"""`gpushare showback` against a real Prometheus (Debian's package, on 127.0.0.1) over backfilled histories: one
backfill and one server for the module, every scenario in its own six-hour slot (tests/showback/scenarios.py)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core.errors import GpushareError
from gpushare.ops.showback import ShowbackReport, run_showback
from tests.prometheus.server import prometheus_server
from tests.showback.scenarios import SCENARIOS, SLOT, backfill_all

WORKSPACE = Path(__file__).resolve().parents[1] / "fixtures"
FIRST_END = 1_767_225_600  # 2026-01-01 00:00 UTC, a multiple of the 5m step
TOLERANCE = 0.001  # the 0.1%


@pytest.fixture(scope="module", autouse=True)
def frozen_workspace_here() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GPUSHARE_ROOT", str(WORKSPACE))
        yield


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, int]]]:
    work = tmp_path_factory.mktemp("showback")
    data = work / "data"
    data.mkdir()
    ends = backfill_all(FIRST_END, work, data)
    with prometheus_server(data, work, retention="3650d") as url:
        yield url, ends


@pytest.fixture(scope="module")
def reports(server: tuple[str, dict[str, int]]) -> dict[str, ShowbackReport]:
    url, ends = server
    return {name: run_showback(str(env), url, "6h", float(ends[name]), source="raw")
            for name, (_build, env) in SCENARIOS.items()}


def _row(report: ShowbackReport, tenant: str, pool: str) -> Any:
    return next(r for r in report.rows if r.tenant == tenant and r.pool == pool)


def _physical(report: ShowbackReport, pool: str) -> float:
    """The pool's physical GPU-hours: what its tenants held plus its idle line."""
    return sum(r.allocated_gpu_hours for r in report.rows if r.pool == pool) + \
        next(i.gpu_hours for i in report.idle if i.pool == pool)


def close(a: float | None, b: float, tolerance: float = TOLERANCE) -> bool:
    return a is not None and abs(a - b) <= tolerance * max(abs(b), 1e-9)


@pytest.mark.slow  # a real Prometheus server over backfilled series
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_tenants_plus_idle_equal_the_physical_gpu_hours(reports: dict[str, ShowbackReport], scenario: str) -> None:
    report = reports[scenario]
    doc = report.as_dict()
    total = sum(r["allocated_gpu_hours"] for r in doc["rows"]) + sum(i["gpu_hours"] for i in doc["idle"])
    assert doc["physical_gpu_hours"] > 0
    assert close(total, doc["physical_gpu_hours"]), (scenario, total, doc["physical_gpu_hours"])
    assert all(i["gpu_hours"] >= -TOLERANCE for i in doc["idle"]), doc["idle"]


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_split_follows_each_sharing_kind(reports: dict[str, ShowbackReport]) -> None:
    report = reports["mixed"]
    assert close(report.coverage, 1.0, 0.02), report.coverage
    hours = SLOT / 3600
    research, search = _row(report, "research", "whole-pool"), _row(report, "search", "mig-pool")
    assert close(research.allocated_gpu_hours, hours)  # one whole GPU of two
    assert close(_physical(report, "whole-pool"), 2 * hours)
    assert close(search.allocated_gpu_hours, 3 / 7 * hours)  # 3g.40gb: 3 of the A100's 7 compute slices
    assert close(search.memory_gpu_hours, 4 / 8 * hours)  # ... and 4 of its 8 memory slices
    assert close(_row(report, "research", "mig-pool").allocated_gpu_hours, 1 / 7 * hours)
    assert close(next(i.gpu_hours for i in report.idle if i.pool == "mig-pool"), 3 / 7 * hours)
    assert close(_row(report, "notebooks", "ts-pool").allocated_gpu_hours, 3 / 4 * hours)  # 3 of 4 replicas
    assert close(_row(report, "inference", "mps-pool").allocated_gpu_hours, 2 / 4 * hours)  # 2 of 4 clients


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_used_hours_are_measured_where_dcgm_attributes_them_and_null_elsewhere(
        reports: dict[str, ShowbackReport]) -> None:
    report = reports["mixed"]
    hours = SLOT / 3600
    assert close(_row(report, "research", "whole-pool").used_gpu_hours, 0.6 * hours)
    assert close(_row(report, "search", "mig-pool").used_gpu_hours, 0.5 * 3 / 7 * hours)  # GR_ENGINE_ACTIVE x slices
    research_mig = _row(report, "research", "mig-pool")
    assert close(research_mig.used_gpu_hours, 0.2 * 1 / 7 * hours)
    # The exporter copies the device's busy share to every replica's pod: neither summed nor claimed per tenant.
    assert _row(report, "notebooks", "ts-pool").used_gpu_hours is None
    assert _row(report, "inference", "mps-pool").used_gpu_hours is None


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_mig_only_cluster(reports: dict[str, ShowbackReport]) -> None:
    report = reports["mig-only"]
    hours = SLOT / 3600
    assert close(report.physical_gpu_hours, hours)
    assert close(_row(report, "search", "mig-only-pool").allocated_gpu_hours, 5 / 7 * hours)  # 3g + 2g
    assert close(_row(report, "research", "mig-only-pool").allocated_gpu_hours, 2 / 7 * hours)  # 2 x 1g
    assert abs(report.idle[0].gpu_hours) < 0.01  # every instance held: the unused 8th memory slice has no compute
    assert close(_row(report, "search", "mig-only-pool").used_gpu_hours, 0.3 * 5 / 7 * hours)


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_pod_that_moves_between_pools_is_charged_in_each(reports: dict[str, ShowbackReport]) -> None:
    report = reports["pod-moves"]
    half = SLOT / 3600 / 2
    ts, whole = _row(report, "research", "ts-pool"), _row(report, "research", "whole-pool")
    assert close(ts.allocated_gpu_hours, half / 4, 0.03)  # a quarter GPU for half the window (± a step)
    assert ts.used_gpu_hours is None
    assert close(whole.allocated_gpu_hours, half, 0.03)
    assert close(whole.used_gpu_hours, 0.8 * half, 0.03)


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_tenant_with_no_usage_pays_for_its_allocation(reports: dict[str, ShowbackReport]) -> None:
    report = reports["no-usage"]
    row = _row(report, "research", "whole-pool")
    assert close(row.allocated_gpu_hours, 2 * SLOT / 3600)
    assert row.used_gpu_hours == 0.0  # measured as idle, not unknown


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_exporter_restart_neither_doubles_nor_drops_use(reports: dict[str, ShowbackReport]) -> None:
    report = reports["exporter-restart"]
    hours = SLOT / 3600
    row = _row(report, "research", "whole-pool")
    assert close(row.allocated_gpu_hours, hours)
    assert close(row.used_gpu_hours, 0.5 * hours)  # both exporters' series overlap: counted once
    assert close(report.physical_gpu_hours, 2 * hours)


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_gap_is_coverage_never_zero_use(reports: dict[str, ShowbackReport]) -> None:
    report = reports["gap"]
    row = _row(report, "research", "whole-pool")
    covered = 4 / 6  # four of six hours have data (± a step of staleness at each edge)
    assert abs(row.allocated_gpu_hours - covered * SLOT / 3600) < 0.2
    assert close(row.used_gpu_hours, 0.5 * row.allocated_gpu_hours)  # the gap lowers no one's busy share
    assert close(_physical(report, "whole-pool"), 2 * row.allocated_gpu_hours)
    # 5 GPUs planned for 6 h; only the whole pool's 2 reported, for 4 h (± the lookback after the last sample)
    assert close(report.coverage, 2 * 4 / (5 * 6), 0.05), report.coverage


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_cli_json_csv_chart_and_prices(server: tuple[str, dict[str, int]], tmp_path: Path) -> None:
    url, ends = server
    prices = tmp_path / "prices.yaml"
    prices.write_text("apiVersion: gpushare.io/v1\nkind: Prices\ncurrency: EUR\nhourly:\n"
                      "  NVIDIA H100 80GB HBM3: 3.0\n  A100-SXM4-80GB: 2.0\n  L4: 0.5\n"
                      "environments:\n  showback-test:\n    hourly: {L4: 0.8}\n")
    out_csv, chart = tmp_path / "showback.csv", tmp_path / "showback.png"
    result = CliRunner().invoke(app, ["showback", "--env", str(SCENARIOS["mixed"][1]), "--prometheus", url,
                                      "--window", "6h", "--end", str(ends["mixed"]), "--prices", str(prices),
                                      "--json", "--csv", str(out_csv), "--chart", str(chart)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert list(doc) == ["ok", "environment", "window", "physical_gpu_hours", "coverage", "rows", "idle"]
    assert list(doc["rows"][0]) == ["tenant", "pool", "model", "sharing", "allocated_gpu_hours", "used_gpu_hours",
                                    "cost"]
    nb = next(r for r in doc["rows"] if r["tenant"] == "notebooks")
    assert close(nb["cost"], nb["allocated_gpu_hours"] * 0.8)  # the environment's override
    whole_idle = next(i for i in doc["idle"] if i["pool"] == "whole-pool")
    assert close(whole_idle["cost"], whole_idle["gpu_hours"] * 3.0)
    rows = list(csv.DictReader(out_csv.open()))
    assert {r["tenant"] for r in rows} == {"research", "search", "notebooks", "inference", "(idle)"}
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_without_prices_it_reports_gpu_hours_only_grouped_by_model(server: tuple[str, dict[str, int]],
                                                                   tmp_path: Path) -> None:
    url, ends = server
    out_csv = tmp_path / "by-model.csv"
    result = CliRunner().invoke(app, ["showback", "--env", str(SCENARIOS["mixed"][1]), "--prometheus", url,
                                      "--window", "6h", "--end", str(ends["mixed"]), "--by", "model",
                                      "--csv", str(out_csv)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "allocation only" in result.output
    rows = {r["model"]: r for r in csv.DictReader(out_csv.open()) if r["tenant"] != "(idle)"}
    assert set(rows) == {"NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L4"}
    hours = SLOT / 3600
    assert close(float(rows["NVIDIA L4"]["allocated_gpu_hours"]), (3 / 4 + 2 / 4) * hours)  # ts and MPS together
    assert rows["NVIDIA L4"]["used_gpu_hours"] == "" and rows["NVIDIA L4"]["cost"] == ""


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_auto_reads_raw_series_where_no_recording_rules_ran(server: tuple[str, dict[str, int]]) -> None:
    url, ends = server
    env = str(SCENARIOS["mixed"][1])
    auto = run_showback(env, url, "6h", float(ends["mixed"]))
    assert auto.source == "raw" and auto.coverage > 0.99
    # valid PromQL, no history: refused, not 0.0 GPU-hours, and the message says what is missing
    with pytest.raises(GpushareError, match="recording rules have not run") as err:
        run_showback(env, url, "6h", float(ends["mixed"]), source="recorded")
    assert "--source raw" in str(err.value)


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_use_basis_splits_a_shared_gpu_by_measured_sm_use(server: tuple[str, dict[str, int]]) -> None:
    """notebooks' pod took 70% of the L4's SM time and research's 5%, each holding one of four replicas: by use
    notebooks pays 70% of the hours plus a quarter of the unused 25%, research 5% plus a quarter, idle the half of
    the unused time nobody held; by allocation each pays a quarter. Both add up to the physical GPU-hours."""
    url, ends = server
    env, hours = str(SCENARIOS["shared-use"][1]), SLOT / 3600
    by_use = run_showback(env, url, "6h", float(ends["shared-use"]), source="raw", basis="use")
    by_allocation = run_showback(env, url, "6h", float(ends["shared-use"]), source="raw")
    rest = (1 - 0.7 - 0.05) * hours
    nb, research = _row(by_use, "notebooks", "ts-pool"), _row(by_use, "research", "ts-pool")
    assert close(nb.sm_gpu_hours, 0.7 * hours) and close(research.sm_gpu_hours, 0.05 * hours)
    assert close(nb.gpu_hours, 0.7 * hours + rest / 4), nb
    assert close(research.gpu_hours, 0.05 * hours + rest / 4), research
    assert close(next(i.gpu_hours for i in by_use.idle if i.pool == "ts-pool"), rest / 2)
    for report in (by_use, by_allocation):
        total = sum(r.gpu_hours for r in report.rows) + sum(i.gpu_hours for i in report.idle)
        assert close(total, report.physical_gpu_hours) and close(report.physical_gpu_hours, hours)
    assert close(_row(by_allocation, "notebooks", "ts-pool").gpu_hours, hours / 4)
    doc = by_use.as_dict()
    assert doc["basis"] == "use" and {"sm_gpu_hours", "gpu_hours"} <= set(doc["rows"][0])


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_use_basis_without_process_exporter_series_fails_naming_the_role(server: tuple[str, dict[str, int]]) -> None:
    url, ends = server  # the mixed scenario's window has DCGM and kube-state-metrics series, none of the exporter's
    with pytest.raises(GpushareError, match="gpushare_pod_gpu_sm_utilization_ratio") as err:
        run_showback(str(SCENARIOS["mixed"][1]), url, "6h", float(ends["mixed"]), basis="use")
    assert "gpu_process_exporter" in str(err.value)


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_cli_use_basis_table_and_csv(server: tuple[str, dict[str, int]], tmp_path: Path) -> None:
    url, ends = server
    out_csv = tmp_path / "use.csv"
    args = ["showback", "--env", str(SCENARIOS["shared-use"][1]), "--prometheus", url, "--window", "6h",
            "--end", str(ends["shared-use"]), "--source", "raw", "--basis", "use"]
    table = CliRunner().invoke(app, [*args, "--csv", str(out_csv)], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "charged by use" in table.output and "SM use" in table.output
    rows = list(csv.DictReader(out_csv.open()))
    nb = next(r for r in rows if r["tenant"] == "notebooks")
    assert close(float(nb["sm_gpu_hours"]), 0.7 * SLOT / 3600) and float(nb["gpu_hours"]) > float(nb["sm_gpu_hours"])
    total = sum(float(r["gpu_hours"]) for r in rows)
    assert close(total, SLOT / 3600)
