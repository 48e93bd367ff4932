"""Window statistics read in chunks the server accepts: against a real Prometheus over backfilled series, every
statistic gpushare computes from chunked range reads equals Prometheus's own whole-window subquery; a server whose
--query.max-samples refuses the whole window still answers the halved chunks; and where even one step is refused
the error names the limit, the query and the fix."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core.guardrails import load_guardrails
from gpushare.core.resolve import ResolvedFleet, resolve
from gpushare.ops import capacity, prometheus
from tests.conftest import PROFILES
from tests.prometheus.scenarios import PoolLoad, Scenario, backfill
from tests.prometheus.server import prometheus_server

ENV = Path(__file__).resolve().parent / "capacity" / "dev.yaml"
HOURS = 3
runner = CliRunner()


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    work = tmp_path_factory.mktemp("chunks")
    data = work / "data"
    data.mkdir()
    end = (int(time.time()) - 3600) // 60 * 60 + 17  # not on a step: the steps' alignment is part of the check
    backfill(Scenario(start=end - HOURS * 3600, end=end, step=30, pools=[
        PoolLoad("ts-underused", "NVIDIA L40S", 46068, {"under-1": 2, "under-2": 2}, "inference", util=0.15,
                 swing=0.3, replicas=2, pod_memory_mib=4096, resource="nvidia_com_gpu_shared",
                 queue="tenant-inference", pending=2),
        PoolLoad("mig-idle", "NVIDIA H100 80GB HBM3", 81559, {"mig-1": 2}, "llm", util=0.05, swing=0.2,
                 mig={"4g.40gb": (1, 40448), "3g.40gb": (1, 40448)}, pod_memory_mib=3072, queue="tenant-llm"),
    ]), work, data)
    return data, end


@pytest.fixture(scope="module")
def fleet() -> ResolvedFleet:
    return resolve(ENV, PROFILES)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prometheus, "CHUNK_SECONDS", 1700)  # several chunks, none on an hour boundary


@pytest.fixture(scope="module")
def server(backfilled: tuple[Path, int], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data, _end = backfilled
    with prometheus_server(data, tmp_path_factory.mktemp("server"), max_samples=50_000_000) as url:
        yield url


def _whole_and_chunked(url: str, fleet: ResolvedFleet, source: str, end: int
                       ) -> Iterator[tuple[str, dict[str, str], float, float]]:
    guardrails = load_guardrails()
    prom = prometheus.Prometheus(url)
    steps = prometheus.window_steps(f"{HOURS}h", guardrails.capacity.step, end)
    for name, expr, _apply in capacity._window_queries(fleet, guardrails, fleet.pools, f"{HOURS}h", source):
        stat = prometheus.window_stat(expr, f"{HOURS}h", guardrails.capacity.step)
        if stat is None:
            continue
        chunked = {key: prometheus.apply_stat(stat, v) for key, v in prometheus.read_steps(prom, name, stat.inner,
                                                                                             steps).items()}
        whole = {tuple(sorted(s["metric"].items())): float(s["value"][1]) for s in prom.query(name, expr, end)}
        assert set(chunked) == set(whole), name
        for key, value in whole.items():
            yield name, dict(key), value, chunked[key]


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_chunked_statistics_equal_the_servers_own(server: str, backfilled: tuple[Path, int], fleet: ResolvedFleet,
                                                  small_chunks: None) -> None:
    _data, end = backfilled
    compared = list(_whole_and_chunked(server, fleet, "raw", end))
    assert {name for name, *_ in compared} >= {"utilization mean", "utilization p95", "utilization coverage",
                                               "MIG utilization p95", "pending mean", "allocated p95"}
    for name, labels, whole, chunked in compared:
        assert chunked == pytest.approx(whole, rel=1e-9, abs=1e-12), (name, labels)


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_a_window_the_server_refuses_is_read_in_halves(backfilled: tuple[Path, int], fleet: ResolvedFleet,
                                                       tmp_path: Path) -> None:
    data, end = backfilled
    guardrails = load_guardrails()
    stat_expr = next(e for n, e, _a in capacity._window_queries(fleet, guardrails, fleet.pools, f"{HOURS}h", "raw")
                     if n == "utilization p95")
    stat = prometheus.window_stat(stat_expr, f"{HOURS}h", guardrails.capacity.step)
    assert stat is not None
    steps = prometheus.window_steps(f"{HOURS}h", guardrails.capacity.step, end)
    with prometheus_server(data, tmp_path) as url:
        expected = prometheus.read_steps(prometheus.Prometheus(url), "p95", stat.inner, steps)
    with prometheus_server(data, tmp_path, max_samples=600) as url:
        prom = prometheus.Prometheus(url)
        with pytest.raises(prometheus.ServerLimit):
            prom.query("whole window", stat_expr, end)
        halved = prometheus.read_steps(prom, "p95", stat.inner, steps)
        assert set(halved) == set(expected)
        for key, values in expected.items():  # the same steps; sums in Prometheus's own order, to the last bit
            assert halved[key] == pytest.approx(values, rel=1e-12)
        assert len(prom.timings) >= 2  # the window is one chunk by default: two answers or more mean it was halved


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_a_single_step_over_the_limit_names_the_limit_query_and_fix(backfilled: tuple[Path, int],
                                                                    tmp_path: Path) -> None:
    data, end = backfilled
    with prometheus_server(data, tmp_path, max_samples=5) as url:
        result = runner.invoke(app, ["capacity", "--env", str(ENV), "--prometheus", url, "--window", f"{HOURS}h",
                                     "--end", str(end), "--source", "raw", "--patch", str(tmp_path / "p.patch")])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "--query.max-samples" in text and "utilization coverage" in text
    assert "raise --query.max-samples" in text and "--backfill-rules" in text
    assert "Traceback" not in result.output


def test_only_a_single_whole_window_statistic_is_taken_apart() -> None:
    stat = prometheus.window_stat('quantile_over_time(0.95, (max by (pool) (x{a="("}))[7d:5m])', "7d", "5m")
    assert stat == prometheus.WindowStat("quantile", 'max by (pool) (x{a="("})', 0.95)
    for expr in ("max_over_time((a)[7d:5m]) or max_over_time((b)[7d:5m])",  # two subqueries
                 "avg_over_time((a)[1d:5m])",  # another window
                 "quantile_over_time((a)[7d:5m])",  # no phi
                 "max by (pool) (max_over_time((a)[7d:5m]))"):
        assert prometheus.window_stat(expr, "7d", "5m") is None, expr


def test_statistics_follow_prometheus() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert prometheus.apply_stat(prometheus.WindowStat("quantile", "", 0.95), values) == pytest.approx(3.85)
    assert prometheus.apply_stat(prometheus.WindowStat("quantile", "", 0.5), values) == pytest.approx(2.5)
    assert prometheus.apply_stat(prometheus.WindowStat("max", ""), [*values, float("nan")]) == 4.0
    assert prometheus.apply_stat(prometheus.WindowStat("avg", ""), values) == 2.5
    assert prometheus.apply_stat(prometheus.WindowStat("count", ""), values) == 4.0
    first, last, step = prometheus.window_steps("1h", "5m", 7217.5)  # the aligned steps in [at - 1h, at]
    assert (first, last, step) == (3900_000, 7200_000, 300_000)
