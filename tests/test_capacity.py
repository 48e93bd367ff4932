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
from gpushare.core.resolve import ResolvedFleet, resolve
from gpushare.ops.capacity import GIB, MigEvidence, PoolEvidence, Recommendation, recommend
from gpushare.render.monitoring.promql import LEGACY_HOST_LABEL
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
        # Same, but every pod holds 18 GiB: memory, not compute, limits the replicas. Its exporter predates
        # 4.6.0-4.8.3 and writes Hostname, as does mig-idle's; the others write hostname.
        PoolLoad("ts-membound", "NVIDIA L40S", 46068, {"membound-1": 4}, "inference", util=0.1, replicas=2,
                 pod_memory_mib=18432, resource="nvidia_com_gpu_shared", host_label=LEGACY_HOST_LABEL),
        # MIG 4g + 3g instances that hold 3 GiB and are 5% busy.
        PoolLoad("mig-idle", "NVIDIA H100 80GB HBM3", 81559, {"mig-1": 2, "mig-2": 2}, "llm", util=0.05,
                 swing=0.01, mig={"4g.40gb": (1, 40448), "3g.40gb": (1, 40448)}, pod_memory_mib=3072,
                 queue="tenant-llm", host_label=LEGACY_HOST_LABEL),
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
    # Earlier spans of the same TSDB (one server for the module): shared demand, and an exporter without hostname.
    backfill(_shared_demand(end - SHARED_DEMAND_AGO), work, data)
    backfill(_no_hostname(end - NO_HOSTNAME_AGO), work, data)
    backfill(_node_gap(end - NODE_GAP_AGO), work, data)
    backfill(_no_pool_label(end - NO_POOL_LABEL_AGO), work, data)
    backfill(_fqdn_hostname(end - FQDN_HOSTNAME_AGO), work, data)
    backfill(_mig_only_demand(end - MIG_ONLY_DEMAND_AGO), work, data)
    backfill(_mig_only_demand(end - GATED_DEMAND_AGO, gated=True), work, data)
    return data, end


SHARED_DEMAND_AGO, NO_HOSTNAME_AGO, NODE_GAP_AGO = 86400, 2 * 86400, 3 * 86400
NO_POOL_LABEL_AGO, FQDN_HOSTNAME_AGO, MIG_ONLY_DEMAND_AGO = 4 * 86400, 5 * 86400, 6 * 86400
GATED_DEMAND_AGO = 7 * 86400
NODE_GAP = (20 * 60, 100 * 60)  # seconds into the node-gap scenario's two hours: under-2's exporter sent nothing


def _shared_demand(end: int) -> Scenario:
    """Two pending workloads in tenant-inference's queue, which reaches ts-underused and ts-membound (both serve
    nvidia.com/gpu.shared), and two unschedulable pods asking for mig-3g.40gb, which only mig-idle has, where the
    3g.40gb instances are saturated and the 4g.40gb ones idle."""
    return Scenario(start=end - 2 * 3600, end=end, pools=[
        PoolLoad("ts-underused", "NVIDIA L40S", 46068, {"under-1": 2, "under-2": 2}, "inference", util=0.3,
                 replicas=2, pod_memory_mib=4096, resource="nvidia_com_gpu_shared", queue="tenant-inference",
                 pending=2, wait_seconds=2400),
        PoolLoad("ts-membound", "NVIDIA L40S", 46068, {"membound-1": 4}, "inference", util=0.1, replicas=2,
                 pod_memory_mib=4096, resource="nvidia_com_gpu_shared"),
        PoolLoad("mig-idle", "NVIDIA H100 80GB HBM3", 81559, {"mig-1": 2, "mig-2": 2}, "llm", util=0.05,
                 swing=0.01, mig={"4g.40gb": (1, 40448), "3g.40gb": (1, 40448)}, pod_memory_mib=3072,
                 mig_util={"3g.40gb": 0.99}, unschedulable=("nvidia_com_mig_3g_40gb", 2)),
    ])


def _mig_only_demand(end: int, gated: bool = False) -> Scenario:
    """mig-idle's 3g.40gb instances saturated and two workloads in tenant-llm's queue waiting 40 minutes for 3g.40gb
    instances (Kueue's pending requests per resource say so); with llm_reaching_shared_pools, the same queue also
    reaches the two time-sliced pools, which are moderately busy and have no waiting work of their own.

    `gated`: the same from a Kueue without metrics.enableClusterQueueResources: the queue says only that two workloads
    wait (no pending requests per resource), and its two pods wait behind Kueue's scheduling gate asking for
    mig-3g.40gb, which only mig-idle advertises."""
    waiting: dict[str, Any] = ({"gated": ("nvidia_com_mig_3g_40gb", 2)} if gated
                               else {"pending_resources": {"nvidia.com/mig-3g.40gb": 2}})
    return Scenario(start=end - 2 * 3600, end=end, pools=[
        PoolLoad("ts-underused", "NVIDIA L40S", 46068, {"under-1": 2, "under-2": 2}, "inference", util=0.5,
                 replicas=2, pod_memory_mib=4096, resource="nvidia_com_gpu_shared"),
        PoolLoad("ts-membound", "NVIDIA L40S", 46068, {"membound-1": 4}, "inference", util=0.5, replicas=2,
                 pod_memory_mib=4096, resource="nvidia_com_gpu_shared"),
        PoolLoad("mig-idle", "NVIDIA H100 80GB HBM3", 81559, {"mig-1": 2, "mig-2": 2}, "llm", util=0.5,
                 swing=0.01, mig={"4g.40gb": (1, 40448), "3g.40gb": (1, 40448)}, pod_memory_mib=3072,
                 mig_util={"3g.40gb": 0.99, "4g.40gb": 0.5}, queue="tenant-llm", pending=2, wait_seconds=2400,
                 **waiting),
    ])


