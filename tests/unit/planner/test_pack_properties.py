"""Properties of `gpushare pack` over random small demands, environments and GPU models: every plan passes the
exact MIG check, never shares a unit with an untrusted or latency-sensitive replica, never time-slices a
latency: medium one, keeps memory, compute, replicas and (with --env) the guardrails' oversubscription and
replica limits, places every replica once, and is no worse than one GPU per replica."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare.core.errors import GpushareError
from gpushare.planner.demand import Demand
from gpushare.planner.pack import plan_demand
from tests.unit.planner.test_pack import assert_rules

MODELS = ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA A30", "NVIDIA L4", "NVIDIA H100 NVL"]

workload = st.fixed_dictionaries({
    "kind": st.sampled_from(["online", "batch", "dev"]),
    "memory_gib": st.sampled_from([1.5, 4, 9, 9.8, 12, 19.7, 24, 30, 39.6, 45, 70]),
    "compute": st.sampled_from([0.05, 0.1, 0.14, 0.2, 0.3, 0.45, 0.6, 1.0]),
    "replicas": st.integers(1, 3),
    "trust": st.sampled_from(["trusted", "trusted", "untrusted"]),
    "latency": st.sampled_from([None, "high", "medium", "low"]),
    "tenant": st.sampled_from(["search", "partner-eval", "t"]),
})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workloads=st.lists(workload, min_size=1, max_size=5),
    models=st.lists(st.sampled_from(MODELS), min_size=1, max_size=2, unique=True),
    env=st.sampled_from([None, "dev", "pilot", "prod"]),
    budget=st.sampled_from([1.0, 0.8]),
)
def test_every_plan_keeps_the_rules(workloads: list[dict[str, Any]], models: list[str], env: str | None,
                                    budget: float) -> None:
    items = [{"name": f"w{k}", **{key: v for key, v in w.items() if v is not None}} for k, w in enumerate(workloads)]
    demand = Demand.model_validate({"gpus": [{"model": m} for m in models], "workloads": items,
                                    "compute_budget": budget})
    try:
        plan = plan_demand(demand, env=env, time_limit=5.0)
    except GpushareError as err:
        # Only a workload that nothing can serve stops a plan here (no GPU counts are limited).
        assert err.problems and all("cannot be served" in p.message for p in err.problems)
        return
    assert_rules(plan, env)
    assert plan.gpus_used <= plan.baseline_gpus
    assert plan.lower_bound <= plan.gpus_used
