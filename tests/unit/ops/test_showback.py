"""Showback without a Prometheus (gpushare.ops.showback): the prices file (its errors name file, key and fix), the
per-resource GPU shares for every sharing kind, the split and its invariant on inline sums, and bad options (against
a real Prometheus: tests/showback/test_showback_prometheus.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core.errors import GpushareError
from gpushare.core.paths import package_data_path
from gpushare.core.prices import load_prices
from gpushare.core.resolve import resolve_env
from gpushare.ops.showback import grouped, split, split_by_use
from gpushare.render.monitoring.expressions import resource_gpu_shares
from tests.showback.scenarios import SHOWBACK_ENV

EXAMPLE = package_data_path("workspace", "policies", "prices.example.yaml")


def test_shipped_example_prices_load_with_overrides() -> None:
    dev, prod = load_prices(EXAMPLE, "dev"), load_prices(EXAMPLE, "prod")
    assert dev.currency == "USD"
    assert dev.price("NVIDIA H100 80GB HBM3") == 2.5 and prod.price("NVIDIA H100 80GB HBM3") == 3.0
    assert prod.price("NVIDIA L4") == 0.6


@pytest.mark.parametrize(("text", "where", "said"), [
    ("currency: EUR\nhourly: {NVIDIA H99: 1.0}\n", "hourly.NVIDIA H99", "not a GPU model"),
    ("currency: euro\nhourly: {L4: 1.0}\n", "currency", "pattern"),
    ("currency: EUR\nhourly: {L4: -1}\n", "hourly.L4", "greater than or equal"),
    ("currency: EUR\nhourly: {L4: 1}\nprice: 3\n", "price", "unknown key"),
    ("apiVersion: gpushare.io/v9\ncurrency: EUR\nhourly: {L4: 1}\n", "apiVersion", "unknown apiVersion"),
    ("currency: EUR\nhourly: {L4: 1}\nenvironments: {dev: {hourly: {L5: 2}}}\n", "environments.dev.hourly.L5",
     "not a GPU model"),
    ("currency: EUR\nhourly: {L4: .inf}\n", "hourly.L4", "finite number"),
    ("currency: EUR\nhourly: {L4: 1e400}\n", "hourly.L4", "finite number"),
    ("currency: EUR\nhourly: {L4: .nan}\n", "hourly.L4", "finite number"),
    ("currency: EUR\nhourly: {L4: 1e12}\n", "hourly.L4", "less than"),
    ("currency: EUR\nhourly: {NVIDIA A100-SXM4-80GB: 2, A800-80GB: 3}\n", "hourly.A800-80GB", "priced twice"),
])
def test_bad_prices_file_is_a_located_error(tmp_path: Path, text: str, where: str, said: str) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    with pytest.raises(GpushareError) as info:
        load_prices(path, "dev")
    problem = info.value.problems[0]
    assert problem.file == str(path) and problem.path == where and said in problem.message, problem


def test_missing_price_names_the_model_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text("currency: EUR\nhourly: {L4: 1}\n")
    with pytest.raises(GpushareError) as info:
        load_prices(path, "dev").price("NVIDIA H200")
    assert "NVIDIA H200" in str(info.value.problems[0]) and "hourly" in (info.value.problems[0].fix or "")


def test_gpu_shares_per_sharing_kind() -> None:
    shares = resource_gpu_shares(resolve_env(str(SHOWBACK_ENV)).pools)
    assert shares[("whole-pool", "nvidia_com_gpu")] == (1.0, 1.0)
    assert shares[("mig-pool", "nvidia_com_mig_3g_40gb")] == (round(3 / 7, 6), 0.5)  # compute 3/7, memory 4/8
    assert shares[("mig-pool", "nvidia_com_mig_1g_10gb")] == (round(1 / 7, 6), 0.125)
    assert shares[("ts-pool", "nvidia_com_gpu_shared")] == (0.25, 0.25)
    assert shares[("mps-pool", "nvidia_com_gpu_shared")] == (0.25, 0.25)


def test_gke_time_sharing_divides_the_gpu_by_its_clients() -> None:
    pilot = resolve_env("pilot")
    gke = resource_gpu_shares(pilot.pools)[("gke-l4-inference", "nvidia_com_gpu")]
    assert gke == (0.5, 0.5)  # GKE's time-sharing, 2 clients a GPU


def test_split_reconciles_and_keeps_unknown_namespaces_as_their_own_tenant() -> None:
    fleet = resolve_env(str(SHOWBACK_ENV))
    physical = {"whole-pool": 12.0, "mig-pool": 6.0, "ts-pool": 6.0, "mps-pool": 6.0}
    allocated = [({"namespace": "research", "pool": "whole-pool", "resource": "nvidia_com_gpu"}, 6.0),
                 ({"namespace": "stray", "pool": "ts-pool", "resource": "nvidia_com_gpu_shared"}, 12.0),
                 ({"namespace": "search", "pool": "mig-pool", "resource": "nvidia_com_mig_3g_40gb"}, 6.0),
                 ({"namespace": "x", "pool": "elsewhere", "resource": "nvidia_com_gpu"}, 1.0)]
    rows, idle, notes = split(fleet, physical, allocated, {("research", "whole-pool"): 3.0})
    assert {(r.tenant, r.pool): r.allocated_gpu_hours for r in rows} == {
        ("research", "whole-pool"): 6.0, ("stray", "ts-pool"): 3.0, ("search", "mig-pool"): pytest.approx(6 * 3 / 7,
                                                                                                            1e-5)}
    total = sum(r.allocated_gpu_hours for r in rows) + sum(i.gpu_hours for i in idle)
    assert total == pytest.approx(sum(physical.values()))
    assert next(r for r in rows if r.tenant == "stray").used_gpu_hours is None  # time-sliced: allocation only
    assert next(r for r in rows if r.tenant == "search").used_gpu_hours == 0.0  # measured, and nothing busy
    assert notes and "elsewhere" in notes[0]
    by_pool = {r.pool: r for r in grouped(rows, "pool")}
    assert by_pool["ts-pool"].allocated_gpu_hours == 3.0


@pytest.mark.parametrize(("args", "said"), [
    (["--window", "30 days"], "--window"),
    (["--by", "team"], "--by"),
    (["--source", "cache"], "--source"),
    (["--prometheus", "prometheus:9090"], "not an http(s) URL"),
    (["--window", "99999999999d"], "longer than 400 days"),  # once hours of chunked reads
])
def test_bad_options_are_clear_errors(args: list[str], said: str) -> None:
    base = {"--env": "dev", "--prometheus": "http://127.0.0.1:9"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    result = CliRunner().invoke(app, ["showback", *[x for kv in base.items() for x in kv]], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and said in result.output, result.output
    assert "Traceback" not in result.output


def test_unreachable_prometheus_is_a_clear_error() -> None:
    result = CliRunner().invoke(app, ["showback", "--env", "dev", "--prometheus", "http://127.0.0.1:9", "--json"])
    assert result.exit_code == 2 and "cannot reach Prometheus" in result.output


class _Prometheus:
    """A Prometheus that has `physical` GPUs per pool for the showback queries and no other series at all."""

    physical: dict[str, float] = {}

    def __init__(self, url: str, timeout: float | None = None) -> None:
        self.url, self.timeout = url, timeout

    def query(self, name: str, expr: str, at: float) -> list[dict[str, Any]]:
        if name != "physical GPUs":
            return []
        return [{"metric": {"pool": pool}, "value": [at, str(count)]} for pool, count in self.physical.items()]

    def query_range(self, name: str, expr: str, start: float, end: float, step: int) -> list[dict[str, Any]]:
        return []

    def series(self, name: str, selector: str, start: float, end: float) -> list[dict[str, Any]]:
        return []


def _showback(monkeypatch: pytest.MonkeyPatch, physical: dict[str, float]) -> Any:
    monkeypatch.setattr("gpushare.ops.showback.Prometheus", _Prometheus)
    monkeypatch.setattr(_Prometheus, "physical", physical)
    return CliRunner().invoke(app, ["showback", "--env", str(SHOWBACK_ENV), "--prometheus", "http://127.0.0.1:9",
                                    "--window", "6h", "--end", "1767225600", "--json"])


def test_no_dcgm_data_is_an_error_not_zero_gpu_hours(monkeypatch: pytest.MonkeyPatch) -> None:
    """As `capacity` does: a window in which no pool's GPUs reported fails with why, not 0.0 GPU-hours."""
    result = _showback(monkeypatch, {})
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and "has no DCGM utilization series" in doc["errors"][0]
    assert "dcgm-exporter is scraped" in doc["problems"][0]["fix"]