def _node_gap(end: int) -> Scenario:
    """ts-underused over two hours, with under-2's dcgm-exporter silent for 80 minutes in the middle; one workload
    in tenant-inference's queue asks for 3 nvidia.com/gpu.shared, as Kueue reports with enableClusterQueueResources."""
    start = end - 2 * 3600
    return Scenario(start=start, end=end, pools=[
        PoolLoad("ts-underused", "NVIDIA L40S", 46068, {"under-1": 2, "under-2": 2}, "inference", util=0.3,
                 replicas=2, pod_memory_mib=4096, resource="nvidia_com_gpu_shared",
                 dcgm_gap=(start + NODE_GAP[0], start + NODE_GAP[1], "under-2"), queue="tenant-inference",
                 pending=1, pending_resources={"nvidia.com/gpu.shared": 3, "cpu": 8})])


def _no_pool_label(end: int) -> Scenario:
    """kube-state-metrics without the label allowlist: kube_node_labels has no label_gpushare_io_pool."""
    return Scenario(start=end - 3600, end=end, pools=[
        PoolLoad("ts-underused", "NVIDIA L40S", 46068, {"under-1": 2}, "inference", util=0.3, replicas=2,
                 resource="nvidia_com_gpu_shared", pool_label=False)])


def _fqdn_hostname(end: int) -> Scenario:
    """dcgm-exporter outside Kubernetes' NODE_NAME: the node label is the host's FQDN, not the node's name (and an
    exporter before 4.6.0-4.8.3 writes it as Hostname)."""
    return Scenario(start=end - 3600, end=end, pools=[
        PoolLoad("ts-underused", "NVIDIA L40S", 46068, {"under-1": 2}, "inference", util=0.3, replicas=2,
                 resource="nvidia_com_gpu_shared", hostname_suffix=".lab.example.net", host_label=LEGACY_HOST_LABEL)])


def _no_hostname(end: int) -> Scenario:
    """dcgm-exporter started with --no-hostname: its series carry no hostname label."""
    return Scenario(start=end - 3600, end=end, pools=[
        PoolLoad("ts-underused", "NVIDIA L40S", 46068, {"under-1": 2}, "inference", util=0.3, replicas=2,
                 resource="nvidia_com_gpu_shared", hostname=False)])


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
    # More GPUs are wanted, but a bare-metal pool grows only by hosts someone adds: the patch writes the replicas.
    assert p["gpus_proposed"] == p["gpus_now"] and p["in_patch"]
    assert any(n.startswith("bare-metal pools grow by adding hosts: add ") for n in p["notes"]), p["notes"]
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


def _apply_patch(text: str, tmp_path: Path) -> ResolvedFleet:
    """Apply the patch to copies of the environment and profiles and resolve them: every layout and quota holds."""
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
    return resolve(tmp_path / "tests" / "prometheus" / "capacity" / "dev.yaml", profiles)


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_patch_is_written_not_applied_and_resolves(report: dict[str, Any], tmp_path: Path) -> None:
    text = (Path(report["_out"]) / "dev.patch").read_text()
    assert ENV.read_text() == (ROOT / "tests" / "prometheus" / "capacity" / "dev.yaml").read_text()
    assert "+++ b/tests/prometheus/capacity/dev.yaml" in text
    assert "profiles/mig-idle-mig.yaml" in text
    fleet = _apply_patch(text, tmp_path)
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
    assert "has no DCGM utilization series" in json.loads(result.stdout)["errors"][0]


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


# ---------------------------------------------------------------- the proposal: independent pools, grouped changes


def _two_mig_pools(tmp_path: Path) -> Path:
    """dev with a second MIG pool like mig-idle in the same cluster: both advertise mig-3g.40gb and mig-4g.40gb."""
    data = yaml.safe_load(ENV.read_text())
    data["pools"].insert(3, {"name": "mig-idle-b", "cluster": "metal-a", "purpose": "inference",
                             "gpu_model": "NVIDIA H100 80GB HBM3", "profile": "mig-llm-serving",
                             "hosts": [{"name": "migb-1", "address": "10.98.4.1", "gpu_count": 2}]})
    env = tmp_path / "environments" / "dev.yaml"
    env.parent.mkdir()
    env.write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "profiles").mkdir()
    for path in PROFILES.glob("*.yaml"):
        (tmp_path / "profiles" / path.name).write_text(path.read_text())
    return env


def _idle_mig(pool: str) -> PoolEvidence:
    return PoolEvidence(pool, coverage=1.0, utilization_mean=0.05, utilization_p95=0.06, mig={
        p: MigEvidence(p, 1, 0.05, 3 * GIB, 1) for p in ("4g.40gb", "3g.40gb")})


