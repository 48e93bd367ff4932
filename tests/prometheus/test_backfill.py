"""`gpushare capacity --backfill-rules` against a real Prometheus over backfilled exporter series: promtool evaluates
the recording rules pass by pass (a pass reads only what earlier passes recorded), the blocks are written to the
named folder with the steps to move them (or moved into --data-dir, never over a block already there), and once
every pass is in the server `gpushare capacity` reads the recorded series and concludes what it did from the raw."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core.errors import GpushareError
from gpushare.core.guardrails import load_guardrails
from gpushare.core.resolve import resolve_env
from gpushare.ops import backfill
from gpushare.render.monitoring import prometheus_rule_groups
from tests.prometheus.scenarios import PoolLoad, Scenario
from tests.prometheus.scenarios import backfill as backfill_series
from tests.prometheus.server import prometheus_server

ENV = Path(__file__).resolve().parent / "capacity" / "dev.yaml"
HOURS = 2
runner = CliRunner()


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """The exporters' series only: history from before the rules were deployed."""
    work = tmp_path_factory.mktemp("raw")
    data = work / "data"
    data.mkdir()
    end = (int(time.time()) - 4 * 3600) // 60 * 60
    backfill_series(Scenario(start=end - HOURS * 3600, end=end, pools=[
        PoolLoad("ts-underused", "NVIDIA L40S", 46068, {"under-1": 2, "under-2": 2}, "inference", util=0.15,
                 replicas=2, pod_memory_mib=4096, resource="nvidia_com_gpu_shared", queue="tenant-inference"),
        PoolLoad("mig-idle", "NVIDIA H100 80GB HBM3", 81559, {"mig-1": 2, "mig-2": 2}, "llm", util=0.05,
                 swing=0.01, mig={"4g.40gb": (1, 40448), "3g.40gb": (1, 40448)}, pod_memory_mib=3072,
                 queue="tenant-llm"),
    ]), work, data)
    return data, end


def _copy(data: Path, to: Path) -> Path:
    shutil.copytree(data, to, ignore=shutil.ignore_patterns("lock", "queries.active"))
    return to


