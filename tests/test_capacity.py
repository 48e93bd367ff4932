"""`gpushare capacity` against a real Prometheus (Debian's package, on 127.0.0.1) loaded with backfilled
DCGM-, kube-state-metrics- and Kueue-format series for four scenarios: each recommendation goes the expected way,
and a wrong URL, an empty window or a pool without series give a clear error or a stated gap."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core.guardrails import load_guardrails
from gpushare.core.mig import check_layout, layout_from_counts
from gpushare.core.resolve import resolve
from gpushare.ops.capacity import GIB, MigEvidence, PoolEvidence, Recommendation, recommend
from tests.conftest import PROFILES
from tests.prometheus.scenarios import PoolLoad, Scenario, backfill
from tests.prometheus.server import prometheus_server

ROOT = Path(__file__).resolve().parents[1]
ENV = Path(__file__).resolve().parent / "prometheus" / "capacity" / "dev.yaml"
HOURS = 6
runner = CliRunner()


def _scenario(end: int) -> Scenario:
    start = end - HOURS * 3600
    return Scenario(start=start, end=end, pools=[
        # Two L40S replicas per GPU, all held, the GPUs ~15% busy, 4 GiB per pod: room for more replicas.
        PoolLoad("ts-underused", "NVIDIA L40S", 46068, {"under-1": 2, "under-2": 2}, "inference", util=0.15,
                 replicas=2, pod_memory_mib=4096, resource="nvidia_com_gpu_shared", queue="tenant-inference"),
        # Same, but every pod holds 18 GiB: memory, not compute, limits the replicas.
        PoolLoad("ts-membound", "NVIDIA L40S", 46068, {"membound-1": 4}, "inference", util=0.1, replicas=2,
                 pod_memory_mib=18432, resource="nvidia_com_gpu_shared"),
        # MIG 4g + 3g instances that hold 3 GiB and are 5% busy.
        PoolLoad("mig-idle", "NVIDIA H100 80GB HBM3", 81559, {"mig-1": 2, "mig-2": 2}, "llm", util=0.05,
                 swing=0.01, mig={"4g.40gb": (1, 40448), "3g.40gb": (1, 40448)}, pod_memory_mib=3072,
                 queue="tenant-llm"),
        # Four replicas per GPU, GPUs ~92% busy, 6 workloads waiting 30 minutes in Kueue.
        PoolLoad("ts-contended", "NVIDIA L40S", 46068, {"busy-1": 2, "busy-2": 2}, "batch", util=0.92,
                 swing=0.03, replicas=4, pod_memory_mib=4096, resource="nvidia_com_gpu_shared",
                 queue="tenant-batch", pending=6, wait_seconds=1800),
    ])


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    work = tmp_path_factory.mktemp("prometheus")
    data = work / "data"
    data.mkdir()
    # The scenario's load follows the time of day: end the window at the same hour (the last 12:00 UTC) every run.
    day = 86400
    end = (int(time.time()) - 600 - day // 2) // day * day + day // 2
    backfill(_scenario(end), work, data)
    return data, end


@pytest.fixture(scope="module")
def prometheus(backfilled: tuple[Path, int]) -> Iterator[tuple[str, int]]:
    data, end = backfilled
    with prometheus_server(data, data.parent) as url:
        yield url, end


@pytest.fixture(scope="module")
def report(prometheus: tuple[str, int], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    url, end = prometheus
    out = tmp_path_factory.mktemp("capacity")
    result = runner.invoke(app, ["capacity", "--env", str(ENV), "--prometheus", url, "--window", f"{HOURS}h",
                                 "--end", str(end), "--json", "--patch", str(out / "dev.patch"),
                                 "--chart", str(out / "capacity.png")])
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    data["_out"] = str(out)
    return data


def _pool(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in report["pools"] if p["pool"] == name)


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_underused_time_sliced_pool_gets_more_replicas_on_fewer_gpus(report: dict[str, Any]) -> None:
    p = _pool(report, "ts-underused")
    assert p["replicas_now"] == 2 and p["replicas_proposed"] > 2
    assert p["replicas_proposed"] <= 8  # dev's max_shared_replicas for a 48 GB GPU
    assert p["gpus_proposed"] < p["gpus_now"]
    assert p["utilization_projected"] > p["utilization_now"]
    assert 0.1 < p["evidence_figures"]["utilization_mean"] < 0.2
    assert p["in_patch"]


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_contended_pool_gets_fewer_replicas_and_more_gpus(report: dict[str, Any]) -> None:
    p = _pool(report, "ts-contended")
    figures = p["evidence_figures"]
    assert figures["pending_mean"] == pytest.approx(6)
    assert figures["queue_wait_seconds"] >= 900
    assert p["replicas_proposed"] < p["replicas_now"]
    assert p["gpus_proposed"] > p["gpus_now"]
    assert any("pending workloads mean 6.0" in line for line in p["evidence"])


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_memory_bound_pool_never_gets_more_replicas_than_memory_allows(report: dict[str, Any]) -> None:
    p = _pool(report, "ts-membound")
    memory = p["evidence_figures"]["replica_memory_p95_bytes"]
    assert memory == pytest.approx(18 * GIB)
    fits = int(48 * GIB * (1 - load_guardrails().capacity.memory_headroom) // memory)
    assert p["replicas_proposed"] <= fits == 2
    assert any("binding: memory" in line for line in p["evidence"])


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_idle_mig_pool_gets_smaller_instances_that_pass_the_mig_check(report: dict[str, Any]) -> None:
    p = _pool(report, "mig-idle")
    assert p["mig_layout_now"] == {"4g.40gb": 1, "3g.40gb": 1}
    proposed = p["mig_layout_proposed"]
    assert proposed and sum(proposed.values()) > 2
    model = resolve(ENV, PROFILES).pool("mig-idle").nodes[0].gpu_model
    assert max(model.profiles[q].compute_slices for q in proposed) < 3
    assert check_layout(model, layout_from_counts(proposed), 580).ok


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_patch_is_written_not_applied_and_resolves(report: dict[str, Any], tmp_path: Path) -> None:
    text = (Path(report["_out"]) / "dev.patch").read_text()
    assert ENV.read_text() == (ROOT / "tests" / "prometheus" / "capacity" / "dev.yaml").read_text()
    assert "+++ b/tests/prometheus/capacity/dev.yaml" in text
    assert "profiles/mig-idle-mig.yaml" in text
    # Apply the patch to copies and resolve them: every proposed layout and quota holds.
    import subprocess

    # Paths in the patch are relative to the workspace holding the environment file (this checkout).
    (tmp_path / "tests" / "prometheus" / "capacity").mkdir(parents=True)
    profiles = tmp_path / PROFILES.relative_to(ROOT)
    profiles.mkdir(parents=True)
    for path in (PROFILES).glob("*.yaml"):
        (profiles / path.name).write_text(path.read_text())
    (tmp_path / "tests" / "prometheus" / "capacity" / "dev.yaml").write_text(ENV.read_text())
    applied = subprocess.run(["patch", "-p1", "--no-backup-if-mismatch"], input=text, cwd=tmp_path, text=True,
                             capture_output=True, check=False)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    fleet = resolve(tmp_path / "tests" / "prometheus" / "capacity" / "dev.yaml", profiles)
    assert fleet.pool("mig-idle").nodes[0].mig_layout == _pool(report, "mig-idle")["mig_layout_proposed"]
    llm = next(t for t in fleet.tenants if t.name == "llm")
    assert "nvidia.com/mig-4g.40gb" not in llm.quota


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_chart_is_a_png(report: dict[str, Any]) -> None:
    assert (Path(report["_out"]) / "capacity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_prometheus_does_the_aggregation(report: dict[str, Any]) -> None:
    assert report["queries"] <= 20
    assert report["prometheus_query_seconds"] > 0


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_text_report(prometheus: tuple[str, int], tmp_path: Path) -> None:
    url, end = prometheus
    result = runner.invoke(app, ["capacity", "--env", str(ENV), "--prometheus", url, "--window", f"{HOURS}h",
                                 "--end", str(end), "--patch", str(tmp_path / "p.patch")], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "ts-contended" in result.stdout and "binding: memory" in result.stdout
    assert "GPUs that could be freed: 2" in result.stdout


def test_wrong_url_is_a_clear_error(tmp_path: Path) -> None:
    from tests.prometheus.server import free_port

    result = runner.invoke(app, ["capacity", "--env", str(ENV), "--prometheus", f"http://127.0.0.1:{free_port()}",
                                 "--json"])
    assert result.exit_code == 2
    data = json.loads(result.stdout)
    assert "cannot reach Prometheus" in data["errors"][0]


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_not_a_prometheus_api_is_a_clear_error(prometheus: tuple[str, int]) -> None:
    url, _ = prometheus
    result = runner.invoke(app, ["capacity", "--env", str(ENV), "--prometheus", f"{url}/graph", "--json"])
    assert result.exit_code == 2
    assert "refused" in json.loads(result.stdout)["errors"][0]


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_no_data_in_the_window_is_an_error_not_a_number(prometheus: tuple[str, int]) -> None:
    url, end = prometheus
    result = runner.invoke(app, ["capacity", "--env", str(ENV), "--prometheus", url, "--window", "1h",
                                 "--end", str(end - 30 * 86400), "--json"])
    assert result.exit_code == 1
    assert "no GPU utilization for any pool" in json.loads(result.stdout)["errors"][0]


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_pool_without_series_is_a_stated_gap(prometheus: tuple[str, int], tmp_path: Path) -> None:
    url, end = prometheus
    data = yaml.safe_load(ENV.read_text())
    data["pools"].append({"name": "ts-new", "cluster": "metal-a", "purpose": "inference", "gpu_model": "NVIDIA L40S",
                          "profile": "inference-ts2", "hosts": [{"name": "new-1", "address": "10.98.9.1",
                                                                  "gpu_count": 2}]})
    env = tmp_path / "environments" / "dev.yaml"
    env.parent.mkdir()
    env.write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "profiles").symlink_to(PROFILES)
    result = runner.invoke(app, ["capacity", "--env", str(env), "--prometheus", url, "--window", f"{HOURS}h",
                                 "--end", str(end), "--json", "--patch", str(tmp_path / "p.patch")])
    assert result.exit_code == 0, result.output
    pool = next(p for p in json.loads(result.stdout)["pools"] if p["pool"] == "ts-new")
    assert pool["gaps"] and "no DCGM series for pool ts-new" in pool["gaps"][0]
    assert pool["gpus_proposed"] is None and pool["replicas_proposed"] is None
    assert pool["utilization_now"] is None


def test_short_coverage_withholds_the_recommendation() -> None:
    fleet = resolve(ENV, PROFILES)
    evidence = {p.name: PoolEvidence(p.name) for p in fleet.pools}
    evidence["ts-underused"] = PoolEvidence("ts-underused", coverage=0.2, utilization_mean=0.1,
                                            utilization_p95=0.2, allocated_mean=8, allocated_p95=8)
    recs = {r.pool: r for r in recommend(fleet, load_guardrails(), evidence, "7d")}
    assert recs["ts-underused"].gaps and recs["ts-underused"].replicas_proposed is None


def test_replicas_respect_the_environment_guardrail() -> None:
    """Compute and memory would allow 16 replicas on a 48 GB GPU; dev allows 8 for its memory class."""
    fleet = resolve(ENV, PROFILES)
    g = load_guardrails()
    evidence = {p.name: PoolEvidence(p.name) for p in fleet.pools}
    evidence["ts-underused"] = PoolEvidence("ts-underused", coverage=1.0, utilization_mean=0.02,
                                            utilization_p95=0.03, allocated_mean=8, allocated_p95=8,
                                            replica_memory_p95_bytes=1 * GIB)
    rec: Recommendation = next(r for r in recommend(fleet, g, evidence, "7d") if r.pool == "ts-underused")
    assert rec.replicas_proposed == g.environment("dev").max_shared_replicas["medium"]


def test_busy_mig_instances_stay() -> None:
    fleet = resolve(ENV, PROFILES)
    evidence = {p.name: PoolEvidence(p.name) for p in fleet.pools}
    evidence["mig-idle"] = PoolEvidence("mig-idle", coverage=1.0, utilization_mean=0.7, utilization_p95=0.8, mig={
        "4g.40gb": MigEvidence("4g.40gb", 4, 0.85, 30 * GIB, 4),
        "3g.40gb": MigEvidence("3g.40gb", 4, 0.9, 35 * GIB, 4)})
    rec = next(r for r in recommend(fleet, load_guardrails(), evidence, "7d") if r.pool == "mig-idle")
    assert rec.mig_layout_proposed is None and not rec.gaps


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_recording_rules_give_the_same_recommendations(backfilled: tuple[Path, int], report: dict[str, Any],
                                                       tmp_path: Path) -> None:
    """Where gpushare's recording rules have run (here: backfilled by evaluating them with promtool, level by
    level), capacity reads their pool-level series instead of the raw ones, and concludes the same."""
    import shutil

    from gpushare.render.monitoring import prometheus_rule_groups
    from tests.prometheus.scenarios import backfill_recording_rules

    data, end = backfilled
    copy = tmp_path / "data"
    shutil.copytree(data, copy, ignore=shutil.ignore_patterns("wal", "chunks_head", "lock", "queries.active"))
    groups = prometheus_rule_groups(resolve(ENV, PROFILES), load_guardrails())
    backfill_recording_rules(groups, copy, tmp_path, end - HOURS * 3600, end)
    with prometheus_server(copy, tmp_path) as url:
        result = runner.invoke(app, ["capacity", "--env", str(ENV), "--prometheus", url, "--window", f"{HOURS}h",
                                     "--end", str(end), "--json", "--patch", str(tmp_path / "p.patch")])
    assert result.exit_code == 0, result.output
    recorded = json.loads(result.stdout)
    assert recorded["source"] == "recording rules" and report["source"] == "raw exporter series"
    for pool in ("ts-underused", "ts-contended", "ts-membound", "mig-idle"):
        a, b = _pool(report, pool), _pool(recorded, pool)
        assert b["evidence_figures"]["utilization_mean"] == pytest.approx(a["evidence_figures"]["utilization_mean"],
                                                                          abs=0.02)
        for key in ("replicas_proposed", "gpus_proposed", "mig_layout_proposed"):
            assert b[key] == a[key], (pool, key)
