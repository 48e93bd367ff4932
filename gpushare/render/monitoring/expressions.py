"""The PromQL building blocks of gpushare's rules: node and pool joins, per-unit, per-pod and per-pool expressions,
the Kueue and unschedulable-pod demand per pool. The recording rules (recording.py) and alerts (alerts.py) are
built from them, and so are `gpushare capacity`, `gpushare showback` and `gpushare promote`'s window queries, so
every figure means the same thing.

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
- Rules assume the ServiceMonitor keeps the exporter's own pod/namespace labels (honorLabels: true).
- Per pod on shared GPUs, the truth is gpushare's per-process exporter (role gpu_process_exporter: the
  gpushare_pod_gpu_* series, keyed like DCGM's by node label and UUID): recording.process_rules() and the
  gpushare.sharing alerts read it; dcgm-exporter's per-pod copies on a time-sliced GPU are the device's figures."""

from __future__ import annotations

from gpushare.core.guardrails import Guardrails
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
GPU_RESOURCES = 'resource=~"nvidia_com_.+"'

# Metrics gpushare's rules read that other exporters provide (DCGM fields come from fields.py).
KUBE_STATE_METRICS = frozenset({
    "kube_node_labels", "kube_node_status_allocatable", "kube_pod_container_resource_requests",
    "kube_pod_status_phase", "kube_pod_status_unschedulable", "kube_pod_created", "kube_pod_status_scheduled_time",
    "kube_pod_nodeselectors",  # opt-in; where absent, an unschedulable pod's request is split over the pools
})
KUEUE_METRICS = frozenset({"kueue_pending_workloads", "kueue_cluster_queue_resource_pending",
                           "kueue_admission_wait_time_seconds_bucket"})
# gpushare's per-process exporter (Ansible role gpu_process_exporter) on each GPU host: per GPU and pod container,
# with dcgm-exporter's node and UUID labels, the pod's namespace/pod/pod_uid/container/tenant and the GPU's `share`
# (time-slicing, mps, mig, exclusive); host processes have pod="" and container="".
PROCESS_EXPORTER_METRICS = frozenset({
    "gpushare_pod_gpu_sm_utilization_ratio", "gpushare_pod_gpu_memory_used_bytes",
    "gpushare_pod_gpu_allocated_shares", "gpushare_process_exporter_up",
})
PROCESS_EXPORTER_ROLE = "gpushare.fleet.gpu_process_exporter"
# Sharing kinds (the exporter's `share`) whose pods share one GPU's SM time without hardware isolation.
SHARED_SM = "time-slicing|mps"
# A pod's series on one GPU (or MIG instance) after the join to its node's pool.
POD_GPU = "node, UUID, gpu, GPU_I_ID, share, namespace, pod, tenant, pool"
GPU_OF_POD = "node, UUID, GPU_I_ID"


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


def with_pool(expr: str, node_pool: str = "gpushare:node_pool:info") -> str:
    """A series keyed by `node` joined to its node's pool."""
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
    return with_pool(to_node(util), node_pool)


def unit_memory_used_expr(node_pool: str = "gpushare:node_pool:info", dcgm: str = "") -> str:
    used = f"""(
  (max by ({UNIT}) (DCGM_FI_DEV_FB_USED{_sel('vgpu=""', dcgm)})
   or sum by ({UNIT}) (DCGM_FI_DEV_FB_USED{_sel('vgpu!=""', dcgm)})) * 1048576
)"""
    return with_pool(to_node(used), node_pool)


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
    return "sum by (namespace, pool) (\n" + with_pool(to_node(f"({busy})"), node_pool) + "\n)"


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
    return with_pool(to_node(
        f'sum by ({HOST_LABELS}, UUID, GPU_I_ID, namespace, pod) (DCGM_FI_DEV_FB_USED{{vgpu!=""}}) * 1048576'),
        node_pool)


def pod_gpu_expr(metric: str, over: str = "", node_pool: str = "gpushare:node_pool:info", matcher: str = "") -> str:
    """The process exporter's per-container series summed per pod and GPU, keyed by node and pool: host processes
    (pod="") left out, an unknown tenant ("") replaced by the namespace, duplicates of a restarted exporter
    (another `instance`) counted once. `over` wraps each selector (e.g. "avg_over_time({}[5m])"); `matcher` narrows
    it (e.g. to shared GPUs)."""
    def sel(matchers: str) -> str:
        selector = f"{metric}{{{', '.join(m for m in (matchers, matcher) if m)}}}"
        return over.format(selector) if over else selector

    named = f"""(
  {sel('pod!="", tenant!=""')}
  or label_replace({sel('pod!="", tenant=""')}, "tenant", "$1", "namespace", "(.*)")
)"""
    container = f"max by ({HOST_LABELS}, UUID, gpu, GPU_I_ID, share, namespace, pod, container, tenant) {named}"
    return f"sum by ({POD_GPU}) (\n" + with_pool(to_node(f"({container})"), node_pool) + "\n)"


def sm_used_expr(node_pool: str = "gpushare:node_pool:info") -> str:
    """GPU-equivalents of SM time per namespace and pool on time-sliced and MPS GPUs, as the process exporter
    measures each pod's share (what `gpushare showback --basis use` splits a shared GPU's hours by)."""
    pods = pod_gpu_expr("gpushare_pod_gpu_sm_utilization_ratio", node_pool=node_pool, matcher=f'share=~"{SHARED_SM}"')
    return f"sum by (namespace, pool) (\n{pods}\n)"


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


def _pool_resources(pool: ResolvedPool) -> list[str]:
    return [ksm_name(r) for r in pool.totals.advertised]