def test_two_mig_pools_dropping_one_resource_move_its_quota_together(tmp_path: Path) -> None:
    from gpushare.ops.capacity import propose

    fleet = resolve(_two_mig_pools(tmp_path), tmp_path / "profiles")
    evidence = {p.name: PoolEvidence(p.name) for p in fleet.pools}
    evidence.update({p: _idle_mig(p) for p in ("mig-idle", "mig-idle-b")})
    recs = recommend(fleet, load_guardrails(), evidence, "7d")
    proposal = propose(fleet, load_guardrails(), recs)
    assert set(proposal.applied) == {"mig-idle", "mig-idle-b"} and not proposal.withheld
    text = next(new for rel, (_old, new) in proposal.files.items() if rel.endswith("dev.yaml"))
    llm = next(t for t in yaml.safe_load(text)["tenants"] if t["name"] == "llm")
    assert not any(k in llm["quota"] for k in ("nvidia.com/mig-3g.40gb", "nvidia.com/mig-4g.40gb")), llm["quota"]
    # The same hardware share: every 3g and 4g instance became smaller ones, and the quota followed.
    assert sum(llm["quota"].values()) > 8


def test_a_proposed_profile_describes_its_own_replicas() -> None:
    """A profile made from inference-ts2 ("Two light inference services per GPU") with more replicas says how many
    it has, not how many its source had."""
    from gpushare.ops.capacity import propose
    from gpushare.ops.capacity.proposal import shared_description

    fleet = resolve(ENV, PROFILES)
    g = load_guardrails()
    evidence = {p.name: PoolEvidence(p.name) for p in fleet.pools}
    evidence["ts-underused"] = PoolEvidence("ts-underused", coverage=1.0, utilization_mean=0.1, utilization_p95=0.15,
                                            allocated_mean=8, allocated_p95=8, replica_memory_p95_bytes=4 * GIB)
    proposal = propose(fleet, g, recommend(fleet, g, evidence, "7d"))
    made = [yaml.safe_load(new) for rel, (_old, new) in proposal.files.items() if "profiles/" in rel]
    (profile,) = [p for p in made if p.get("time_slicing")]
    replicas = profile["time_slicing"]["replicas"]
    assert replicas != 2 and profile["description"].startswith(f"{replicas} pods take turns on each GPU. "), profile
    assert "Two" not in profile["description"] and "inference-ts2 (2 replicas)" in profile["description"]
    assert shared_description("mps", 3, "mps-4 (4 replicas)").startswith(
        "3 MPS clients per GPU, each limited to 1/3 of its memory and SMs.")


def test_a_change_that_does_not_resolve_is_withheld_and_the_rest_is_written(tmp_path: Path) -> None:
    from gpushare.ops.capacity import CapacityReport, Proposal, propose

    fleet = resolve(_two_mig_pools(tmp_path), tmp_path / "profiles")
    g = load_guardrails()
    evidence = {p.name: PoolEvidence(p.name) for p in fleet.pools}
    evidence["mig-idle"] = _idle_mig("mig-idle")
    evidence["ts-underused"] = PoolEvidence("ts-underused", coverage=1.0, utilization_mean=0.1, utilization_p95=0.15,
                                            allocated_mean=8, allocated_p95=8, replica_memory_p95_bytes=4 * GIB)
    recs = recommend(fleet, g, evidence, "7d")
    broken = next(rc for rc in recs if rc.pool == "mig-idle-b")
    # A layout that cannot fit (4 + 3 + 3 compute slices of 7), as if from a bug: it must not hold the others back.
    broken.mig_layout_proposed, broken.gpus_proposed, broken.gaps = {"4g.40gb": 1, "3g.40gb": 2}, broken.gpus_now, []
    proposal = propose(fleet, g, recs)
    assert "mig-idle-b" in proposal.withheld and "ts-underused" in proposal.applied and "mig-idle" in proposal.applied
    assert "gpushare-capacity-" not in proposal.withheld["mig-idle-b"]  # never a temporary path
    assert "environments/dev.yaml" in proposal.withheld["mig-idle-b"]
    assert "profiles/mig-idle-b-mig.yaml" not in proposal.patch and "profiles/mig-idle-mig.yaml" in proposal.patch
    # The summary equals the patch: GPUs freed are those of the pools whose change is in it.
    report = CapacityReport(fleet, "7d", 0.0, "raw", evidence, recs, proposal, tmp_path / "p.patch", 0.0, 0)
    assert report.gpus_freed == sum(rc.gpus_freed for rc in recs if rc.pool in proposal.applied)
    under = next(rc for rc in recs if rc.pool == "ts-underused")
    assert under.gpus_freed == 2 and "host under-2 leaves the pool (2 GPUs freed)" in under.notes
    assert "-      - {name: under-2" in proposal.patch or "under-2" in proposal.patch
    empty = Proposal()
    assert CapacityReport(fleet, "7d", 0.0, "raw", evidence, recs, empty, tmp_path / "p.patch", 0.0, 0).gpus_freed == 0


# ---------------------------------------------------------------- both directions for every sharing kind


def _mig_rec(**figures: Any) -> Recommendation:
    fleet = resolve(ENV, PROFILES)
    evidence = {p.name: PoolEvidence(p.name) for p in fleet.pools}
    evidence["mig-idle"] = PoolEvidence("mig-idle", coverage=1.0, **figures)
    return next(r for r in recommend(fleet, load_guardrails(), evidence, "7d") if r.pool == "mig-idle")


