"""Prometheus recording and alerting rules, rendered from the resolved fleet and the monitoring thresholds in
policies/guardrails.yaml.

Sharing-aware conventions every rule follows:
- A hardware unit is a whole GPU or a MIG instance: DCGM series keyed by (hostname, UUID, GPU_I_ID).
- Utilization is DCGM_FI_PROF_GR_ENGINE_ACTIVE (it exists per MIG instance; GPU_UTIL does not), falling back to
  GPU_UTIL where profiling metrics are off. A MIG instance counts with its share of the GPU's compute slices.
- On time-sliced GPUs with --kubernetes-virtual-gpus the exporter emits one series per pod (label `vgpu`): only
  GPU_UTIL and FB_USED are per pod and may be summed over pods; every other field is the device value repeated,
  so device figures take `max` over the pod series and per-tenant figures never sum them.
- The pool of a node comes from its `gpushare.io/pool` label through kube_node_labels (kube-state-metrics with the
  label allowlist, see kube_state_metrics_label_allowlist); the dcgm-exporter's `hostname` is the node name
  (`Hostname` before dcgm-exporter 4.6.0-4.8.3: every join takes either, see promql.HOST_LABEL).
- Rules assume the ServiceMonitor keeps the exporter's own pod/namespace labels (honorLabels: true)."""

from __future__ import annotations

from typing import Any

from gpushare.core.guardrails import Guardrails, duration_seconds
from gpushare.core.labels import (
    DEVICE_PLUGIN_CONFIG_LABEL,
    MIG_CONFIG_LABEL,
    MIG_STATE_LABEL,
    OPERATOR_MIG_CONFIG_LABEL,
    TOOLKIT_VERSION_LABEL,
)
from gpushare.core.resolve import ResolvedFleet, ResolvedPool
from gpushare.core.tenancy import fleet_tenancy
from gpushare.render.monitoring.promql import (
    HOST_LABEL,
    HOST_LABELS,
    alternatives,
    dcgm_host,
    ksm_label,
    ksm_name,
)

POOL_LABEL = "gpushare.io/pool"
ENVIRONMENT_LABEL = "gpushare.io/environment"
PROFILE_LABEL = "gpushare.io/profile"
OPERATOR_MIG_STATE_LABEL = f"{OPERATOR_MIG_CONFIG_LABEL}.state"
QUEUE_PREFIX = "tenant-"  # gpushare.tenancy names each tenant's ClusterQueue tenant-<name>

# The DCGM labels that identify a hardware unit, and those carried along for dashboards and joins. Both spellings
# of the node label are kept through the aggregation; to_node() merges them.
UNIT = f"{HOST_LABELS}, UUID, GPU_I_ID, GPU_I_PROFILE, modelName"
UNIT_NODE = "node, UUID, GPU_I_ID, GPU_I_PROFILE, modelName, pool"
GPU_NODE = "node, UUID, modelName, pool"
DEVICE_ALERT = f"{HOST_LABEL}, UUID, gpu, modelName"  # over dcgm_host(...)
GPU_RESOURCES = 'resource=~"nvidia_com_.+"'
# Kueue's admission wait is a histogram; p90 over this window is the queue time the rules compare.
WAIT_WINDOW = "30m"
# Pods scheduled within this long count towards the scheduling wait of pods outside Kueue.
RECENT_POD_SECONDS = 3600

# Metrics gpushare's rules read that other exporters provide (DCGM fields come from fields.py).
KUBE_STATE_METRICS = frozenset({
    "kube_node_labels", "kube_node_status_allocatable", "kube_pod_container_resource_requests",
    "kube_pod_status_phase", "kube_pod_status_unschedulable", "kube_pod_created", "kube_pod_status_scheduled_time",
    "kube_pod_nodeselectors",  # opt-in; where absent, an unschedulable pod's request is split over the pools
})
KUEUE_METRICS = frozenset({"kueue_pending_workloads", "kueue_cluster_queue_resource_pending",
                           "kueue_admission_wait_time_seconds_bucket"})


# Node labels `gpushare promote` reads (gpushare.promote): which environment a node is in, and what it runs.
PROMOTION_NODE_LABELS = (ENVIRONMENT_LABEL, PROFILE_LABEL, DEVICE_PLUGIN_CONFIG_LABEL, MIG_CONFIG_LABEL,
                         OPERATOR_MIG_CONFIG_LABEL, TOOLKIT_VERSION_LABEL)


