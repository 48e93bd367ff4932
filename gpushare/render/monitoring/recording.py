"""The recording rules (the `gpushare.recording` group): what the fleet says as static series, then hardware units,
pools, tenants, showback and per-pod sharing, and Kueue and scheduling contention per pool. The conventions every
rule follows, and the expressions they share with `gpushare capacity` and `gpushare showback`, are in
expressions.py."""

from __future__ import annotations

from typing import Any

from gpushare.core.guardrails import Guardrails
from gpushare.core.resolve import ResolvedFleet, ResolvedPool
from gpushare.render.monitoring.expressions import (
    GPU_NODE,
    GPU_OF_POD,
    GPU_RESOURCES,
    NODE_POOL_EXPR,
    QUEUE_PREFIX,
    SHARED_SM,
    UNIT,
    advertised_expr,
    allocated_expr,
    allocated_gpus_expr,
    compute_fractions,
    gpu_utilization_expr,
    pod_gpu_expr,
    pool_pending_workloads_expr,
    pool_zeros,
    queue_namespaces,
    queues_by_pool,
    replica_memory_expr,
    resource_gpu_shares,
    sm_used_expr,
    to_node,
    unit_memory_total_expr,
    unit_memory_used_expr,
    unit_utilization_expr,
    unschedulable_pod_age_expr,
    unschedulable_requests_expr,
    used_gpus_expr,
    with_pool,
)
from gpushare.render.monitoring.promql import alternatives

# Kueue's admission wait is a histogram; p90 over this window is the queue time the rules compare.
WAIT_WINDOW = "30m"
# Pods scheduled within this long count towards the scheduling wait of pods outside Kueue.
RECENT_POD_SECONDS = 3600


def _record(name: str, expr: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"record": name, "expr": expr.strip()}
    if labels:
        rule["labels"] = dict(labels)
    return rule


def _compute_fraction_rules(pools: list[ResolvedPool]) -> list[dict[str, Any]]:
    rules = []
    for (model_name, profile), fraction in compute_fractions(pools).items():
        labels = {"modelName": model_name}
        if profile:
            labels["GPU_I_PROFILE"] = profile
        rules.append(_record("gpushare:unit_compute:ratio", f"vector({fraction:g})", labels))
    return rules


