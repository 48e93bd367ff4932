"""gpushare.ops.backfill: the recording rules `capacity --backfill-rules` evaluates are the rules each cluster
runs live (the backfill against a real Prometheus: tests/prometheus/test_backfill.py)."""

from __future__ import annotations

from typing import Any

from gpushare.core.guardrails import load_guardrails
from gpushare.core.resolve import resolve
from tests.conftest import ROOT


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
