"""gpushare.ops.capacity.workloads' arithmetic from given per-workload figures (no Prometheus): which workloads crowd
a shared GPU, the replicas per GPU their peaks fit, the profile a crowding workload gets, and the fallback where the
per-process exporter sends nothing."""

from __future__ import annotations

from gpushare.core.guardrails import load_guardrails
from gpushare.core.resolve import resolve
from gpushare.ops.capacity.workloads import (
    EXPORTER,
    GIB,
    PoolWorkloads,
    WorkloadEvidence,
    pool_workloads,
    replicas_by_peaks,
    size_workloads,
    workload_queries,
)
from tests.conftest import PROFILES
from tests.unit.ops.capacity.helpers import ENV


def _two_tenants(heavy_replicas: int = 1) -> list[WorkloadEvidence]:
    """On one 4-replica time-sliced GPU: batch's trainer takes 70% of the SM per replica, research's notebooks 5%."""
    return [
        WorkloadEvidence("ts-contended", "batch", "trainer", "batch", sm_p95=0.70, sm_max=0.78,
                         memory_p95_bytes=6 * GIB, memory_max_bytes=7 * GIB, gpus={"n1/GPU-a": heavy_replicas}),
        WorkloadEvidence("ts-contended", "research", "notebook", "research", sm_p95=0.05, sm_max=0.08,
                         memory_p95_bytes=2 * GIB, memory_max_bytes=2 * GIB, gpus={"n1/GPU-a": 4 - heavy_replicas}),
    ]


def _section(workloads: list[WorkloadEvidence]) -> PoolWorkloads:
    fleet = resolve(ENV, PROFILES)
    return pool_workloads(fleet, load_guardrails(), {"ts-contended": workloads})["ts-contended"]


def test_the_busy_tenants_workload_is_named_as_crowding() -> None:
    section = _section(_two_tenants())
    assert section.available and section.replicas_now == 4
    crowding = section.crowding
    assert [(f.evidence.tenant, f.evidence.workload) for f in crowding] == [("batch", "trainer")]
    trainer = crowding[0]
    assert trainer.fair_share == 0.25 and trainer.crowds and not trainer.crowds_memory
    assert "70%" in trainer.why[0] and "fair share 25%" in trainer.why[0]
    # No MIG on an L40S, and 1 / 70% leaves no room for a second replica: a whole GPU.
    assert trainer.profile == "exclusive" and "no other replica fits beside it" in trainer.why[-1]
    notebook = next(f for f in section.workloads if f.evidence.workload == "notebook")
    assert not notebook.crowds and notebook.profile is None
    data = section.as_dict()
    assert data["crowding"] == ["batch/trainer"]
    assert any(line.startswith("CROWDS batch/trainer (tenant batch) x1") for line in section.lines())


def test_replicas_per_gpu_from_the_peaks() -> None:
    # 70% + 3 x 5% = 85% of the SM: the four replicas fit; a fifth (at the mean, 21%) would not.
    section = _section(_two_tenants())
    assert (section.replicas_by_peaks, section.binding) == (4, "compute")
    assert section.gpus_over == [] and not section.notes
    # Two trainer replicas on one GPU need 140%: only one replica per GPU fits their peaks.
    section = _section(_two_tenants(heavy_replicas=2))
    assert (section.replicas_by_peaks, section.binding) == (1, "compute")
    assert section.gpus_over and section.gpus_over[0].startswith("n1/GPU-a (150%")
    assert "fit 1 replica(s) per GPU (compute), not 4" in section.notes[0]


def test_memory_peaks_bind_and_crowd() -> None:
    heavy = [WorkloadEvidence("p", "ns", "llm", "t", sm_p95=0.1, memory_p95_bytes=20 * GIB, gpus={"g": 2})]
    assert replicas_by_peaks(heavy, 41 * GIB, 8) == (2, "memory")
    assert replicas_by_peaks(heavy, 39 * GIB, 8) == (1, "memory")
    idle = [WorkloadEvidence("p", "ns", "tiny", "t", sm_p95=0.01, memory_p95_bytes=1 * GIB, gpus={"g": 1})]
    assert replicas_by_peaks(idle, 41 * GIB, 8) == (8, "guardrail")
    fleet = resolve(ENV, PROFILES)
    model = next(p for p in fleet.pools if p.name == "ts-contended").nodes[0].gpu_model
    section = size_workloads("p", "time-slicing", 4, model, heavy, load_guardrails(), 8)
    llm = section.workloads[0]
    assert llm.crowds_memory and not llm.crowds and llm.profile is not None


def test_crowding_workload_on_a_mig_capable_gpu_gets_the_smallest_mig_profile_that_holds_it() -> None:
    fleet = resolve(ENV, PROFILES)
    h100 = next(p for p in fleet.pools if p.name == "mig-idle").nodes[0].gpu_model
    g = load_guardrails()
    busy = WorkloadEvidence("p", "ns", "serving", "t", sm_p95=0.4, memory_p95_bytes=15 * GIB, gpus={"g": 1})
    section = size_workloads("p", "time-slicing", 4, h100, [busy], g, 8)
    assert section.workloads[0].profile == "mig 3g.40gb"  # 3/7 of the SM >= 40%; 2g's 2/7 is not
    whole = WorkloadEvidence("p", "ns", "train", "t", sm_p95=0.95, memory_p95_bytes=15 * GIB, gpus={"g": 1})
    assert size_workloads("p", "time-slicing", 4, h100, [whole], g, 8).workloads[0].profile == "exclusive"


def test_without_per_pod_series_the_section_names_the_exporter() -> None:
    section = _section([])
    assert not section.available and section.replicas_by_peaks is None
    assert section.notes == [EXPORTER] and "gpu_process_exporter" in section.lines()[0]
    # Only the shared pools get a section.
    fleet = resolve(ENV, PROFILES)
    assert set(pool_workloads(fleet, load_guardrails(), {})) == {
        p.name for p in fleet.pools if p.sharing in ("time-slicing", "mps")}


def test_queries_join_kube_pod_owner_and_fall_back_to_the_pod_name() -> None:
    queries = dict(workload_queries("6h", "1m", "raw"))
    sm = queries["workload SM share p95"]
    assert sm.startswith("quantile_over_time(0.95, (max by (pool, namespace, tenant, workload)")
    assert "kube_pod_owner{" in sm and 'unless on (namespace, pod)' in sm
    assert 'gpushare_pod_gpu_sm_utilization_ratio{pod!="", tenant!="", share=~"time-slicing|mps"}' in sm
    recorded = dict(workload_queries("6h", "1m", "recorded"))
    assert 'gpushare:pod_gpu_memory_used_bytes:avg5m{share=~"time-slicing|mps"}' in recorded["workload memory max"]


def test_a_workload_that_fits_twice_on_a_gpu_without_mig_gets_fewer_replicas_per_gpu() -> None:
    fleet = resolve(ENV, PROFILES)
    l40s = next(p for p in fleet.pools if p.name == "ts-contended").nodes[0].gpu_model
    half = WorkloadEvidence("p", "ns", "serving", "t", sm_p95=0.45, memory_p95_bytes=4 * GIB, gpus={"g": 1})
    finding = size_workloads("p", "time-slicing", 4, l40s, [half], load_guardrails(), 8).workloads[0]
    assert finding.crowds and finding.profile == "replicas 2"
