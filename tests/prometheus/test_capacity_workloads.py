"""`gpushare capacity` per workload on shared pools against a real Prometheus (Debian's package, on 127.0.0.1): the
per-process exporter's gpushare_pod_gpu_* series backfilled for the time-sliced pool ts-contended (a trainer
Deployment of tenant batch and notebooks of tenant research on 4-replica GPUs), kube-state-metrics' kube_pod_owner for
the trainer only. The trainer is named as crowding, the replicas per GPU come from the workloads' peaks, the pool
without per-pod series says the exporter is needed, and gpushare's recording rules give the same figures."""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core.guardrails import load_guardrails
from gpushare.core.resolve import resolve
from gpushare.ops.capacity.workloads import EXPORTER, GIB
from gpushare.render.monitoring.promql import HOST_LABEL
from tests.conftest import PROFILES, ROOT
from tests.prometheus.scenarios import PoolLoad, Scenario, backfill
from tests.prometheus.server import prometheus_server

ENV = ROOT / "tests" / "prometheus" / "capacity" / "dev.yaml"  # the environment of the capacity scenarios
HOURS = 3
STEP = 60
TRAINER = "trainer-worker-0"  # a PyTorchJob's pod: only kube_pod_owner says its workload is "trainer"
NOTEBOOK_RS = "notebook-7c9d8f6b5"  # the ReplicaSet of the notebooks on busy-2 (kube_pod_owner has them)
runner = CliRunner()
pytestmark = [pytest.mark.usefixtures("frozen_workspace"), pytest.mark.slow]


def _line(name: str, labels: dict[str, str], value: float, t: int) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" + f" {value:.6g} {t}\n"


def _per_pod(start: int, end: int) -> list[str]:
    """ts-contended's 4 GPUs (busy-1, busy-2: 2 each), 4 replicas each: on busy-1's GPU 0 the trainer (70% of the SM,
    6 GiB) beside 3 notebooks; 4 notebooks on every other GPU (4%, 2 GiB). The notebooks on busy-2 are a
    Deployment's pods with kube_pod_owner (ReplicaSet notebook-7c9d8f6b5, its hash stripped); those on busy-1 have
    none: their workload comes from the pod's name (`notebook-<5 chars>`). Both are the workload "notebook"."""
    suffixes = iter(["bcd2f", "ghj4k", "lmn5p", "qrs6t", "vwx7z", "b2c4d", "f5g6h", "j7k8l", "m9n2p", "q4r5s",
                     "t6v7w", "x8z9b", "c2d4f", "g5h6j", "k7l8m"])
    pods: list[tuple[dict[str, str], float, float]] = []  # (labels, SM share, GiB)
    for node in ("busy-1", "busy-2"):
        for g in range(2):
            gpu = {HOST_LABEL: node, "UUID": f"GPU-{node}-{g}", "gpu": str(g), "share": "time-slicing"}
            tenants = [("batch", TRAINER, 0.70, 6.0)] if (node, g) == ("busy-1", 0) else []
            tenants += [("research", "notebook", 0.04, 2.0)] * (4 - len(tenants))
            for tenant, pod, sm, gib in tenants:
                if pod == "notebook":
                    pod = f"{NOTEBOOK_RS if node == 'busy-2' else 'notebook'}-{next(suffixes)}"
                pods.append(({**gpu, "namespace": tenant, "pod": pod, "pod_uid": f"uid-{pod}", "container": "main",
                              "tenant": tenant}, sm, gib))
    lines = []
    times = range(start, end + 1, STEP)
    for labels, sm, _ in pods:
        for t in times:
            # A swing of +-5 points over the hours: the p95 sits above the mean, the max above the p95.
            value = sm + 0.05 * math.sin(t / 1800.0) if sm > 0.5 else sm
            lines.append(_line("gpushare_pod_gpu_sm_utilization_ratio", labels, value, t))
    for labels, _, gib in pods:
        lines += [_line("gpushare_pod_gpu_memory_used_bytes", labels, gib * GIB, t) for t in times]
    for labels, _, _ in pods:
        lines += [_line("gpushare_pod_gpu_allocated_shares", labels, 1, t) for t in times]
    owners = [({"namespace": "batch", "pod": TRAINER}, "PyTorchJob", "trainer")]
    owners += [({"namespace": labels["namespace"], "pod": labels["pod"]}, "ReplicaSet", NOTEBOOK_RS)
               for labels, _, _ in pods if labels["pod"].startswith(NOTEBOOK_RS)]
    for who, kind, name in owners:
        owner = {**who, "uid": f"uid-{who['pod']}", "owner_kind": kind, "owner_name": name,
                 "owner_is_controller": "true"}
        lines += [_line("kube_pod_owner", owner, 1, t) for t in times]
    return lines


def _scenario(end: int) -> Scenario:
    start = end - HOURS * 3600
    return Scenario(start=start, end=end, extra=_per_pod(start, end), pools=[
        PoolLoad("ts-contended", "NVIDIA L40S", 46068, {"busy-1": 2, "busy-2": 2}, "batch", util=0.85,
                 swing=0.03, replicas=4, pod_memory_mib=4096, resource="nvidia_com_gpu_shared"),
        # No per-process exporter on this pool's hosts.
        PoolLoad("ts-underused", "NVIDIA L40S", 46068, {"under-1": 2, "under-2": 2}, "inference", util=0.15,
                 replicas=2, pod_memory_mib=4096, resource="nvidia_com_gpu_shared"),
    ])


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    work = tmp_path_factory.mktemp("prometheus")
    data = work / "data"
    data.mkdir()
    end = (int(time.time()) - 600) // 3600 * 3600
    backfill(_scenario(end), work, data)
    return data, end