def test_saturated_mig_instances_grow_and_a_queueing_pool_gets_gpus() -> None:
    """3g.40gb instances at 100% p95 with 40-minute waits: a larger instance (room from the idle 4g.40gb) and GPUs."""
    rec = _mig_rec(utilization_mean=0.6, utilization_p95=1.0, pending_mean=3, queue_wait_seconds=2400, mig={
        "4g.40gb": MigEvidence("4g.40gb", 4, 0.1, 5 * GIB, 4), "3g.40gb": MigEvidence("3g.40gb", 4, 1.0, 20 * GIB, 4)})
    model = resolve(ENV, PROFILES).pool("mig-idle").nodes[0].gpu_model
    proposed = rec.mig_layout_proposed
    assert proposed and max(model.profiles[p].compute_slices for p in proposed) > 3
    assert check_layout(model, layout_from_counts(proposed), 580).ok
    assert rec.gpus_proposed is not None and rec.gpus_proposed > rec.gpus_now
    assert any("saturated (100% busy at p95)" in x for x in rec.reasons)
    assert any("the pool queues (3.0 pending, waits up to 40 min)" in x for x in rec.reasons)
    # Quotas follow the hardware: llm's 4 x 3g.40gb and 4 x 4g.40gb become 4 x 7g.80gb (3/7 + 4/7 of each).
    from gpushare.ops.capacity import propose

    proposal = propose(resolve(ENV, PROFILES), load_guardrails(), [rec])
    assert proposal.applied == ["mig-idle"] and "quota: {nvidia.com/mig-7g.80gb: 4}" in proposal.patch
    assert "workloads that ask for nvidia.com/mig-4g.40gb must ask for nvidia.com/mig-7g.80gb" in rec.notes


def test_mig_instances_near_their_framebuffer_get_more_memory() -> None:
    rec = _mig_rec(utilization_mean=0.3, utilization_p95=0.4, mig={
        "4g.40gb": MigEvidence("4g.40gb", 4, 0.1, 5 * GIB, 4),
        "3g.40gb": MigEvidence("3g.40gb", 4, 0.4, 0.97 * 40 * GIB, 4)})
    model = resolve(ENV, PROFILES).pool("mig-idle").nodes[0].gpu_model
    proposed = rec.mig_layout_proposed
    assert proposed and "3g.40gb" not in proposed
    assert max(model.profiles[p].memory_gib for p in proposed) > 40
    assert any("near their framebuffer (38.8 of " in x and "7g.80gb" in x for x in rec.reasons)
    assert rec.gpus_proposed == rec.gpus_now  # no queue: no more GPUs
    from gpushare.ops.capacity import relieves

    assert relieves(rec)  # combined before savings, queue or not


def test_busy_but_quickly_admitted_work_adds_no_gpus() -> None:
    """Pending workloads admitted within monitoring.queue_wait_seconds: busy, not queued."""
    fleet = resolve(ENV, PROFILES)
    evidence = {p.name: PoolEvidence(p.name) for p in fleet.pools}
    evidence["ts-contended"] = PoolEvidence("ts-contended", coverage=1.0, utilization_mean=0.5, utilization_p95=0.6,
                                            allocated_mean=16, allocated_p95=16, pending_mean=4, queue_wait_seconds=60,
                                            replica_memory_p95_bytes=4 * GIB)
    rec = next(r for r in recommend(fleet, load_guardrails(), evidence, "7d") if r.pool == "ts-contended")
    assert rec.gpus_proposed is not None and rec.gpus_proposed <= rec.gpus_now
    assert not any("queues" in x for x in rec.reasons)


def test_durations_and_counts_read_as_people_write_them() -> None:
    from gpushare.core.coverage import coverage_gaps, duration_text, gaps_text
    from gpushare.ops.promote import _days, _num

    assert [duration_text(s) for s in (45, 2400, 5400, 7200, 172800)] == ["45 s", "40 min", "1.5 h", "2 h", "2 d"]
    assert _days(1800) == "30 min" and _days(7 * 86400) == "7.0 d"
    assert _num({"value": [0, "1.00024"]}) == "1" and _num({"value": [0, "2.97"]}) == "3"
    gaps = coverage_gaps([0, 3600, 7200, 5 * 3600], 0, 6 * 3600, 3600)
    assert [g.text() for g in gaps] == ["no data 1970-01-01 02:00 UTC to 1970-01-01 04:00 UTC (2 h)",
                                        "no data 1970-01-01 05:00 UTC to 1970-01-01 06:00 UTC (1 h)"]
    assert gaps[0].as_dict() == {"from": "1970-01-01T02:00:00Z", "to": "1970-01-01T04:00:00Z", "seconds": 7200}
    assert gaps_text(gaps, shown=1) == "no data 1970-01-01 02:00 UTC to 1970-01-01 04:00 UTC (2 h) and 1 more gaps"
    assert coverage_gaps([0, 3600], 0, 3600, 3600) == []


# ------------------------------------------------------- demand attribution and join diagnosis (real Prometheus)