def recording_rules(fleet: ResolvedFleet, guardrails: Guardrails, pools: list[ResolvedPool]) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []

    # -- what the fleet says (static series for joins and dashboards)
    for p in pools:
        gpu_models = sorted({n.gpu_model.name for n in p.nodes})
        rules.append(_record("gpushare:pool:info", "vector(1)", {
            "pool": p.name, "cluster": p.cluster, "sharing": p.sharing, "profile": p.profile,
            "isolation": p.isolation, "gpu_model": ", ".join(gpu_models)}))
        rules.append(_record("gpushare:pool_physical_gpus:planned", f"vector({p.totals.physical_gpus})",
                             {"pool": p.name}))
        rules.append(_record("gpushare:pool_hardware_units:planned", f"vector({p.totals.hardware_units})",
                             {"pool": p.name}))
        rules.append(_record("gpushare:pool_advertised:planned", f"vector({p.totals.advertised_total})",
                             {"pool": p.name}))
    rules += _compute_fraction_rules(pools)
    clusters = {p.cluster for p in pools}
    for t in fleet.tenants:
        if clusters & set(t.clusters):
            rules.append(_record("gpushare:tenant:info", "vector(1)", {"tenant": t.name, "namespace": t.namespace}))

    # -- nodes and hardware units
    rules += [
        _record("gpushare:node_pool:info", NODE_POOL_EXPR),
        _record("gpushare:unit_utilization:ratio", unit_utilization_expr()),
        _record("gpushare:unit_memory_used:bytes", unit_memory_used_expr()),
        _record("gpushare:unit_memory_total:bytes", unit_memory_total_expr()),
        _record("gpushare:unit_memory_used:ratio",
                "gpushare:unit_memory_used:bytes / gpushare:unit_memory_total:bytes"),
        _record("gpushare:gpu_utilization:ratio", gpu_utilization_expr()),
        _record("gpushare:gpu_memory_used:ratio", f"""
sum by ({GPU_NODE}) (gpushare:unit_memory_used:bytes)
/ sum by ({GPU_NODE}) (gpushare:unit_memory_total:bytes)"""),
        _record("gpushare:replica_memory_used:bytes", replica_memory_expr()),
    ]

    # -- pools
    rules += [
        _record("gpushare:pool_utilization:ratio", "avg by (pool) (gpushare:gpu_utilization:ratio)"),
        _record("gpushare:pool_memory_used:ratio", """
sum by (pool) (gpushare:unit_memory_used:bytes) / sum by (pool) (gpushare:unit_memory_total:bytes)"""),
        _record("gpushare:pool_physical_gpus:count", "count by (pool) (gpushare:gpu_utilization:ratio)"),
        _record("gpushare:pool_hardware_units:count", "count by (pool) (gpushare:unit_utilization:ratio)"),
        _record("gpushare:pool_mig_utilization:ratio",
                'avg by (pool, GPU_I_PROFILE) (gpushare:unit_utilization:ratio{GPU_I_ID!=""})'),
        _record("gpushare:pool_mig_memory_used:ratio", """
sum by (pool, GPU_I_PROFILE) (gpushare:unit_memory_used:bytes{GPU_I_ID!=""})
/ sum by (pool, GPU_I_PROFILE) (gpushare:unit_memory_total:bytes{GPU_I_ID!=""})"""),
        _record("gpushare:pool_mig_instances:count",
                'count by (pool, GPU_I_PROFILE) (gpushare:unit_utilization:ratio{GPU_I_ID!=""})'),
        # Advertised (allocatable) and allocated (requested by pending or running pods on the pool's nodes).
        _record("gpushare:pool_advertised:units", advertised_expr()),
        _record("gpushare:namespace_allocated:units", allocated_expr()),
        _record("gpushare:pool_allocated:units",
                "sum by (pool, resource) (gpushare:namespace_allocated:units)"),
        _record("gpushare:pool_allocation:ratio", """
sum by (pool) (gpushare:pool_allocated:units) / sum by (pool) (gpushare:pool_advertised:units)"""),
        # Oversubscription in effect: schedulable resources per hardware unit that DCGM sees.
        _record("gpushare:pool_oversubscription:ratio", """
sum by (pool) (gpushare:pool_advertised:units) / on (pool) gpushare:pool_hardware_units:count"""),
    ]

    # -- tenants: GPU-equivalents busy, memory, allocation, Kueue queueing
    busy = f"""
  (
    max by ({UNIT}, namespace) (DCGM_FI_PROF_GR_ENGINE_ACTIVE{{vgpu="", namespace!=""}})
    or max by ({UNIT}, namespace) (DCGM_FI_DEV_GPU_UTIL{{vgpu="", namespace!=""}}) / 100
  )
  * on (modelName, GPU_I_PROFILE) group_left gpushare:unit_compute:ratio
  or sum by ({UNIT}, namespace) (DCGM_FI_DEV_GPU_UTIL{{vgpu!="", namespace!=""}}) / 100
"""
    rules.append(_record("gpushare:namespace_gpu_busy:gpus",
                         "sum by (namespace, pool) (\n" + with_pool(to_node(f"({busy})")) + "\n)"))
    memory = f"""
  max by ({UNIT}, namespace) (DCGM_FI_DEV_FB_USED{{vgpu="", namespace!=""}})
  or sum by ({UNIT}, namespace) (DCGM_FI_DEV_FB_USED{{vgpu!="", namespace!=""}})
"""
    rules.append(_record("gpushare:namespace_memory_used:bytes",
                         "sum by (namespace, pool) (\n" + with_pool(to_node(f"({memory}) * 1048576")) + "\n)"))
    for metric in ("gpu_busy:gpus", "memory_used:bytes"):
        rules.append(_record(f"gpushare:tenant_{metric}", f"""
sum by (tenant, pool) (gpushare:namespace_{metric} * on (namespace) group_left (tenant) gpushare:tenant:info)"""))
    rules.append(_record("gpushare:tenant_allocated:units", """
sum by (tenant, pool, resource) (
  gpushare:namespace_allocated:units * on (namespace) group_left (tenant) gpushare:tenant:info
)"""))
    rules += showback_rules(pools)
    rules += process_rules()
    to_tenant = f'"tenant", "$1", "cluster_queue", "{QUEUE_PREFIX}(.+)"'
    rules.append(_record("gpushare:tenant_pending_workloads:sum", f"""
sum by (tenant) (label_replace(kueue_pending_workloads{{cluster_queue=~"{QUEUE_PREFIX}.+"}}, {to_tenant}))"""))
    rules.append(_record("gpushare:tenant_admission_wait_seconds:p90", f"""
histogram_quantile(0.9, sum by (tenant, le) (
  label_replace(rate(kueue_admission_wait_time_seconds_bucket{{cluster_queue=~"{QUEUE_PREFIX}.+"}}[{WAIT_WINDOW}]),
                {to_tenant})
))"""))

    # -- contention per pool: Kueue queues that reach the pool, and GPU pods outside Kueue
    by_pool, reach = queues_by_pool(fleet, guardrails, pools)
    for pool, queues in by_pool.items():
        selector = f'cluster_queue=~"{alternatives(queues)}"'
        rules.append(_record("gpushare:pool_pending_workloads:sum",
                             pool_pending_workloads_expr(next(p for p in pools if p.name == pool), queues, reach,
                                                         queue_namespaces(fleet)),
                             {"pool": pool}))
        rules.append(_record("gpushare:pool_admission_wait_seconds:p90", f"""
histogram_quantile(0.9, sum by (le) (rate(kueue_admission_wait_time_seconds_bucket{{{selector}}}[{WAIT_WINDOW}])))""",
                             {"pool": pool}))
    for p in pools:
        rules.append(_record("gpushare:pool_unschedulable_gpu_requests:sum", unschedulable_requests_expr(p, pools),
                             {"pool": p.name}))
        rules.append(_record("gpushare:pool_unschedulable_pod_age_seconds:max", unschedulable_pod_age_expr(p),
                             {"pool": p.name}))
        rules.append(_record("gpushare:pool_scheduling_wait_seconds:max", f"""
max(
  (max by (namespace, pod) (kube_pod_status_scheduled_time) - max by (namespace, pod) (kube_pod_created))
  and on (namespace, pod) (max by (namespace, pod) (kube_pod_created) > time() - {RECENT_POD_SECONDS})
  and on (namespace, pod) (
    kube_pod_container_resource_requests{{{GPU_RESOURCES}, node!=""}}
    * on (node) group_left (pool) gpushare:node_pool:info{{pool="{p.name}"}}
  )
)""", {"pool": p.name}))
    # A 0 per pool where nothing is pending, so that averages over the window count the quiet steps.
    zeros = f'\n  or label_replace({pool_zeros(pools)}, "source", "none", "", "")' if pools else ""
    rules.append(_record("gpushare:pool_pending:sum", f"""
sum by (pool) (
  label_replace(gpushare:pool_pending_workloads:sum, "source", "kueue", "", "")
  or label_replace(gpushare:pool_unschedulable_gpu_requests:sum, "source", "unschedulable-pods", "", ""){zeros}
)"""))
    rules.append(_record("gpushare:pool_queue_wait_seconds:max", """
max by (pool) (
  label_replace(gpushare:pool_admission_wait_seconds:p90, "source", "kueue", "", "")
  or label_replace(gpushare:pool_unschedulable_pod_age_seconds:max, "source", "unschedulable-pods", "", "")
  or label_replace(gpushare:pool_scheduling_wait_seconds:max, "source", "scheduled-pods", "", "")
)"""))
    return rules