def _capacity(url: str, end: int, out: Path, *extra: str) -> dict[str, Any]:
    result = runner.invoke(app, ["capacity", "--env", str(ENV), "--prometheus", url, "--window", f"{HOURS}h",
                                 "--end", str(end), "--json", "--patch", str(out / "p.patch"), *extra])
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@pytest.fixture(scope="module")
def report(backfilled: tuple[Path, int], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    data, end = backfilled
    out = tmp_path_factory.mktemp("capacity")
    with prometheus_server(data, data.parent) as url:
        return _capacity(url, end, out, "--chart", str(out / "capacity.png"))


def _section(report: dict[str, Any], pool: str) -> dict[str, Any]:
    section: dict[str, Any] = next(p for p in report["pools"] if p["pool"] == pool)["per_workload"]
    return section


def test_the_trainer_crowds_its_gpu_and_the_notebooks_do_not(report: dict[str, Any]) -> None:
    section = _section(report, "ts-contended")
    assert section["available"] and section["replicas_now"] == 4
    workloads = {(w["namespace"], w["workload"]): w for w in section["workloads"]}
    # The trainer from kube_pod_owner only; the notebooks from their ReplicaSet (hash stripped) and pod names.
    assert set(workloads) == {("batch", "trainer"), ("research", "notebook")}
    trainer, notebook = workloads[("batch", "trainer")], workloads[("research", "notebook")]
    assert section["crowding"] == ["batch/trainer"]
    assert trainer["tenant"] == "batch" and trainer["crowds"] and trainer["fair_share"] == 0.25
    assert 0.70 < trainer["sm_p95"] <= trainer["sm_max"] <= 0.75 + 1e-6
    assert trainer["memory_p95_bytes"] == pytest.approx(6 * GIB)
    assert trainer["replicas"] == 1 and trainer["gpus"] == {"busy-1/GPU-busy-1-0": 1}
    assert trainer["profile"] == "exclusive"  # no MIG on an L40S, and no room for a second replica
    assert notebook["tenant"] == "research" and not notebook["crowds"] and notebook["replicas"] == 15
    assert notebook["sm_p95"] == pytest.approx(0.04)


def test_replicas_per_gpu_come_from_the_workloads_peaks(report: dict[str, Any]) -> None:
    # Any replicas may share a GPU: the trainer's p95 (~75%) and 7 notebooks' 4% need 103% of the SM; with 6
    # notebooks, 99%: 7 replicas per GPU (dev's max_shared_replicas for 48 GB would allow 8).
    section = _section(report, "ts-contended")
    assert (section["replicas_by_peaks"], section["binding"]) == (7, "compute")
    assert section["gpus_over"] == [] and not section["notes"]
    # The pool-level recommendation is still made, and the patch is the pool-level one.
    pool = next(p for p in report["pools"] if p["pool"] == "ts-contended")
    assert pool["replicas_proposed"] is not None


def test_a_pool_without_per_pod_series_names_the_exporter(report: dict[str, Any]) -> None:
    section = _section(report, "ts-underused")
    assert not section["available"] and section["notes"] == [EXPORTER]
    pool = next(p for p in report["pools"] if p["pool"] == "ts-underused")
    assert pool["replicas_proposed"] is not None and not pool["gaps"]  # sized from pool averages, as before
    assert "per_workload" not in next(p for p in report["pools"] if p["pool"] == "mig-idle")


def test_text_report_and_chart(backfilled: tuple[Path, int], report: dict[str, Any], tmp_path: Path) -> None:
    data, end = backfilled
    with prometheus_server(data, tmp_path) as url:
        result = runner.invoke(app, ["capacity", "--env", str(ENV), "--prometheus", url, "--window", f"{HOURS}h",
                                     "--end", str(end), "--patch", str(tmp_path / "p.patch")],
                               env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    assert "CROWDS batch/trainer (tenant batch) x1" in result.stdout
    assert "gpu_process_exporter" in result.stdout
    assert report["chart"] and Path(report["chart"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_recording_rules_give_the_same_workload_figures(backfilled: tuple[Path, int], report: dict[str, Any],
                                                         tmp_path: Path) -> None:
    from gpushare.render.monitoring import prometheus_rule_groups
    from tests.prometheus.scenarios import backfill_recording_rules

    data, end = backfilled
    copy = tmp_path / "data"
    shutil.copytree(data, copy, ignore=shutil.ignore_patterns("wal", "chunks_head", "lock", "queries.active"))
    groups = prometheus_rule_groups(resolve(ENV, PROFILES), load_guardrails())
    backfill_recording_rules(groups, copy, tmp_path, end - HOURS * 3600, end)
    with prometheus_server(copy, tmp_path) as url:
        recorded = _capacity(url, end, tmp_path)
    assert recorded["source"] == "recording rules"
    a, b = _section(report, "ts-contended"), _section(recorded, "ts-contended")
    assert b["crowding"] == a["crowding"] and b["replicas_by_peaks"] == a["replicas_by_peaks"]
    for x, y in zip(a["workloads"], b["workloads"], strict=True):
        assert (y["workload"], y["replicas"]) == (x["workload"], x["replicas"])
        assert y["sm_p95"] == pytest.approx(x["sm_p95"], abs=0.02)