def _capacity(url: str, end: int, window: str, tmp_path: Path) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["capacity", "--env", str(ENV), "--prometheus", url, "--window", window,
                                 "--end", str(end), "--json", "--patch", str(tmp_path / "p.patch")])
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_one_queue_reaching_two_pools_counts_its_work_once(prometheus: tuple[str, int], tmp_path: Path) -> None:
    url, end = prometheus
    code, data = _capacity(url, end - SHARED_DEMAND_AGO, "2h", tmp_path)
    assert code == 0, data
    pending = {p["pool"]: p["evidence_figures"]["pending_mean"] for p in data["pools"]}
    # Two workloads in a queue that reaches two pools: one in each, not two in each.
    assert pending["ts-underused"] == pytest.approx(1) and pending["ts-membound"] == pytest.approx(1)
    # Pods asking for mig-3g.40gb count only in the pool that advertises it.
    assert pending["mig-idle"] == pytest.approx(2)
    assert pending["ts-contended"] == 0  # nothing pending is 0 pending, counted in the mean
    # The saturated, queueing MIG pool grows: a larger instance where the idle one was, and (hosts to add) GPUs.
    mig = _pool(data, "mig-idle")
    assert mig["mig_layout_proposed"] == {"7g.80gb": 1} and mig["gpus_proposed"] == mig["gpus_now"]
    assert any(n.startswith("bare-metal pools grow by adding hosts") for n in mig["notes"]), mig["notes"]
    assert any("3g.40gb instances are saturated" in x for x in mig["reasons"])
    assert any("the pool queues (2.0 pending, waits up to 2 h)" in x for x in mig["reasons"]), mig["reasons"]
    # Every change holds alone, not all together (fewer MIG instances and more replicas pass the environment's
    # oversubscription limit). Relief for the queueing pool is combined first, then the savings: the growth is in
    # the written patch, and the change that would break the limit is withheld with that reason.
    assert mig["in_patch"] and mig["withheld"] is None and _pool(data, "ts-underused")["in_patch"]
    membound = _pool(data, "ts-membound")
    assert not membound["in_patch"]
    assert "holds alone but not together with mig-idle, ts-underused" in membound["withheld"]
    assert "oversubscription-limit" in membound["withheld"]
    fleet = _apply_patch((tmp_path / "p.patch").read_text(), tmp_path)
    assert fleet.pool("mig-idle").nodes[0].mig_layout == {"7g.80gb": 1}
    assert fleet.pool("ts-membound").profile == "inference-ts2"
    llm = next(t for t in fleet.tenants if t.name == "llm")
    assert llm.quota == {"nvidia.com/mig-7g.80gb": 4}  # 4 x (3/7 + 4/7) of the replaced instances


def llm_reaching_shared_pools(tmp_path: Path) -> Path:
    """dev where tenant llm also has time-sliced quota: its Kueue queue reaches ts-underused and ts-membound too."""
    data = yaml.safe_load(ENV.read_text())
    tenants = {t["name"]: t for t in data["tenants"]}
    tenants["llm"]["quota"]["nvidia.com/gpu.shared"] = 4
    tenants["inference"]["quota"]["nvidia.com/gpu.shared"] = 12  # the two pools advertise 16
    env = tmp_path / "envs" / "dev.yaml"
    env.parent.mkdir()
    env.write_text(yaml.safe_dump(data, sort_keys=False))
    return env


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_work_waiting_for_one_pools_mig_profile_grows_only_that_pool(prometheus: tuple[str, int],
                                                                      tmp_path: Path) -> None:
    from gpushare.render.monitoring.rules import queues_by_pool

    url, end = prometheus
    env = llm_reaching_shared_pools(tmp_path)
    fleet = resolve(env, PROFILES)
    queues, _ = queues_by_pool(fleet, load_guardrails(), [p for p in fleet.pools if p.cluster == "metal-a"])
    assert all("tenant-llm" in queues[p] for p in ("mig-idle", "ts-underused", "ts-membound"))  # the premise
    result = runner.invoke(app, ["capacity", "--env", str(env), "--prometheus", url, "--window", "2h", "--end",
                                 str(end - MIG_ONLY_DEMAND_AGO), "--json", "--patch", str(tmp_path / "p.patch")])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    pending = {p["pool"]: p["evidence_figures"]["pending_mean"] for p in data["pools"]}
    # The waiting work asks for 3g.40gb, which only mig-idle advertises: it counts there, whole, and nowhere else.
    assert pending["mig-idle"] == pytest.approx(2)
    assert pending["ts-underused"] == 0 and pending["ts-membound"] == 0
    mig = _pool(data, "mig-idle")
    assert any("the pool queues (2.0 pending" in x for x in mig["reasons"]), mig["reasons"]
    for name in ("ts-underused", "ts-membound"):
        pool = _pool(data, name)
        assert not any("queues" in x for x in pool["reasons"]), (name, pool["reasons"])
        assert pool["gpus_proposed"] <= pool["gpus_now"], (name, pool)


