"""gpushare.ops.capacity's recommendations from given evidence (no Prometheus): coverage withholds them, the
environment's guardrails bound them, and both directions for every sharing kind, MIG and time-sliced MIG included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpushare.core.guardrails import load_guardrails
from gpushare.core.mig import check_layout, layout_from_counts
from gpushare.core.resolve import ResolvedFleet, resolve
from gpushare.ops.capacity import GIB, MigEvidence, PoolEvidence, Recommendation, recommend
from tests.conftest import PROFILES
from tests.unit.ops.capacity.helpers import ENV, two_mig_pools


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


def _time_sliced_mig(tmp_path: Path, layout: str = "all-smallest") -> ResolvedFleet:
    """dev with mig-idle on time-sliced MIG instances (all-smallest: 1g.10gb x7 on H100), each shared by two pods."""
    env = two_mig_pools(tmp_path)
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