def test_one_pool_reporting_is_enough_for_a_report(monkeypatch: pytest.MonkeyPatch) -> None:
    result = _showback(monkeypatch, {"whole-pool": 24.0})  # per-step counts: 2 GPUs x 12 steps of 5 minutes
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["physical_gpu_hours"] > 0 and any(i["pool"] == "whole-pool" for i in doc["idle"])


# ---------------------------------------------------------------- --basis use (split_by_use)

def _use_split(sm: dict[tuple[str, str], float]) -> tuple[list[Any], list[Any], list[str]]:
    """showback-test's pools over 6 h: whole-pool's 2 GPUs, research holding one; ts-pool's L4 time-sliced in 4
    replicas, notebooks (nb) and research holding one each; mps-pool's L4, inference holding 2 of 4 clients."""
    fleet = resolve_env(str(SHOWBACK_ENV))
    physical = {"whole-pool": 12.0, "mig-pool": 6.0, "ts-pool": 6.0, "mps-pool": 6.0}
    allocated = [({"namespace": "research", "pool": "whole-pool", "resource": "nvidia_com_gpu"}, 6.0),
                 ({"namespace": "nb", "pool": "ts-pool", "resource": "nvidia_com_gpu_shared"}, 6.0),
                 ({"namespace": "research", "pool": "ts-pool", "resource": "nvidia_com_gpu_shared"}, 6.0),
                 ({"namespace": "inference", "pool": "mps-pool", "resource": "nvidia_com_gpu_shared"}, 12.0)]
    rows, idle, _ = split(fleet, physical, allocated, {("research", "whole-pool"): 3.0})
    rows, notes = split_by_use(fleet, rows, idle, sm)
    total = sum(r.gpu_hours for r in rows) + sum(i.gpu_hours for i in idle)
    assert total == pytest.approx(sum(physical.values()), abs=1e-9)  # rows plus idle stay the physical hours
    return rows, idle, notes