@pytest.mark.slow  # a real Prometheus server over backfilled series
@pytest.mark.parametrize("source", ["raw", "recorded"])
def test_work_waiting_behind_kueues_gate_counts_where_its_pods_resources_are(
        prometheus: tuple[str, int], backfilled: tuple[Path, int], tmp_path: Path, source: str) -> None:
    """Kueue without per-resource pending metrics: tenant-llm's queue reaches mig-idle and both time-sliced pools, and
    its two waiting workloads were split three ways, so the time-sliced pools, which advertise nothing the waiting
    pods ask for, were charged with them. Attributed by the gated pods' requests (mig-3g.40gb), they count on mig-idle
    only, raw and through the recording rules alike."""
    from gpushare.render.monitoring.rules import queues_by_pool

    url, end = prometheus
    env = llm_reaching_shared_pools(tmp_path)
    fleet = resolve(env, PROFILES)
    queues, _ = queues_by_pool(fleet, load_guardrails(), [p for p in fleet.pools if p.cluster == "metal-a"])
    assert all("tenant-llm" in queues[p] for p in ("mig-idle", "ts-underused", "ts-membound"))  # the premise
    at = end - GATED_DEMAND_AGO
    args = ["capacity", "--env", str(env), "--window", "2h", "--end", str(at), "--json", "--source", source,
            "--patch", str(tmp_path / "p.patch")]
    if source == "raw":
        result = runner.invoke(app, [*args, "--prometheus", url])
    else:  # the rules rendered for this environment, evaluated by promtool over the scenario's span
        import shutil

        from gpushare.render.monitoring import prometheus_rule_groups
        from tests.prometheus.scenarios import backfill_recording_rules

        data_dir = tmp_path / "data"
        shutil.copytree(backfilled[0], data_dir,
                        ignore=shutil.ignore_patterns("wal", "chunks_head", "lock", "queries.active"))
        backfill_recording_rules(prometheus_rule_groups(fleet, load_guardrails()), data_dir, tmp_path,
                                 at - 2 * 3600, at)
        with prometheus_server(data_dir, tmp_path) as recorded_url:
            result = runner.invoke(app, [*args, "--prometheus", recorded_url])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    pending = {p["pool"]: p["evidence_figures"]["pending_mean"] for p in data["pools"]}
    assert pending["mig-idle"] == pytest.approx(2, abs=0.1), pending
    assert pending["ts-underused"] == pytest.approx(0, abs=0.01), pending
    assert pending["ts-membound"] == pytest.approx(0, abs=0.01), pending
    for name in ("ts-underused", "ts-membound"):
        assert not any("queues" in x for x in _pool(data, name)["reasons"]), (name, _pool(data, name)["reasons"])


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_dcgm_series_without_hostname_name_the_missing_label(prometheus: tuple[str, int], tmp_path: Path) -> None:
    url, end = prometheus
    code, data = _capacity(url, end - NO_HOSTNAME_AGO, "1h", tmp_path)
    assert code == 1
    error = data["errors"][0]
    assert "DCGM series have no hostname label" in error and 'UUID="GPU-under-1-0"' in error
    assert "--no-hostname" in error and "DCGM_EXPORTER_NO_HOSTNAME" in error and "NODE_NAME" in error


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_node_labels_without_the_pool_label_name_the_allowlist(prometheus: tuple[str, int], tmp_path: Path) -> None:
    url, end = prometheus
    code, data = _capacity(url, end - NO_POOL_LABEL_AGO, "1h", tmp_path)
    assert code == 1
    error = data["errors"][0]
    assert "kube_node_labels has no label_gpushare_io_pool label" in error and 'node="under-1"' in error
    assert "--metric-labels-allowlist=nodes=[" in error and "gpushare.io/pool" in error


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_hostnames_that_match_no_node_are_shown_beside_the_nodes(prometheus: tuple[str, int], tmp_path: Path) -> None:
    url, end = prometheus
    code, data = _capacity(url, end - FQDN_HOSTNAME_AGO, "1h", tmp_path)
    assert code == 1
    error = data["errors"][0]
    assert "hostname values (e.g. under-1.lab.example.net) match no node" in error and "under-1)" in error
    assert "NODE_NAME" in error


def test_nodes_with_little_or_no_data_are_named() -> None:
    fleet = resolve(ENV, PROFILES)
    evidence = {p.name: PoolEvidence(p.name) for p in fleet.pools}
    evidence["ts-contended"] = PoolEvidence("ts-contended", coverage=0.9, utilization_mean=0.5, utilization_p95=0.6,
                                            allocated_mean=8, allocated_p95=8, replica_memory_p95_bytes=4 * GIB,
                                            node_coverage={"busy-1": 0.3})
    rec = next(r for r in recommend(fleet, load_guardrails(), evidence, "7d") if r.pool == "ts-contended")
    assert "node busy-1 reported in 30% of the window (capacity.min_coverage 50%): its GPUs count only while they " \
           "reported" in rec.notes
    assert "node busy-2 sent no DCGM series in the window" in rec.notes


@pytest.mark.slow  # a real Prometheus server over backfilled series
def test_a_node_with_a_gap_is_named_with_its_dates(prometheus: tuple[str, int], tmp_path: Path) -> None:
    import calendar

    from gpushare.core.coverage import Gap

    url, end = prometheus
    at = end - NODE_GAP_AGO
    code, data = _capacity(url, at, "2h", tmp_path)
    assert code == 0, data
    pool = _pool(data, "ts-underused")
    gaps = pool["evidence_figures"]["node_gaps"]
    assert list(gaps) == ["under-2"] and len(gaps["under-2"]) == 1, gaps  # under-1 reported throughout
    gap = gaps["under-2"][0]
    start = at - 2 * 3600
    began = calendar.timegm(time.strptime(gap["from"], "%Y-%m-%dT%H:%M:%SZ"))
    # Dated to the step (5 min) where the silence began, and as long as it (give or take a step and a lookback).
    assert abs(began - (start + NODE_GAP[0])) <= 300 and abs(gap["seconds"] - 80 * 60) <= 600, gap
    note = next(n for n in pool["notes"] if n.startswith("node under-2 reported in"))
    assert f"({Gap(began, began + gap['seconds']).text()})" in note, note
    # Kueue's pending requests per resource: 3 replicas over the two pools the queue reaches that advertise them
    # (not the one workload split in two).
    pending = {p["pool"]: p["evidence_figures"]["pending_mean"] for p in data["pools"]}
    assert pending["ts-underused"] == pytest.approx(1.5) and pending["ts-membound"] == pytest.approx(1.5)
    assert pending["mig-idle"] == 0