def kube_state_metrics_label_allowlist() -> list[str]:
    """Node labels the rules and `gpushare promote` read through kube_node_labels: kube-state-metrics must be
    started with `--metric-labels-allowlist=nodes=[<these>]`, or it exports none of them."""
    return [POOL_LABEL, MIG_STATE_LABEL, OPERATOR_MIG_STATE_LABEL, *PROMOTION_NODE_LABELS]


def to_node(expr: str) -> str:
    """DCGM series -> the same series keyed by `node` (dcgm-exporter's hostname, or Hostname from older exporters),
    without either: a GPU whose exporter changed spelling within the window is one series."""
    return f'max without ({HOST_LABELS}) (label_replace({dcgm_host(expr)}, "node", "$1", "{HOST_LABEL}", "(.*)"))'


def _with_pool(expr: str, node_pool: str = "gpushare:node_pool:info") -> str:
    return f"{expr}\n* on (node) group_left (pool) {node_pool}"


# ---------------------------------------------------------------- expressions shared with `gpushare capacity`
# The recording rules below and capacity's window queries are built from these, so both mean the same thing.
# `node_pool` is the recorded gpushare:node_pool:info, or NODE_POOL_EXPR where the recorded series has no history;
# `dcgm` adds matchers to every DCGM selector (e.g. 'GPU_I_ID!=""' for MIG instances only).

def node_pool_expr(*matchers: str) -> str:
    """Each node's pool from kube_node_labels; `matchers` narrow the nodes (e.g. to one environment)."""
    selector = ", ".join([f'{ksm_label(POOL_LABEL)}!=""', *matchers])
    return f"""max by (node, pool) (
  label_replace(kube_node_labels{{{selector}}}, "pool", "$1", "{ksm_label(POOL_LABEL)}", "(.+)")
)"""


NODE_POOL_EXPR = node_pool_expr()


def _sel(*matchers: str) -> str:
    kept = [m for m in matchers if m]
    return "{" + ", ".join(kept) + "}" if kept else ""


def unit_utilization_expr(node_pool: str = "gpushare:node_pool:info", dcgm: str = "") -> str:
    """Busy share of each hardware unit: the profiling ratio where present, else GPU_UTIL (device series, or the
    per-pod shares of a time-sliced GPU summed: GPU_UTIL is one of the two per-pod fields)."""
    util = f"""(
  max by ({UNIT}) (DCGM_FI_PROF_GR_ENGINE_ACTIVE{_sel(dcgm)})
  or max by ({UNIT}) (DCGM_FI_DEV_GPU_UTIL{_sel('vgpu=""', dcgm)}) / 100
  or clamp_max(sum by ({UNIT}) (DCGM_FI_DEV_GPU_UTIL{_sel('vgpu!=""', dcgm)}) / 100, 1)
)"""
    return _with_pool(to_node(util), node_pool)


def unit_memory_used_expr(node_pool: str = "gpushare:node_pool:info", dcgm: str = "") -> str:
    used = f"""(
  (max by ({UNIT}) (DCGM_FI_DEV_FB_USED{_sel('vgpu=""', dcgm)})
   or sum by ({UNIT}) (DCGM_FI_DEV_FB_USED{_sel('vgpu!=""', dcgm)})) * 1048576
)"""
    return _with_pool(to_node(used), node_pool)


def unit_memory_total_expr(used: str = "gpushare:unit_memory_used:bytes", dcgm: str = "") -> str:
    """Used + free, with free the device value (max over the per-pod copies)."""
    free = to_node(f"max by ({UNIT}) (DCGM_FI_DEV_FB_FREE{_sel(dcgm)}) * 1048576")
    return f"""(
{used}
)
+ on (node, UUID, GPU_I_ID) group_left
{free}"""


def gpu_utilization_expr(unit_util: str = "gpushare:unit_utilization:ratio",
                         compute: str = "gpushare:unit_compute:ratio") -> str:
    """Per physical GPU: each unit weighted by its share of the GPU's compute slices (1 for a whole GPU)."""
    return f"""sum by ({GPU_NODE}) (
  (
{unit_util}
  )
  * on (modelName, GPU_I_PROFILE) group_left () {compute}
)"""


