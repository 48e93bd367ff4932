"""gpushare.ops.capacity's proposal: independent pools and grouped changes (a change that does not resolve is
withheld, the rest written), and a patch that writes what the summary says."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpushare.core.guardrails import load_guardrails
from gpushare.core.resolve import ResolvedFleet, resolve
from gpushare.ops.capacity import GIB, MigEvidence, PoolEvidence, Recommendation, recommend
from tests.conftest import PROFILES
from tests.unit.ops.capacity.helpers import ENV, two_mig_pools


def _idle_mig(pool: str) -> PoolEvidence:
    return PoolEvidence(pool, coverage=1.0, utilization_mean=0.05, utilization_p95=0.06, mig={
        p: MigEvidence(p, 1, 0.05, 3 * GIB, 1) for p in ("4g.40gb", "3g.40gb")})


def test_two_mig_pools_dropping_one_resource_move_its_quota_together(tmp_path: Path) -> None:
    from gpushare.ops.capacity import propose

    fleet = resolve(two_mig_pools(tmp_path), tmp_path / "profiles")
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

    fleet = resolve(two_mig_pools(tmp_path), tmp_path / "profiles")
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
    assert ("bare-metal pools grow by adding hosts: add hosts with 2 GPUs in all to the environment"
            in proposal.withheld["ts-contended"])
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

    env = two_mig_pools(tmp_path)
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