def _capacity(url: str, end: int, tmp: Path, *extra: str) -> Any:
    result = runner.invoke(app, ["capacity", "--env", str(ENV), "--prometheus", url, "--window", f"{HOURS}h",
                                 "--end", str(end), "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.slow  # a real Prometheus server and promtool, five passes
def test_passes_with_printed_steps_then_capacity_reads_the_rules(raw: tuple[Path, int], tmp_path: Path) -> None:
    source, end = raw
    data = _copy(source, tmp_path / "data")
    out = tmp_path / "blocks"
    with prometheus_server(data, tmp_path) as url:
        before = _capacity(url, end, tmp_path, "--patch", str(tmp_path / "raw.patch"))
    assert before["source"] == "raw exporter series"
    passes = len(backfill.rule_levels(prometheus_rule_groups(resolve_env(str(ENV)), load_guardrails())))
    for attempt in range(passes + 1):
        blocks_before = sorted(p.name for p in data.iterdir())
        with prometheus_server(data, tmp_path) as url:
            report = _capacity(url, end, tmp_path, "--backfill-rules", str(out))
        assert sorted(p.name for p in data.iterdir()) == blocks_before  # without --data-dir nothing is moved
        if report["complete"]:
            break
        written = [p for p in report["passes"] if p["state"] == "written"]
        assert len(written) == 1 and written[0]["level"] == attempt, report  # one pass, in dependency order
        assert all(p["state"] == "waits for an earlier pass" for p in report["passes"][attempt + 1:])
        assert "mv " in report["next_steps"][0]
        for block in (Path(written[0]["folder"]) / "blocks").iterdir():  # the user follows the printed steps
            shutil.move(str(block), str(data / block.name))
    else:
        pytest.fail("the passes never completed")
    assert [p["state"] for p in report["passes"]] == ["present"] * passes
    with prometheus_server(data, tmp_path) as url:
        after = _capacity(url, end, tmp_path, "--patch", str(tmp_path / "rec.patch"))
    assert after["source"] == "recording rules"
    for a, b in zip(before["pools"], after["pools"], strict=True):
        assert b["evidence_figures"]["utilization_mean"] == pytest.approx(
            a["evidence_figures"]["utilization_mean"], abs=0.02), a["pool"]
        for key in ("replicas_proposed", "gpus_proposed", "mig_layout_proposed"):
            assert b[key] == a[key], (a["pool"], key)


@pytest.mark.slow  # a real Prometheus server and promtool
def test_data_dir_moves_blocks_and_never_overwrites(raw: tuple[Path, int], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backfill, "LOAD_WAIT_SECONDS", 0.0)  # the server loads moved blocks within a minute
    source, end = raw
    data = _copy(source, tmp_path / "data")
    out = tmp_path / "blocks"
    with prometheus_server(data, tmp_path) as url:
        report = _capacity(url, end, tmp_path, "--backfill-rules", str(out), "--data-dir", str(data))
        first = report["passes"][0]
        assert first["state"] == "not loaded yet" and first["blocks"], report
        assert all((data / block).is_dir() for block in first["blocks"])
        assert not any((Path(first["folder"]) / "blocks").iterdir())
        again = runner.invoke(app, ["capacity", "--env", str(ENV), "--prometheus", url, "--window", f"{HOURS}h",
                                    "--end", str(end), "--backfill-rules", str(out), "--data-dir", str(data)])
    assert again.exit_code == 2 and "an earlier run wrote this pass" in " ".join(again.output.split())
    with prometheus_server(data, tmp_path) as url:  # a restart loads the moved blocks at once
        report = _capacity(url, end, tmp_path, "--backfill-rules", str(tmp_path / "second"), "--data-dir", str(data))
    assert report["passes"][0]["state"] == "present" and report["passes"][1]["state"] == "not loaded yet"


@pytest.mark.slow  # a real Prometheus server
def test_data_dir_must_be_a_prometheus_data_folder(raw: tuple[Path, int], tmp_path: Path) -> None:
    source, end = raw
    with prometheus_server(_copy(source, tmp_path / "data"), tmp_path) as url:
        result = runner.invoke(app, ["capacity", "--env", str(ENV), "--prometheus", url, "--window", f"{HOURS}h",
                                     "--end", str(end), "--backfill-rules", str(tmp_path / "b"),
                                     "--data-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a Prometheus data folder" in result.output and "--storage.tsdb.path" in result.output
    assert not (tmp_path / "b").exists()


@pytest.mark.slow  # a real Prometheus server and promtool
def test_a_pass_stops_where_the_live_rules_begin(raw: tuple[Path, int], tmp_path: Path) -> None:
    """Rules deployed an hour before the end: their own series are not recorded twice."""
    from tests.prometheus.scenarios import backfill_recording_rules

    source, end = raw
    data = _copy(source, tmp_path / "data")
    live_from = end - 3600
    backfill_recording_rules(prometheus_rule_groups(resolve_env(str(ENV)), load_guardrails()), data, tmp_path,
                             live_from, end)
    with prometheus_server(data, tmp_path) as url:
        report = _capacity(url, end, tmp_path, "--backfill-rules", str(tmp_path / "b"))
    first = report["passes"][0]
    assert first["state"] == "written" and first["start"] <= end - HOURS * 3600
    step = 300  # capacity.step: the pass ends a step before the first step that sees the live series
    assert live_from - 2 * step <= first["end"] <= live_from  # the live series begin at or just after live_from


def test_a_missing_promtool_is_named_with_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backfill.shutil, "which", lambda name: None)
    with pytest.raises(GpushareError) as caught:
        backfill._promtool()
    (problem,) = caught.value.problems
    assert "promtool is not installed" in problem.message and "apt install prometheus" in (problem.fix or "")
    assert caught.value.exit_code == 2