def compute_fractions(pools: list[ResolvedPool]) -> dict[tuple[str, str], float]:
    """(GPU model, MIG profile or "") -> the unit's share of its GPU's compute slices."""
    out: dict[tuple[str, str], float] = {}
    for pool in pools:
        for node in pool.nodes:
            model = node.gpu_model
            out[(model.name, "")] = 1.0
            for profile in node.mig_layout or {}:
                mig = model.profiles[profile]
                out[(model.name, profile)] = round(mig.compute_slices / model.compute_slices_total, 6)
    return dict(sorted(out.items()))


def compute_fractions_expr(pools: list[ResolvedPool]) -> str:
    """The gpushare:unit_compute:ratio series as one inline expression (for queries over history)."""
    parts = []
    for (model_name, profile), fraction in compute_fractions(pools).items():
        part = f'label_replace(vector({fraction:g}), "modelName", "{model_name}", "", "")'
        if profile:
            part = f'label_replace({part}, "GPU_I_PROFILE", "{profile}", "", "")'
        parts.append(part)
    return "(\n  " + "\n  or ".join(parts) + "\n)"


def resource_gpu_shares(pools: list[ResolvedPool]) -> dict[tuple[str, str], tuple[float, float]]:
    """(pool, kube-state-metrics resource) -> the share of one physical GPU that one unit of the resource holds:
    (compute, memory). A whole GPU is 1; a MIG instance its compute (memory) slices over the GPU's; a time-slicing
    or MPS replica 1/replicas of what it shares."""
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for pool in pools:
        for node in pool.nodes:
            model = node.gpu_model
            backing: dict[str, tuple[float, float]] = {}
            for profile, count in (node.mig_layout or {}).items():
                mig = model.profiles[profile]
                named = f"nvidia.com/mig-{profile.replace('+', '.')}"
                resource = next((r for r in node.advertised if r.startswith(named)), None) or \
                    next(r for r in node.advertised if r.startswith("nvidia.com/gpu"))
                c, m = backing.get(resource, (0.0, 0.0))
                backing[resource] = (c + count * mig.compute_slices / model.compute_slices_total,
                                     m + count * mig.memory_slices / model.placement_units_total)
            for resource, advertised in node.advertised.items():
                per_gpu = advertised / node.gpus_per_node
                compute, memory = backing.get(resource, (1.0, 1.0))
                out[(pool.name, ksm_name(resource))] = (round(compute / per_gpu, 6), round(memory / per_gpu, 6))
    return dict(sorted(out.items()))


def allocated_gpus_expr(pools: list[ResolvedPool], allocated: str = "gpushare:namespace_allocated:units",
                        shares: str = "gpushare:resource_gpu_share:ratio") -> str:
    """GPU-equivalents allocated per namespace and pool: each requested unit weighted by its share of a GPU."""
    return f"""sum by (namespace, pool) (
  ({allocated})
  * on (pool, resource) group_left () {shares}
)"""


def used_gpus_expr(node_pool: str = "gpushare:node_pool:info", compute: str = "gpushare:unit_compute:ratio") -> str:
    """GPU-equivalents busy per namespace and pool, measured: whole GPUs and MIG instances whose DCGM series name
    the pod (GR_ENGINE_ACTIVE, GPU_UTIL only on whole GPUs), weighted by the unit's compute share. Time-sliced
    GPUs' per-pod copies (`vgpu`) are left out: the exporter cannot attribute their busy time."""
    busy = f"""(
  max by ({UNIT}, namespace) (DCGM_FI_PROF_GR_ENGINE_ACTIVE{{vgpu="", namespace!=""}})
  or max by ({UNIT}, namespace) (DCGM_FI_DEV_GPU_UTIL{{vgpu="", GPU_I_ID="", namespace!=""}}) / 100
)
* on (modelName, GPU_I_PROFILE) group_left () {compute}"""
    return "sum by (namespace, pool) (\n" + _with_pool(to_node(f"({busy})"), node_pool) + "\n)"


def physical_gpus_expr(node_pool: str = "gpushare:node_pool:info") -> str:
    """Physical GPUs per pool that DCGM reports (each GPU once, however many pod or instance series it has)."""
    util = unit_utilization_expr(node_pool)
    return f"count by (pool) (count by (node, UUID, pool) (\n{util}\n))"


def allocated_expr(node_pool: str = "gpushare:node_pool:info") -> str:
    """GPU resources requested by pending or running pods on the pools' nodes, by namespace, pool and resource."""
    return f"""sum by (namespace, pool, resource) (
  (
    kube_pod_container_resource_requests{{{GPU_RESOURCES}, node!=""}}
    * on (namespace, pod) group_left ()
    (max by (namespace, pod) (kube_pod_status_phase{{phase=~"Pending|Running"}}) == 1)
  )
  * on (node) group_left (pool) {node_pool}
)"""