def _time_sliced_mig(tmp_path: Path, layout: str = "all-smallest") -> ResolvedFleet:
    """dev with mig-idle on time-sliced MIG instances (all-smallest: 1g.10gb x7 on H100), each shared by two pods."""
    env = _two_mig_pools(tmp_path)
    (tmp_path / "profiles" / "mig-ts2.yaml").write_text(yaml.safe_dump({
        "name": "mig-ts2", "kind": "mig-time-slicing", "mig": {"layout": layout}, "time_slicing": {"replicas": 2}}))
    data = yaml.safe_load(env.read_text())
    data["pools"] = [p for p in data["pools"] if p["name"] != "mig-idle-b"]
    next(p for p in data["pools"] if p["name"] == "mig-idle")["profile"] = "mig-ts2"
    next(t for t in data["tenants"] if t["name"] == "llm")["quota"] = {"nvidia.com/mig-1g.10gb.shared": 8}
    env.write_text(yaml.safe_dump(data, sort_keys=False))
    return resolve(env, tmp_path / "profiles")


def test_saturated_time_sliced_mig_instances_grow_with_the_same_replicas(tmp_path: Path) -> None:
    from gpushare.ops.capacity import propose

    fleet = _time_sliced_mig(tmp_path)
    evidence = {p.name: PoolEvidence(p.name) for p in fleet.pools}
    evidence["mig-idle"] = PoolEvidence("mig-idle", coverage=1.0, utilization_mean=0.6, utilization_p95=1.0,
                                        pending_mean=3, queue_wait_seconds=2400,
                                        mig={"1g.10gb": MigEvidence("1g.10gb", 28, 1.0, 9.5 * GIB, 28)})
    rec = next(r for r in recommend(fleet, load_guardrails(), evidence, "7d") if r.pool == "mig-idle")
    model = fleet.pool("mig-idle").nodes[0].gpu_model
    proposed = rec.mig_layout_proposed
    assert proposed and max(model.profiles[p].compute_slices for p in proposed) >= 2
    assert check_layout(model, layout_from_counts(proposed), 580).ok
    # Never more replicas: memory-bound work gets a larger instance, not a thinner share of one.
    assert rec.replicas_proposed == rec.replicas_now == 2 and rec.mig_grows
    assert any("1g.10gb instances are saturated (100% busy at p95)" in x for x in rec.reasons)
    # Three waiting pods over 2 replicas of each proposed instance: one more GPU.
    assert rec.gpus_proposed == rec.gpus_now + 1
    proposal = propose(fleet, load_guardrails(), [rec])
    assert proposal.applied == ["mig-idle"], proposal.withheld
    profile = yaml.safe_load(next(new for rel, (_old, new) in proposal.files.items() if rel.endswith("-mig.yaml")))
    assert profile["kind"] == "mig-time-slicing" and profile["time_slicing"]["replicas"] == 2


def test_idle_time_sliced_mig_instances_are_not_split_and_say_why(tmp_path: Path) -> None:
    fleet = _time_sliced_mig(tmp_path, "balanced")
    layout = fleet.pool("mig-idle").nodes[0].mig_layout or {}
    assert "3g.40gb" in layout  # a plain MIG pool this idle would split it (test_idle_mig_pool_gets_smaller_...)
    evidence = {p.name: PoolEvidence(p.name) for p in fleet.pools}
    evidence["mig-idle"] = PoolEvidence("mig-idle", coverage=1.0, utilization_mean=0.05, utilization_p95=0.06,
                                        mig={p: MigEvidence(p, 4 * n, 0.05, 1 * GIB, 2) for p, n in layout.items()})
    rec = next(r for r in recommend(fleet, load_guardrails(), evidence, "7d") if r.pool == "mig-idle")
    assert rec.mig_layout_proposed is None and not rec.changes
    assert any("idle, but not split: their 2 replicas already share each one" in x for x in rec.reasons), rec.reasons


# ---------------------------------------------------------------- the patch writes what the summary says


def _resize_rec(fleet: ResolvedFleet, pool: str, gpus: int) -> Recommendation:
    p = fleet.pool(pool)
    return Recommendation(pool, p.sharing, p.totals.physical_gpus, gpus_proposed=gpus, reasons=["test"])


def test_a_bare_metal_pool_that_should_grow_or_shrink_by_less_than_a_host_is_not_in_the_patch() -> None:
    from gpushare.ops.capacity import propose

    fleet = resolve(ENV, PROFILES)
    grow, trim = _resize_rec(fleet, "ts-contended", 6), _resize_rec(fleet, "ts-underused", 3)
    proposal = propose(fleet, load_guardrails(), [grow, trim])
    assert proposal.applied == [] and proposal.patch == "" and not proposal.files
    assert "bare-metal pools grow by adding hosts: add 2 GPUs' worth of hosts" in proposal.withheld["ts-contended"]
    assert "only whole hosts leave" in proposal.withheld["ts-underused"]


