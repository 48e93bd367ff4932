"""`gpushare capacity` against a real Prometheus (Debian's package, on 127.0.0.1) loaded with backfilled
DCGM-, kube-state-metrics- and Kueue-format series for four scenarios: each recommendation goes the expected way,
and a server that is no Prometheus API, an empty window or a pool without series give a clear error or a stated gap."""

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
from gpushare.ops.capacity import GIB
from gpushare.render.monitoring.promql import LEGACY_HOST_LABEL
from tests.conftest import PROFILES, ROOT
from tests.prometheus.scenarios import PoolLoad, Scenario, backfill
from tests.prometheus.server import prometheus_server

ENV = ROOT / "tests" / "prometheus" / "capacity" / "dev.yaml"  # the environment of the capacity scenarios
HOURS = 6
runner = CliRunner()
pytestmark = pytest.mark.usefixtures("frozen_workspace")  # GPUSHARE_ROOT: the frozen workspace, as in tests/unit


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
    from gpushare.render.monitoring.expressions import queues_by_pool

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
    from gpushare.render.monitoring.expressions import queues_by_pool

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