def advertised_expr(node_pool: str = "gpushare:node_pool:info") -> str:
    return f"""sum by (pool, resource) (
  kube_node_status_allocatable{{{GPU_RESOURCES}}} * on (node) group_left (pool) {node_pool}
)"""


def replica_memory_expr(node_pool: str = "gpushare:node_pool:info") -> str:
    """Framebuffer of each pod on a time-sliced GPU (FB_USED is one of the two per-pod fields)."""
    return _with_pool(to_node(
        f'sum by ({HOST_LABELS}, UUID, GPU_I_ID, namespace, pod) (DCGM_FI_DEV_FB_USED{{vgpu!=""}}) * 1048576'),
        node_pool)


def pool_queues(fleet: ResolvedFleet, guardrails: Guardrails, pools: list[ResolvedPool]) -> dict[str, list[str]]:
    """Kueue ClusterQueues that can admit onto each pool: tenants with nominal or borrowable quota on a resource
    the pool's flavor serves."""
    names = {p.name for p in pools}
    out: dict[str, list[str]] = {}
    for ct in fleet_tenancy(fleet, guardrails, refuse=False).values():
        for flavor in ct.flavors:
            if flavor.name not in names:
                continue
            queues = [f"{QUEUE_PREFIX}{s.tenant.name}" for s in ct.shares
                      if any(s.nominal.get(r, 0) or s.borrowable.get(r, 0) for r in flavor.resources)]
            if queues:
                out[flavor.name] = sorted(queues)
    return out


def pool_requests_selector(pool: ResolvedPool) -> str:
    """kube_pod_container_resource_requests of the resources a pool advertises."""
    return f'kube_pod_container_resource_requests{{resource=~"{alternatives(_pool_resources(pool))}"}}'


UNSCHEDULABLE = "(max by (namespace, pod) (kube_pod_status_unschedulable) == 1)"
# A pod's gpushare.io/pool node selector (Kueue's ResourceFlavor puts it there at admission), where kube-state-metrics
# exports kube_pod_nodeselectors (opt-in: --metric-opt-in-list=kube_pod_nodeselectors).
NODE_SELECTOR = f"nodeselector_{ksm_name(POOL_LABEL)}"


def _pinned_elsewhere(pool: ResolvedPool) -> str:
    return f'kube_pod_nodeselectors{{{NODE_SELECTOR}!="", {NODE_SELECTOR}!="{pool.name}"}}'


def unschedulable_pod_age_expr(pool: ResolvedPool) -> str:
    """The oldest unschedulable pod that asks for a resource the pool advertises and is not pinned to another pool."""
    return f"""max(
  (time() - max by (namespace, pod) (kube_pod_created))
  and on (namespace, pod) {UNSCHEDULABLE}
  and on (namespace, pod) {pool_requests_selector(pool)}
  unless on (namespace, pod) {_pinned_elsewhere(pool)}
)"""


def pools_advertising(pools: list[ResolvedPool]) -> dict[str, list[str]]:
    """kube-state-metrics resource name -> the pools (of one cluster's rules) that advertise it."""
    out: dict[str, list[str]] = {}
    for p in pools:
        for res in _pool_resources(p):
            out.setdefault(res, []).append(p.name)
    return out


def unschedulable_requests_expr(pool: ResolvedPool, pools: list[ResolvedPool]) -> str:
    """GPU resources requested by unschedulable pods that the pool could run: all of a pod pinned to the pool by its
    gpushare.io/pool node selector; an unpinned pod's request split evenly over the pools that advertise its
    resource (a pod asking for nvidia.com/mig-3g.40gb counts once, across the pools that have that instance)."""
    pending = f"* on (namespace, pod) group_left () {UNSCHEDULABLE}"
    pinned = f'kube_pod_nodeselectors{{{NODE_SELECTOR}="{pool.name}"}}'
    parts = [f"sum({pool_requests_selector(pool)} {pending} and on (namespace, pod) {pinned})"]
    by_resource = pools_advertising(pools)
    for res in _pool_resources(pool):
        unpinned = f'kube_pod_nodeselectors{{{NODE_SELECTOR}!=""}}'
        share = f" / {len(by_resource.get(res, [pool.name]))}" if len(by_resource.get(res, [])) > 1 else ""
        parts.append(f'sum(kube_pod_container_resource_requests{{resource="{res}"}} {pending} '
                     f"unless on (namespace, pod) {unpinned}){share}")
    return sum_present(parts)


