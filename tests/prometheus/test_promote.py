"""`gpushare promote` against a real Prometheus (Debian's package, on 127.0.0.1) holding backfilled pilot histories:
kube-state-metrics node labels, dcgm-exporter series and Kueue's admission-wait histogram. Each history has its own
time span in one TSDB, and `--at` picks it: a healthy 20 days passes and writes the patch; a profile that ran 7 days,
an XID, a failed MIG reconfiguration, low utilization, long queue waits and ECC errors each fail their gate."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core.guardrails import load_guardrails
from gpushare.core.resolve import resolve
from gpushare.ops.prometheus import Prometheus
from gpushare.ops.promote import health_gates
from tests.conftest import ENVIRONMENTS, PROFILES, WORKSPACE
from tests.prometheus.promote_history import DAY, NEW_PROFILE, History, backfill, promotion_root
from tests.prometheus.server import prometheus_server

pytestmark = [pytest.mark.slow,  # a real Prometheus server over backfilled histories
              pytest.mark.usefixtures("frozen_workspace")]
QUEUES = ("tenant-search", "tenant-notebooks")
runner = CliRunner()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return promotion_root(tmp_path_factory.mktemp("project"), WORKSPACE)


@pytest.fixture(scope="module")
def histories(root: Path) -> dict[str, History]:
    pilot = resolve(root / "environments" / "pilot.yaml", root / "profiles")
    before = resolve(ENVIRONMENTS / "pilot.yaml", PROFILES)
    end = (int(time.time()) // DAY - 2) * DAY
    out: dict[str, History] = {}

    def add(name: str, days: float, **kw: Any) -> None:
        nonlocal end
        out[name] = History(pilot, end, days, QUEUES, **kw)
        end -= int((days + 2) * DAY)

    add("healthy", 20)
    # l40s-notebooks ran notebooks-ts4 (prod's profile) until 7 days ago, notebooks-ts2 since.
    add("seven-days", 20, before=before, switch=end - 7 * DAY)
    add("xid", 16, xids=((end - 3 * DAY, "pilot-h100-02", 79),))
    add("mig-failed", 16, mig_failed=(end - 2 * DAY, end - 2 * DAY + 7200, "pilot-a100-01"))
    add("low-utilization", 16, shared_util=0.15)
    add("queue", 16, wait_seconds=1800)
    add("ecc-and-app-xid", 16, ecc_dbe=((end - 5 * DAY, "pilot-l40s-01"),),
        xids=((end - 4 * DAY, "pilot-a100-02", 13),))
    # pilot-h100-02's exporter was silent for two days inside the 14-day window (it reported before and after).
    add("gap", 16, dcgm_gap=(end - 6 * DAY, end - 4 * DAY, "pilot-h100-02"))
    return out


@pytest.fixture(scope="module")
def prometheus(histories: dict[str, History], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("promote-prometheus")
    data = work / "data"
    data.mkdir()
    backfill(list(histories.values()), work, data)
    with prometheus_server(data, work, retention="400d") as url:
        yield url


def promote(root: Path, *args: str) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["promote", "--from", "pilot", "--to", "prod", "--no-plan", "--json", *args],
                           env={"GPUSHARE_ROOT": str(root)})
    assert result.exit_code in (0, 1), result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return result.exit_code, data


@pytest.fixture(scope="module")
def reports(root: Path, prometheus: str, histories: dict[str, History], tmp_path_factory: pytest.TempPathFactory
            ) -> dict[str, tuple[int, dict[str, Any]]]:
    out = tmp_path_factory.mktemp("patches")
    return {name: promote(root, "--prometheus", prometheus, "--at", str(h.end), "--patch", str(out / f"{name}.patch"))
            for name, h in histories.items()}


def gates(report: dict[str, Any], gate: str) -> list[dict[str, Any]]:
    found = [g for g in report["gates"] if g["gate"] == gate]
    assert found, gate
    return found


def failing(report: dict[str, Any]) -> set[str]:
    return {g["gate"] for g in report["gates"] if not g["passed"]}


def test_healthy_history_passes_and_writes_the_patch(reports: dict[str, tuple[int, dict[str, Any]]], root: Path,
                                                     tmp_path: Path) -> None:
    code, report = reports["healthy"]
    assert code == 0 and report["ok"], [g for g in report["gates"] if not g["passed"]]
    run = {g["item"].split("\n")[0]: g for g in gates(report, "run-time")}
    profile = next(g for item, g in run.items() if item.startswith(f"profile {NEW_PROFILE} ("))
    assert profile["measured"].startswith("20.0 d")
    assert run["driver branch R580 on NVIDIA L4"]["measured"] == "-"  # GKE-managed: said, not measured
    assert float(gates(report, "utilization-uplift")[0]["measured"].split("x")[0]) >= 1.5
    assert report["changes"] == [{"path": "pools.l40s-notebooks.profile", "from": "notebooks-ts4",
                                  "to": NEW_PROFILE}]
    patch = Path(report["patch"]).read_text()
    assert "+++ b/environments/prod.yaml" in patch and f"+    profile: {NEW_PROFILE}" in patch
    # Nothing was applied; the patch applies to a copy and the result resolves with pilot's profile.
    prod = root / "environments" / "prod.yaml"
    assert prod.read_text() == (ENVIRONMENTS / "prod.yaml").read_text().replace(
        "nvidia.com/gpu.shared: 32", "nvidia.com/gpu.shared: 16")  # as promotion_root wrote it
    (tmp_path / "environments").mkdir()
    (tmp_path / "environments" / "prod.yaml").write_text(prod.read_text())
    applied = subprocess.run(["patch", "-p1", "--no-backup-if-mismatch"], input=patch, cwd=tmp_path, text=True,
                             capture_output=True, check=False)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    fleet = resolve(tmp_path / "environments" / "prod.yaml", root / "profiles")
    assert fleet.pool("l40s-notebooks").profile == NEW_PROFILE


def test_a_profile_that_ran_seven_days_fails_the_run_time_gate(
        reports: dict[str, tuple[int, dict[str, Any]]]) -> None:
    code, report = reports["seven-days"]
    assert code == 1 and not report["ok"] and report["patch"] is None
    assert failing(report) == {"run-time"}
    (bad,) = [g for g in gates(report, "run-time") if not g["passed"]]
    assert bad["item"].startswith(f"profile {NEW_PROFILE} (")
    assert bad["measured"] == "7.0 d" and bad["required"] == ">= 14 d"


def test_an_xid_in_the_window_fails(reports: dict[str, tuple[int, dict[str, Any]]]) -> None:
    code, report = reports["xid"]
    assert code == 1 and failing(report) == {"xid"}
    (xid,) = gates(report, "xid")
    assert "XID 79" in xid["detail"] and "pilot-h100-02" in xid["detail"]


def test_a_failed_mig_reconfiguration_fails(reports: dict[str, tuple[int, dict[str, Any]]]) -> None:
    code, report = reports["mig-failed"]
    assert code == 1 and failing(report) == {"mig-reconfiguration"}
    assert gates(report, "mig-reconfiguration")[0]["detail"] == "failed on pilot-a100-01"


def test_low_utilization_fails_the_uplift_gate(reports: dict[str, tuple[int, dict[str, Any]]]) -> None:
    code, report = reports["low-utilization"]
    assert code == 1 and failing(report) == {"utilization-uplift"}
    (gate,) = gates(report, "utilization-uplift")
    assert 0.3 < float(gate["measured"].split("x")[0]) < 0.7  # 15% busy over a 30% baseline
    assert "not measured: gke-l4-inference" in gate["detail"]


def test_long_queue_waits_fail(reports: dict[str, tuple[int, dict[str, Any]]]) -> None:
    code, report = reports["queue"]
    assert code == 1 and failing(report) == {"queue-wait-p95"}
    (gate,) = gates(report, "queue-wait-p95")
    assert 900 < float(gate["measured"].removesuffix(" s")) <= 1800


def test_ecc_errors_fail_and_application_xids_fail_unless_ignored(
        reports: dict[str, tuple[int, dict[str, Any]]], prometheus: str, histories: dict[str, History],
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, report = reports["ecc-and-app-xid"]
    assert code == 1 and failing(report) == {"ecc", "xid"}
    # increase() extrapolates (1.0x errors); a count prints as a whole number.
    assert "1 double-bit ECC errors on GPU-pilot-l40s-01-0" in gates(report, "ecc")[0]["detail"]
    assert "XID 13" in gates(report, "xid")[0]["detail"]
    # With the application XID 13 in promotion.ignored_xids only ECC fails.
    g = load_guardrails(root / "policies" / "guardrails.yaml")
    lenient = g.model_copy(update={"promotion": g.promotion.model_copy(update={"ignored_xids": [13]})})
    monkeypatch.setenv("GPUSHARE_ROOT", str(root))
    h = histories["ecc-and-app-xid"]
    result = {x.gate: x for x in health_gates(Prometheus(prometheus), h.fleet, lenient, h.end)}
    assert result["xid"].passed and not result["ecc"].passed


def test_a_two_day_gap_inside_the_window_fails_and_names_its_dates(
        reports: dict[str, tuple[int, dict[str, Any]]], histories: dict[str, History]) -> None:
    code, report = reports["gap"]
    assert code == 1 and failing(report) == {"xid", "ecc"}
    h = histories["gap"]
    detail = gates(report, "xid")[0]["detail"]
    assert gates(report, "xid")[0]["measured"] == "no evidence"
    assert "pilot-h100-02 (" in detail and "of the window (promotion.min_coverage 95%)" in detail
    first, last = time.gmtime(h.end - 6 * DAY), time.gmtime(h.end - 4 * DAY)
    assert f"no data {time.strftime('%Y-%m-%d', first)}" in detail
    assert f"to {time.strftime('%Y-%m-%d', last)}" in detail and "(2 d)" in detail


def test_before_any_history_there_is_no_evidence(root: Path, prometheus: str, histories: dict[str, History]) -> None:
    first = min(h.start for h in histories.values())
    code, report = promote(root, "--prometheus", prometheus, "--at", str(first - 40 * DAY))
    assert code == 1 and report["patch"] is None
    assert {g["measured"] for g in report["gates"] if g["gate"] == "run-time" and g["passed"] is False} == {"0.0 d"}
    for gate in ("xid", "ecc", "mig-reconfiguration", "utilization-uplift", "queue-wait-p95"):
        assert gates(report, gate)[0]["measured"] == "no evidence", gate


def test_without_prometheus_nothing_is_evidence(root: Path) -> None:
    code, report = promote(root)
    assert code == 1 and not report["ok"] and report["patch"] is None
    assert "without --prometheus these gates cannot be checked" in report["errors"][0]
    assert "--prometheus" in report["errors"][0].split("fix:")[1]
    assert gates(report, "guardrails")[0]["passed"]  # what needs no Prometheus is still checked


def test_text_report_lists_the_failing_gates(root: Path, prometheus: str, histories: dict[str, History]) -> None:
    result = runner.invoke(app, ["promote", "--from", "pilot", "--to", "prod", "--no-plan", "--prometheus",
                                 prometheus, "--at", str(histories["xid"].end)],
                           env={"GPUSHARE_ROOT": str(root), "COLUMNS": "200"})
    assert result.exit_code == 1
    assert "gate" in result.stdout and "measured" in result.stdout and "required" in result.stdout
    assert "FAIL xid" in result.stdout and "not promoted: 1 gate(s) failed; nothing was written" in result.stdout


def test_wrong_url_is_a_clear_error(root: Path) -> None:
    from tests.prometheus.server import free_port

    result = runner.invoke(app, ["promote", "--from", "pilot", "--to", "prod", "--no-plan", "--json",
                                 "--prometheus", f"http://127.0.0.1:{free_port()}"], env={"GPUSHARE_ROOT": str(root)})
    assert result.exit_code == 2
    assert "cannot reach Prometheus" in json.loads(result.stdout)["errors"][0]