def showback_rules(pools: list[ResolvedPool]) -> list[dict[str, Any]]:
    """GPU-equivalents per namespace, tenant and pool (allocated, and measured where DCGM attributes it) and idle
    per pool: `gpushare showback` sums them over its window, so long windows read these, not raw series."""
    rules = [_record("gpushare:resource_gpu_share:ratio", f"vector({compute:g})", {"pool": pool, "resource": res})
             for (pool, res), (compute, _memory) in resource_gpu_shares(pools).items()]
    rules += [
        _record("gpushare:namespace_allocated:gpus", allocated_gpus_expr(pools)),
        _record("gpushare:namespace_used:gpus", used_gpus_expr()),
        _record("gpushare:pool_idle:gpus", """
gpushare:pool_physical_gpus:count - on (pool) sum by (pool) (gpushare:namespace_allocated:gpus)
or gpushare:pool_physical_gpus:count"""),
    ]
    for metric in ("allocated", "used"):
        rules.append(_record(f"gpushare:tenant_{metric}:gpus", f"""
sum by (tenant, pool) (gpushare:namespace_{metric}:gpus * on (namespace) group_left (tenant) gpushare:tenant:info)"""))
    return rules


def process_rules() -> list[dict[str, Any]]:
    """Per pod and per tenant on shared GPUs, from the per-process exporter."""
    sm, memory, shares = ("gpushare_pod_gpu_sm_utilization_ratio", "gpushare_pod_gpu_memory_used_bytes",
                          "gpushare_pod_gpu_allocated_shares")
    pods = "gpushare:pod_gpu_sm_utilization_ratio:avg5m"
    tenant_gpu = "gpushare:gpu_tenant_sm_utilization_ratio:avg5m"
    return [
        _record(pods, pod_gpu_expr(sm, "avg_over_time({}[5m])")),
        _record("gpushare:pod_gpu_memory_used_bytes:avg5m", pod_gpu_expr(memory, "avg_over_time({}[5m])")),
        _record("gpushare:pod_gpu_allocated_shares:sum", pod_gpu_expr(shares)),
        # Per tenant on each time-sliced or MPS GPU, and the tenant's share of the SM time used there.
        _record(tenant_gpu, f"""
sum by (node, UUID, gpu, GPU_I_ID, share, pool, tenant) ({pods}{{share=~"{SHARED_SM}"}})"""),
        _record("gpushare:gpu_tenant_sm_share:ratio", f"""
{tenant_gpu}
/ on ({GPU_OF_POD}) group_left ()
(sum by ({GPU_OF_POD}) ({tenant_gpu}) > 0)"""),
        # GPU-equivalents of SM time per tenant and pool (every sharing kind: a MIG instance's or whole GPU's pod
        # too), and per namespace and pool on shared GPUs for showback.
        _record("gpushare:tenant_sm_used:gpus", f"sum by (tenant, pool) ({pods})"),
        _record("gpushare:namespace_sm_used:gpus", sm_used_expr()),
    ]