def sum_present(parts: list[str]) -> str:
    """The sum of the single-series expressions that have a value, and no value where none has one (so that "no
    data" stays apart from 0): each part is told apart by a label, joined with `or`, then summed."""
    if len(parts) == 1:
        return parts[0]
    labelled = [f'label_replace({x}, "part", "{i}", "", "")' for i, x in enumerate(parts)]
    return "sum(\n  " + "\n  or ".join(labelled) + "\n)"


def pool_zeros(pools: list[ResolvedPool]) -> str:
    """A 0 for each pool: `or`-ed after a per-pool sum that has no value when nothing is pending."""
    return " or ".join(f'label_replace(vector(0), "pool", "{p.name}", "", "")' for p in pools)


def queues_by_pool(fleet: ResolvedFleet, guardrails: Guardrails, pools: list[ResolvedPool]
                   ) -> tuple[dict[str, list[str]], dict[str, list[ResolvedPool]]]:
    """(pool -> the Kueue ClusterQueues that reach it, queue -> the pools it reaches)."""
    queues = pool_queues(fleet, guardrails, pools)
    reach: dict[str, list[ResolvedPool]] = {}
    for p in pools:
        for q in queues.get(p.name, []):
            reach.setdefault(q, []).append(p)
    return queues, reach


def _split(expr: str, ways: int) -> str:
    return f"{expr} / {ways}" if ways > 1 else expr


def queue_namespaces(fleet: ResolvedFleet) -> dict[str, str]:
    """Kueue ClusterQueue -> the namespace of its tenant (whose LocalQueue is the only one that reaches it)."""
    return {f"{QUEUE_PREFIX}{t.name}": t.namespace for t in fleet.tenants}


PENDING_PODS = '(max by (namespace, pod) (kube_pod_status_phase{phase="Pending"}) == 1)'


def _waiting_for(namespace: str, pool: ResolvedPool) -> str:
    """1 where a pod of the namespace waits unplaced (Pending, no node: Kueue's gate holds it, or the scheduler has
    not placed it) asking for a resource the pool advertises, else 0."""
    requests = (f'kube_pod_container_resource_requests{{namespace="{namespace}", node="", '
                f'resource=~"{alternatives(_pool_resources(pool))}"}}')
    return f"((count({requests} and on (namespace, pod) {PENDING_PODS}) > bool 0) or vector(0))"


def pool_pending_workloads_expr(pool: ResolvedPool, queues: list[str], reach: dict[str, list[ResolvedPool]],
                                namespaces: dict[str, str] | None = None) -> str:
    """Pending Kueue demand of the queues that reach a pool, counted once over the pools. Kueue does not say which
    flavor a pending workload waits for, only (with metrics.enableClusterQueueResources, Kueue 0.18 and later) its
    queue's pending requests per resource: those of each resource the pool advertises are split evenly over the
    pools the queue reaches that advertise it; a queue that has them, but none for what the pool advertises, adds 0
    here (its work waits for resources other pools have). A queue without any (Kueue without that setting) has its
    pending workloads attributed by what its tenant's waiting pods ask for (`namespaces`: queue -> namespace): split
    evenly over the pools it reaches that advertise a resource one of them requests, 0 on a pool that advertises
    none (a Kueue-gated pod names its GPU resource; a suspended Job has no pods yet); with no such pod, over every
    pool it reaches."""
    parts = []
    for q in queues:
        by_resource = [_split(f'sum(kueue_cluster_queue_resource_pending{{cluster_queue="{q}", resource="{res}"}})',
                              sum(1 for p in reach[q] if res in p.totals.advertised))
                       for res in sorted(pool.totals.advertised)]
        elsewhere = f'0 * count(kueue_cluster_queue_resource_pending{{cluster_queue="{q}"}})'
        pending = f'sum(kueue_pending_workloads{{cluster_queue="{q}"}})'
        workloads = _split(pending, len(reach[q]))
        namespace = (namespaces or {}).get(q)
        if namespace is not None and len(reach[q]) > 1:
            wanted = " + ".join(_waiting_for(namespace, p) for p in reach[q])
            workloads = (f"({pending} * {_waiting_for(namespace, pool)} / (({wanted}) > 0))\n"
                         f"  or ({workloads})")
        parts.append(f"(\n  {sum_present(by_resource)}\n) or ({elsewhere}) or ({workloads})")
    return sum_present(parts)


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