def test_use_basis_charges_the_70_percent_tenant_its_use_and_splits_the_rest_by_allocation() -> None:
    # On ts-pool's L4 notebooks' pods took 70% of the SM time for the 6 h, research's 5%: 4.2 and 0.3 GPU-hours
    # measured. The remaining 1.5 GPU-hours go by allocation: a quarter each to the two holders, half to idle.
    rows, idle, notes = _use_split({("nb", "ts-pool"): 0.7 * 6, ("research", "ts-pool"): 0.05 * 6})
    by = {(r.tenant, r.pool): r for r in rows}
    assert by[("notebooks", "ts-pool")].gpu_hours == pytest.approx(4.2 + 1.5 * 1.5 / 6)
    assert by[("research", "ts-pool")].gpu_hours == pytest.approx(0.3 + 1.5 * 1.5 / 6)
    assert next(i for i in idle if i.pool == "ts-pool").gpu_hours == pytest.approx(1.5 * 3 / 6)
    assert by[("notebooks", "ts-pool")].allocated_gpu_hours == 1.5  # the allocation stays reported beside
    assert by[("notebooks", "ts-pool")].sm_gpu_hours == pytest.approx(4.2)
    # Whole GPUs keep the allocation basis; so does an MPS pool whose pods used nothing measurable.
    assert by[("research", "whole-pool")].gpu_hours == 6.0 and by[("research", "whole-pool")].sm_gpu_hours is None
    assert by[("inference", "mps-pool")].gpu_hours == pytest.approx(3.0)
    assert next(i for i in idle if i.pool == "mps-pool").gpu_hours == pytest.approx(3.0)
    assert not notes


def test_use_basis_with_balanced_use_and_a_tenant_that_holds_nothing() -> None:
    # 40% each over the whole window, plus a namespace that ran on the GPU without a request kube-state-metrics saw.
    rows, idle, _ = _use_split({("nb", "ts-pool"): 2.4, ("research", "ts-pool"): 2.4, ("stray", "ts-pool"): 0.6})
    by = {(r.tenant, r.pool): r for r in rows}
    assert by[("notebooks", "ts-pool")].gpu_hours == pytest.approx(2.4 + 0.6 * 1.5 / 6)
    stray = by[("stray", "ts-pool")]
    assert stray.gpu_hours == pytest.approx(0.6) and stray.allocated_gpu_hours == 0
    assert next(i for i in idle if i.pool == "ts-pool").gpu_hours == pytest.approx(0.6 * 3 / 6)


def test_use_basis_never_charges_more_than_the_physical_hours() -> None:
    rows, idle, notes = _use_split({("nb", "ts-pool"): 6.0, ("research", "ts-pool"): 3.0})  # 9 of 6 GPU-hours
    by = {(r.tenant, r.pool): r for r in rows}
    assert by[("notebooks", "ts-pool")].gpu_hours == pytest.approx(4.0)
    assert next(i for i in idle if i.pool == "ts-pool").gpu_hours == pytest.approx(0.0)
    assert notes and "exceeds the physical GPU-hours" in notes[0]


def test_use_basis_sums_to_the_physical_hours_for_any_use() -> None:
    import random

    rng = random.Random(41)
    for _ in range(200):
        a, b = rng.uniform(0, 3), rng.uniform(0, 3)
        _use_split({("nb", "ts-pool"): a, ("research", "ts-pool"): b, ("inference", "mps-pool"): rng.uniform(0, 6)})


def test_bad_basis_names_the_option_and_the_choices() -> None:
    result = CliRunner().invoke(app, ["showback", "--env", "dev", "--prometheus", "http://127.0.0.1:9",
                                      "--basis", "foo"], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert "--basis 'foo'" in result.output and "allocation" in result.output and "use" in result.output
    assert "Traceback" not in result.output


def test_use_basis_without_the_process_exporter_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpushare.ops.showback.Prometheus", _Prometheus)
    monkeypatch.setattr(_Prometheus, "physical", {"ts-pool": 12.0})
    result = CliRunner().invoke(app, ["showback", "--env", str(SHOWBACK_ENV), "--prometheus", "http://127.0.0.1:9",
                                      "--window", "6h", "--end", "1767225600", "--basis", "use", "--json"])
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert "gpushare_pod_gpu_sm_utilization_ratio" in doc["errors"][0]
    assert "gpu_process_exporter" in doc["problems"][0]["fix"] and "--basis allocation" in doc["problems"][0]["fix"]