def test_the_patch_touches_only_the_edited_lines_and_gpus_proposed_is_what_it_writes() -> None:
    from gpushare.ops.capacity import propose

    fleet = resolve(ENV, PROFILES)
    grow, shrink = _resize_rec(fleet, "ts-contended", 6), _resize_rec(fleet, "ts-underused", 1)
    proposal = propose(fleet, load_guardrails(), [grow, shrink])
    assert proposal.applied == ["ts-underused"] and "ts-contended" in proposal.withheld
    assert shrink.gpus_proposed == 2 and grow.gpus_proposed == 6  # one 2-GPU host leaves; the other would break it
    changed = [line for line in proposal.patch.splitlines()
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert changed == ["-      - {name: under-2, address: 10.98.0.2, gpu_count: 2}"], changed


def test_a_cloud_pool_clamped_by_its_node_counts_reports_the_size_the_patch_writes(tmp_path: Path) -> None:
    from gpushare.ops.capacity import propose

    fleet = resolve(Path("environments/pilot.yaml"), PROFILES)
    pool = next(p for p in fleet.pools if p.cloud is not None and p.cloud.max_node_count)
    assert pool.cloud is not None and pool.cloud.max_node_count
    wanted = (pool.cloud.max_node_count + 3) * pool.cloud.gpus_per_node
    rec = _resize_rec(fleet, pool.name, wanted)
    propose(fleet, load_guardrails(), [rec])
    assert rec.gpus_proposed == pool.cloud.max_node_count * pool.cloud.gpus_per_node


def test_a_second_mig_change_names_a_profile_file_that_does_not_exist_yet(tmp_path: Path) -> None:
    import subprocess

    from gpushare.core.paths import WORKSPACE_MARKER
    from gpushare.ops.capacity import propose

    env = _two_mig_pools(tmp_path)
    (tmp_path / WORKSPACE_MARKER).write_text("")
    earlier = yaml.safe_load((tmp_path / "profiles" / "mig-llm-serving.yaml").read_text())
    earlier["name"] = "mig-idle-mig"  # as a first capacity patch left it
    (tmp_path / "profiles" / "mig-idle-mig.yaml").write_text(yaml.safe_dump(earlier, sort_keys=False))
    fleet = resolve(env, tmp_path / "profiles")
    evidence = {p.name: PoolEvidence(p.name) for p in fleet.pools}
    evidence.update({p: _idle_mig(p) for p in ("mig-idle", "mig-idle-b")})
    proposal = propose(fleet, load_guardrails(), recommend(fleet, load_guardrails(), evidence, "7d"))
    assert "mig-idle" in proposal.applied and "profiles/mig-idle-mig.yaml" not in proposal.patch
    assert "environments/dev.yaml" in proposal.files  # named from the workspace, as `git apply` there wants
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "p.patch").write_text(proposal.patch)
    subprocess.run(["git", "apply", "--check", "p.patch"], cwd=tmp_path, check=True)


def test_demand_splits_only_over_the_pools_of_a_pools_own_cluster_as_the_live_rules_do() -> None:
    """dra.yaml: tenant research's queue reaches a training pool in each cluster; each cluster's rules (and so the
    raw read and the backfill) give each pool the whole of its own cluster's demand, never half."""
    from gpushare.ops.backfill import backfill_groups
    from gpushare.ops.capacity import _window_queries
    from gpushare.render.monitoring import prometheus_rule_groups

    fleet, g = resolve(ROOT / "examples" / "environments" / "dra.yaml"), load_guardrails()

    def exprs(groups: list[dict[str, Any]], record: str) -> dict[str, str]:
        return {r["labels"]["pool"]: r["expr"] for grp in groups for r in grp["rules"]
                if r.get("record") == record and "pool" in r.get("labels", {})}

    pending = next(e for n, e, _ in _window_queries(fleet, g, fleet.pools, "7d") if n == "pending mean")
    for record in ("gpushare:pool_pending_workloads:sum", "gpushare:pool_unschedulable_gpu_requests:sum"):
        live = {pool: e for c in fleet.clusters
                for pool, e in exprs(prometheus_rule_groups(fleet, g, c), record).items()}
        assert live and exprs(backfill_groups(fleet, g), record) == live
        assert all(e in pending for e in live.values()), record
    whole = exprs(prometheus_rule_groups(fleet, g), "gpushare:pool_pending_workloads:sum")["plugin-training"]
    assert whole.count("/ 2") and whole not in pending  # what the environment-wide rendering wrongly gave


class _SeriesOnly:
    """A Prometheus that answers /api/v1/series from fixed label sets (enough for diagnose_join's selectors)."""

    url = "http://127.0.0.1:9"

    def __init__(self, *series: dict[str, str]) -> None:
        self._series = series

    def series(self, name: str, selector: str, start: float, end: float) -> list[dict[str, Any]]:
        import re

        metric, body = re.fullmatch(r"(\w*)\{?(.*?)\}?", selector).groups()  # type: ignore[union-attr]
        matchers = re.findall(r'(\w+)\s*(=~|!=|=)\s*"([^"]*)"', body)
        if metric:
            matchers.append(("__name__", "=", metric))

        def holds(labels: dict[str, str], label: str, op: str, value: str) -> bool:
            have = labels.get(label, "")
            return {"=": have == value, "!=": have != value, "=~": re.fullmatch(value, have) is not None}[op]

        return [{"metric": s} for s in self._series if all(holds(s, *m) for m in matchers)]


@pytest.mark.parametrize(("dcgm", "says"), [
    ({"hostname": "under-1.lab.example.net"}, "hostname values (e.g. under-1.lab.example.net) match no node"),
    ({"Hostname": "under-1.lab.example.net"}, "hostname values (e.g. under-1.lab.example.net) match no node"),
    ({}, "DCGM series have no hostname label (Hostname before dcgm-exporter 4.6.0-4.8.3)"),
], ids=["hostname", "Hostname-older-exporter", "neither"])
def test_join_diagnosis_reads_either_spelling_of_the_node_label(dcgm: dict[str, str], says: str) -> None:
    from gpushare.ops.diagnose import diagnose_join

    prom = _SeriesOnly(
        {"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": "GPU-under-1-0", "gpu": "0", **dcgm},
        {"__name__": "kube_node_labels", "node": "under-1", "label_gpushare_io_pool": "ts-underused"})
    problem = diagnose_join(prom, resolve(ENV, PROFILES), "1h", time.time())  # type: ignore[arg-type]
    assert says in str(problem)