def _pool_resources(pool: ResolvedPool) -> list[str]:
    return [ksm_name(r) for r in pool.totals.advertised]


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
                         "sum by (namespace, pool) (\n" + _with_pool(to_node(f"({busy})")) + "\n)"))
    memory = f"""
  max by ({UNIT}, namespace) (DCGM_FI_DEV_FB_USED{{vgpu="", namespace!=""}})
  or sum by ({UNIT}, namespace) (DCGM_FI_DEV_FB_USED{{vgpu!="", namespace!=""}})
"""
    rules.append(_record("gpushare:namespace_memory_used:bytes",
                         "sum by (namespace, pool) (\n" + _with_pool(to_node(f"({memory}) * 1048576")) + "\n)"))
    for metric in ("gpu_busy:gpus", "memory_used:bytes"):
        rules.append(_record(f"gpushare:tenant_{metric}", f"""
sum by (tenant, pool) (gpushare:namespace_{metric} * on (namespace) group_left (tenant) gpushare:tenant:info)"""))
    rules.append(_record("gpushare:tenant_allocated:units", """
sum by (tenant, pool, resource) (
  gpushare:namespace_allocated:units * on (namespace) group_left (tenant) gpushare:tenant:info
)"""))
    rules += showback_rules(pools)
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


def _alert(name: str, expr: str, severity: str, summary: str, description: str, for_: str | None = None,
           labels: dict[str, str] | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": name, "expr": expr.strip()}
    if for_:
        rule["for"] = for_
    rule["labels"] = {"severity": severity, **(labels or {})}
    rule["annotations"] = {"summary": summary, "description": description}
    return rule


def alert_groups(fleet: ResolvedFleet, guardrails: Guardrails, pools: list[ResolvedPool],
                 labels: dict[str, str]) -> list[dict[str, Any]]:
    m = guardrails.monitoring
    crit = "|".join(str(x) for x in sorted(m.critical_xids))
    crit_gauge = " or ".join(f"DCGM_FI_DEV_XID_ERRORS == {x}" for x in sorted(m.critical_xids))
    gpu = "GPU {{ $labels.UUID }} ({{ $labels.modelName }}) on {{ $labels." + HOST_LABEL + " }}"

    health = [
        _alert("GpushareGpuXidCritical", f"""
max by ({DEVICE_ALERT}) ({dcgm_host(f"({crit_gauge}) and changes(DCGM_FI_DEV_XID_ERRORS[5m]) > 0")})
or max by ({DEVICE_ALERT}, xid) ({dcgm_host(f'DCGM_EXP_XID_ERRORS_COUNT{{xid=~"{crit}"}} > 0')})""",
               "critical", f"{gpu} reported a hardware XID",
               "A new XID from policies' critical list (monitoring.critical_xids): the value is the XID code, or the "
               "count in the exporter's window when the xid label is set. Drain the node and check the GPU "
               "(dcgmi diag -r 3); row-remap and ECC XIDs need a GPU reset.", labels=labels),
        _alert("GpushareGpuXidError", f"""
max by ({DEVICE_ALERT}) ({dcgm_host(
    f"(DCGM_FI_DEV_XID_ERRORS > 0 unless ({crit_gauge})) and changes(DCGM_FI_DEV_XID_ERRORS[5m]) > 0")})
or max by ({DEVICE_ALERT}, xid) ({dcgm_host(f'DCGM_EXP_XID_ERRORS_COUNT{{xid!~"{crit}"}} > 0')})""",
               "warning", f"{gpu} reported XID {{{{ $value }}}}",
               "A new XID outside the critical list: usually an application fault (13, 31, 43). On a shared GPU "
               "it can end the co-tenants' work too; find the pod from the time and the node.", labels=labels),
        _alert("GpushareGpuEccDoubleBitErrors",
               f"max by ({DEVICE_ALERT}) ({dcgm_host('increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m])')}) > 0",
               "critical", f"{gpu} had uncorrectable (double-bit) ECC errors",
               "Uncorrectable memory errors corrupt results. Drain the node; the GPU needs a reset for row "
               "remapping, and replacement if it repeats.", labels=labels),
        _alert("GpushareGpuRowRemapFailure",
               f"max by ({DEVICE_ALERT}) ({dcgm_host('DCGM_FI_DEV_ROW_REMAP_FAILURE')}) > 0",
               "critical", f"{gpu} failed to remap a memory row",
               "The GPU has no spare rows left for remapping: it should be replaced. Cordon the node.",
               labels=labels),
        _alert("GpushareGpuTemperatureHigh",
               f"max by ({DEVICE_ALERT}) ({dcgm_host('DCGM_FI_DEV_GPU_TEMP')}) > {m.gpu_temperature_celsius:g}",
               "warning", f"{gpu} is at {{{{ $value }}}} °C",
               f"Above monitoring.gpu_temperature_celsius ({m.gpu_temperature_celsius:g} °C) for "
               f"{m.temperature_for}: check airflow and fans before the GPU throttles.",
               m.temperature_for, labels),
        _alert("GpushareGpuMemoryTemperatureHigh",
               f"max by ({DEVICE_ALERT}) ({dcgm_host('DCGM_FI_DEV_MEMORY_TEMP')}) > {m.memory_temperature_celsius:g}",
               "warning", f"{gpu} memory is at {{{{ $value }}}} °C",
               f"HBM above monitoring.memory_temperature_celsius ({m.memory_temperature_celsius:g} °C) for "
               f"{m.temperature_for}: memory throttles independently of the die.", m.temperature_for, labels),
        _alert("GpushareGpuThermalThrottling",
               f"max by ({DEVICE_ALERT}) ({dcgm_host('rate(DCGM_FI_DEV_THERMAL_VIOLATION[5m])')}) / 1e9 > "
               f"{m.thermal_throttle_ratio:g}",
               "warning", f"{gpu} is thermally throttled {{{{ $value | humanizePercentage }}}} of the time",
               f"Clock throttling for thermal reasons above monitoring.thermal_throttle_ratio "
               f"({m.thermal_throttle_ratio:g}) for {m.thermal_throttle_for}: every tenant of the GPU runs slower.",
               m.thermal_throttle_for, labels),
        _alert("GpushareGpuMemoryNearlyFull", f"gpushare:unit_memory_used:ratio > {m.memory_full_ratio:g}",
               "warning", "{{ $labels.pool }}: GPU memory of {{ $labels.UUID }} {{ $labels.GPU_I_PROFILE }} on "
               "{{ $labels.node }} is {{ $value | humanizePercentage }} full",
               f"Framebuffer used / (used + free) above monitoring.memory_full_ratio ({m.memory_full_ratio:g}) for "
               f"{m.memory_full_for}. Time-sliced replicas have no memory isolation: the next allocation fails "
               "for whichever pod makes it.", m.memory_full_for, labels),
    ]

    capacity = [
        _alert("GpusharePoolUnderused",
               f"avg_over_time(gpushare:pool_utilization:ratio[1h]) < {m.pool_underused_ratio:g}",
               "info", "Pool {{ $labels.pool }} is {{ $value | humanizePercentage }} busy",
               f"The pool's GPUs have been busy less than monitoring.pool_underused_ratio "
               f"({m.pool_underused_ratio:g}) for {m.pool_underused_for}: share more (more replicas, smaller MIG "
               "instances) or free GPUs. `gpushare capacity` proposes the change.", m.pool_underused_for, labels),
        _alert("GpusharePoolContended", f"""
gpushare:pool_pending:sum >= {m.contended_pending_workloads}
and on (pool) gpushare:pool_queue_wait_seconds:max > {m.queue_wait_seconds:g}""",
               "warning", "Pool {{ $labels.pool }} has {{ $value }} GPU workloads waiting",
               f"At least monitoring.contended_pending_workloads ({m.contended_pending_workloads}) pending GPU "
               f"workloads (Kueue, or unschedulable GPU pods) while the queue wait exceeds "
               f"monitoring.queue_wait_seconds ({m.queue_wait_seconds:g} s) for {m.contended_for}: fewer replicas "
               "per GPU or more GPUs. `gpushare capacity` sizes it.", m.contended_for, labels),
        _alert("GpusharePoolAdvertisesMoreThanPlanned", """
sum by (pool) (gpushare:pool_advertised:units) > on (pool) gpushare:pool_advertised:planned""",
               "warning", "Pool {{ $labels.pool }} advertises {{ $value }} GPU resources, more than planned",
               "Nodes advertise more schedulable GPU resources than the environment file resolves to: a device "
               "plugin config was changed outside gpushare, so the oversubscription in effect is above the one "
               "the guardrails approved.", "1h", labels),
    ]

    mig_failed = " or ".join(
        f'max by (node) (kube_node_labels{{{ksm_label(label)}="failed"}})'
        for label in (MIG_STATE_LABEL, OPERATOR_MIG_STATE_LABEL))
    mig = [_alert("GpushareMigReconfigurationFailed", mig_failed, "critical",
                  "MIG reconfiguration failed on node {{ $labels.node }}",
                  f"The node's {MIG_STATE_LABEL} (Ansible-managed hosts) or {OPERATOR_MIG_STATE_LABEL} "
                  "(operator-managed pools) is failed. The node stays cordoned with its GPUs untouched; read the "
                  "reported PIDs or the mig-manager log, then rerun the rollout for this node.", labels=labels)]

    operand_pools = sorted(p.name for p in pools if any(n.managed_by != "gke" for n in p.nodes))
    pipeline = []
    if operand_pools:
        pipeline += [
            _alert("GpushareDcgmExporterAbsent", "absent(DCGM_FI_DEV_GPU_TEMP)", "critical",
                   "No dcgm-exporter metrics at all",
                   "No GPU reports DCGM metrics: utilization, health alerts and capacity planning are blind. Check "
                   "the dcgm-exporter DaemonSets and their ServiceMonitors.", m.absent_for, labels),
            _alert("GpushareDcgmExporterMissingOnNode", f"""
gpushare:node_pool:info{{pool=~"{alternatives(operand_pools)}"}}
unless on (node) {to_node(f'max by ({HOST_LABELS}) (DCGM_FI_DEV_GPU_TEMP)')}""",
                   "warning", "GPU node {{ $labels.node }} of pool {{ $labels.pool }} exports no DCGM metrics",
                   "The node carries a gpushare pool label but no DCGM series names it: its exporter is down, or "
                   "the node is opted out of the operator's exporter without the host exporter.",
                   m.absent_for, labels),
        ]
    pipeline.append(_alert(
        "GpushareNodePoolLabelsAbsent", f'absent(kube_node_labels{{{ksm_label(POOL_LABEL)}!=""}})', "critical",
        "kube-state-metrics exports no gpushare.io/pool node labels",
        "Every per-pool rule joins on the node's pool label: start kube-state-metrics with "
        "--metric-labels-allowlist=nodes=[" + ",".join(kube_state_metrics_label_allowlist()) + "].",
        m.absent_for, labels))
    if any(set(t.clusters) & {p.cluster for p in pools} for t in fleet.tenants):
        pipeline.append(_alert(
            "GpushareKueueMetricsAbsent", f'absent(kueue_pending_workloads{{cluster_queue=~"{QUEUE_PREFIX}.+"}})',
            "warning", "Kueue exports no metrics for the tenants' cluster queues",
            "Queue time and contention per pool come from Kueue: install its chart with enablePrometheus: true "
            "and scrape it.", m.absent_for, labels))

    return [
        {"name": "gpushare.health", "rules": health},
        {"name": "gpushare.capacity", "rules": capacity},
        {"name": "gpushare.mig", "rules": mig},
        {"name": "gpushare.pipeline", "rules": pipeline},
    ]


def prometheus_rule_groups(fleet: ResolvedFleet, guardrails: Guardrails, cluster: str | None = None
                           ) -> list[dict[str, Any]]:
    """The `spec.groups` of gpushare's PrometheusRule: for one cluster's pools, or for the whole environment."""
    pools = [p for p in fleet.pools if cluster is None or p.cluster == cluster]
    labels = {"environment": fleet.environment}
    if cluster is not None:
        labels["cluster"] = cluster
    interval = "1m"
    assert duration_seconds(interval) == 60  # the windows above assume one evaluation a minute
    return [{"name": "gpushare.recording", "interval": interval, "rules": recording_rules(fleet, guardrails, pools)},
            *alert_groups(fleet, guardrails, pools, labels)]


def prometheus_rule(fleet: ResolvedFleet, guardrails: Guardrails, cluster: str | None = None, *,
                    name: str = "gpushare-gpu", namespace: str = "monitoring",
                    labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The whole PrometheusRule object (what the Pulumi component creates)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/part-of": "gpushare", **(labels or {})}},
        "spec": {"groups": prometheus_rule_groups(fleet, guardrails, cluster)},
    }
