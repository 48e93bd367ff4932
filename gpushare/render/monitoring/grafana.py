"""Grafana dashboards, built with grafana-foundation-sdk from the fleet: fleet overview (physical versus advertised
GPUs, utilization per pool), tenants (usage and queue time), MIG instances, shared GPUs (who uses them, per pod and
tenant), and GPU health.

Panels read the recording rules (gpushare:*) wherever one exists, so a panel and an alert never disagree about
what "utilization" means; the health panels read DCGM fields directly, deduplicated per device (max over the
per-pod copies a time-sliced GPU exports)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model

from gpushare.core.resolve import ResolvedFleet
from gpushare.core.spec import SHARED_KINDS
from gpushare.render.monitoring.expressions import SHARED_SM
from gpushare.render.monitoring.promql import HOST_LABEL, LEGACY_HOST_LABEL, dcgm_host

DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
DEVICE = f"{HOST_LABEL}, UUID"  # over _on_node(...)


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class PanelSpec:
    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"  # or "stat"
    description: str = ""
    width: int = 12
    max: float | None = None


def _panel(spec: PanelSpec, panel_id: int) -> Any:
    builder: Any = stat.Panel() if spec.kind == "stat" else timeseries.Panel()
    builder = (builder.id(panel_id).title(spec.title).datasource(DATASOURCE).unit(spec.unit).span(spec.width)
               .height(4 if spec.kind == "stat" else 8))
    if spec.description:
        builder = builder.description(spec.description)
    if spec.kind == "timeseries":
        builder = builder.min(0)
    if spec.max is not None:
        builder = builder.max(spec.max)
    for i, q in enumerate(spec.queries):
        target = prometheus.Dataquery().expr(q.expr).ref_id(chr(ord("A") + i)).datasource(DATASOURCE)
        if q.legend:
            target = target.legend_format(q.legend)
        builder = builder.with_target(target)
    return builder


def _query_variable(name: str, label: str, query: str, multi: bool = True) -> db.QueryVariable:
    return (db.QueryVariable(name).label(label).datasource(DATASOURCE)
            .query({"query": query, "refId": f"{name}-values"})
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(model.VariableSort.ALPHABETICAL_ASC)
            .multi(multi).include_all(multi).all_value(".*"))


def _dashboard(uid: str, title: str, environment: str, description: str, variables: list[Any],
               rows: list[tuple[str, list[PanelSpec]]]) -> dict[str, Any]:
    builder = (db.Dashboard(title).uid(uid).description(description)
               .tags(["gpushare", "gpu", environment]).time("now-24h", "now").refresh("1m").timezone("browser")
               .readonly()
               .with_variable(db.DatasourceVariable("datasource").label("Prometheus").type("prometheus")))
    for variable in variables:
        builder = builder.with_variable(variable)
    panel_id = 0
    for row, panels in rows:
        panel_id += 1
        builder = builder.with_row(db.Row(row).id(panel_id))
        for spec in panels:
            panel_id += 1
            builder = builder.with_panel(_panel(spec, panel_id))
    data: dict[str, Any] = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    return data


POOL = 'pool=~"$pool"'


def _overview(fleet: ResolvedFleet) -> dict[str, Any]:
    shared = any(p.sharing in SHARED_KINDS for p in fleet.pools)
    rows: list[tuple[str, list[PanelSpec]]] = [
        ("Physical versus advertised", [
            PanelSpec("Physical GPUs (planned)", (Query(f"sum(gpushare:pool_physical_gpus:planned{{{POOL}}})"),),
                      kind="stat", width=4,
                      description="GPUs the environment file puts in the selected pools."),
            PanelSpec("Physical GPUs reporting", (Query(f"sum(gpushare:pool_physical_gpus:count{{{POOL}}})"),),
                      kind="stat", width=4, description="GPUs with DCGM metrics on nodes of the selected pools."),
            PanelSpec("Hardware units", (Query(f"sum(gpushare:pool_hardware_units:count{{{POOL}}})"),),
                      kind="stat", width=4, description="Whole GPUs and MIG instances reporting."),
            PanelSpec("Advertised GPU resources", (Query(f"sum(gpushare:pool_advertised:units{{{POOL}}})"),),
                      kind="stat", width=4, description="Schedulable GPU resources the device plugins advertise."),
            PanelSpec("Allocated", (Query(f"sum(gpushare:pool_allocated:units{{{POOL}}})"),), kind="stat", width=4,
                      description="GPU resources requested by pending or running pods on the pools' nodes."),
            PanelSpec("Oversubscription in effect", (Query(
                f"sum(gpushare:pool_advertised:units{{{POOL}}}) / sum(gpushare:pool_hardware_units:count{{{POOL}}})"),),
                kind="stat", width=4, unit="none",
                description="Advertised resources per hardware unit (whole GPU or MIG instance)."),
            PanelSpec("Advertised, hardware units and physical GPUs per pool", (
                Query(f"sum by (pool) (gpushare:pool_advertised:units{{{POOL}}})", "{{pool}} advertised"),
                Query(f"gpushare:pool_hardware_units:count{{{POOL}}}", "{{pool}} hardware units"),
                Query(f"gpushare:pool_physical_gpus:count{{{POOL}}}", "{{pool}} physical GPUs"),
            ), width=12),
            PanelSpec("Oversubscription per pool", (Query(f"gpushare:pool_oversubscription:ratio{{{POOL}}}",
                                                          "{{pool}}"),), unit="none", width=12),
        ]),
        ("Utilization", [
            PanelSpec("Utilization per pool", (Query(f"gpushare:pool_utilization:ratio{{{POOL}}}", "{{pool}}"),),
                      unit="percentunit", max=1,
                      description="Busy share of the pools' physical GPUs (a MIG instance weighs its compute "
                                  "slices)."),
            PanelSpec("GPU memory used per pool", (Query(f"gpushare:pool_memory_used:ratio{{{POOL}}}", "{{pool}}"),),
                      unit="percentunit", max=1),
            PanelSpec("Allocation per pool", (Query(f"gpushare:pool_allocation:ratio{{{POOL}}}", "{{pool}}"),),
                      unit="percentunit", max=1, description="Allocated / advertised GPU resources."),
            PanelSpec("Utilization per GPU", (Query(f"gpushare:gpu_utilization:ratio{{{POOL}}}",
                                                    "{{pool}} {{node}} {{UUID}}"),), unit="percentunit", max=1),
        ]),
        ("Queueing", [
            PanelSpec("Pending GPU workloads per pool", (Query(f"gpushare:pool_pending:sum{{{POOL}}}", "{{pool}}"),),
                      description="Kueue pending workloads of the queues that reach the pool, plus unschedulable "
                                  "GPU requests outside Kueue."),
            PanelSpec("Queue wait per pool", (Query(f"gpushare:pool_queue_wait_seconds:max{{{POOL}}}", "{{pool}}"),),
                      unit="s", description="Kueue admission wait p90, or the age of the oldest unschedulable GPU "
                                            "pod, whichever is longer."),
        ]),
    ]
    if shared:
        rows.append(("Time-sliced replicas", [
            PanelSpec("Memory per replica", (Query(f"gpushare:replica_memory_used:bytes{{{POOL}}}",
                                                   "{{pool}} {{namespace}}/{{pod}}"),), unit="bytes", width=24,
                      description="Framebuffer used by each pod on a time-sliced GPU (--kubernetes-virtual-gpus). "
                                  "Replicas share memory without isolation."),
        ]))
    return _dashboard(f"gpushare-overview-{fleet.environment}", f"gpushare fleet overview ({fleet.environment})",
                      fleet.environment, "Physical versus advertised GPUs and utilization per pool.",
                      [_query_variable("pool", "Pool", "label_values(gpushare:pool:info, pool)")], rows)


TENANT = 'tenant=~"$tenant"'


def _tenants(fleet: ResolvedFleet) -> dict[str, Any]:
    rows = [
        ("Usage", [
            PanelSpec("GPUs busy per tenant", (Query(f"sum by (tenant) (gpushare:tenant_gpu_busy:gpus{{{TENANT}}})",
                                                     "{{tenant}}"),),
                      description="GPU-equivalents of compute in use: a MIG instance counts with its share of the "
                                  "GPU; on time-sliced GPUs each pod's own GPU_UTIL."),
            PanelSpec("GPU memory per tenant", (Query(
                f"sum by (tenant) (gpushare:tenant_memory_used:bytes{{{TENANT}}})", "{{tenant}}"),), unit="bytes"),
            PanelSpec("Allocated GPU resources per tenant", (Query(
                f"sum by (tenant, resource) (gpushare:tenant_allocated:units{{{TENANT}}})",
                "{{tenant}} {{resource}}"),), width=24),
        ]),
        ("Queueing (Kueue)", [
            PanelSpec("Pending workloads", (Query(f"gpushare:tenant_pending_workloads:sum{{{TENANT}}}",
                                                  "{{tenant}}"),)),
            PanelSpec("Admission wait (p90)", (Query(f"gpushare:tenant_admission_wait_seconds:p90{{{TENANT}}}",
                                                     "{{tenant}}"),), unit="s"),
        ]),
    ]
    return _dashboard(f"gpushare-tenants-{fleet.environment}", f"gpushare tenants ({fleet.environment})",
                      fleet.environment, "GPU usage and queue time per tenant.",
                      [_query_variable("tenant", "Tenant", "label_values(gpushare:tenant:info, tenant)")], rows)


def _showback(fleet: ResolvedFleet) -> dict[str, Any]:
    """GPU-equivalents per tenant and idle per pool, the series `gpushare showback` sums over its window."""
    # The recording rules run once a minute, so a sum of 30 days of samples / 60 is GPU-hours.
    hours = "sum_over_time({expr}[30d]) / 60"
    rows = [
        ("GPU-hours, last 30 days", [
            PanelSpec("GPU-hours allocated per tenant", (Query(
                "sum by (tenant) (" + hours.format(expr=f"gpushare:tenant_allocated:gpus{{{TENANT}}}") + ")",
                "{{tenant}}"),), kind="stat", width=12,
                description="Each unit held counts with its share of a GPU: a MIG instance its compute slices, a "
                            "time-slicing or MPS replica 1/replicas."),
            PanelSpec("Idle GPU-hours per pool", (Query(
                "sum by (pool) (" + hours.format(expr=f"gpushare:pool_idle:gpus{{{POOL}}}") + ")", "{{pool}}"),),
                kind="stat", width=12),
        ]),
        ("Over time", [
            PanelSpec("GPUs allocated per tenant", (Query(
                f"sum by (tenant) (gpushare:tenant_allocated:gpus{{{TENANT}}})", "{{tenant}}"),)),
            PanelSpec("GPUs used per tenant (whole GPUs and MIG)", (Query(
                f"sum by (tenant) (gpushare:tenant_used:gpus{{{TENANT}}})", "{{tenant}}"),),
                description="Measured busy share where DCGM names the pod; time-sliced and MPS GPUs are "
                            "allocation-only."),
            PanelSpec("Idle GPUs per pool", (Query(f"gpushare:pool_idle:gpus{{{POOL}}}", "{{pool}}"),), width=24),
        ]),
    ]
    return _dashboard(f"gpushare-showback-{fleet.environment}", f"gpushare showback ({fleet.environment})",
                      fleet.environment, "GPU-hours per tenant and idle per pool; `gpushare showback` prices them.",
                      [_query_variable("tenant", "Tenant", "label_values(gpushare:tenant:info, tenant)"),
                       _query_variable("pool", "Pool", "label_values(gpushare:pool:info, pool)")], rows)


def _mig(fleet: ResolvedFleet) -> dict[str, Any]:
    rows = [
        ("MIG profiles", [
            PanelSpec("Utilization per MIG profile", (Query(f"gpushare:pool_mig_utilization:ratio{{{POOL}}}",
                                                            "{{pool}} {{GPU_I_PROFILE}}"),),
                      unit="percentunit", max=1),
            PanelSpec("Memory used per MIG profile", (Query(f"gpushare:pool_mig_memory_used:ratio{{{POOL}}}",
                                                            "{{pool}} {{GPU_I_PROFILE}}"),),
                      unit="percentunit", max=1),
            PanelSpec("Instances per MIG profile", (Query(f"gpushare:pool_mig_instances:count{{{POOL}}}",
                                                          "{{pool}} {{GPU_I_PROFILE}}"),)),
            PanelSpec("Allocated MIG resources", (Query(
                f'sum by (pool, resource) (gpushare:pool_allocated:units{{{POOL}, resource=~"nvidia_com_mig_.+"}})',
                "{{pool}} {{resource}}"),)),
        ]),
        ("Instances", [
            PanelSpec("Utilization per instance", (Query(
                f'gpushare:unit_utilization:ratio{{{POOL}, GPU_I_ID!=""}}',
                "{{node}} {{UUID}} {{GPU_I_PROFILE}} #{{GPU_I_ID}}"),), unit="percentunit", max=1, width=24),
            PanelSpec("MIG reconfiguration state (gpushare hosts)", (Query(
                "count by (label_gpushare_io_mig_config_state) "
                '(kube_node_labels{label_gpushare_io_mig_config_state!=""})',
                "{{label_gpushare_io_mig_config_state}}"),)),
            PanelSpec("MIG reconfiguration state (operator-managed)", (Query(
                "count by (label_nvidia_com_mig_config_state) "
                '(kube_node_labels{label_nvidia_com_mig_config_state!=""})',
                "{{label_nvidia_com_mig_config_state}}"),)),
        ]),
    ]
    return _dashboard(f"gpushare-mig-{fleet.environment}", f"gpushare MIG instances ({fleet.environment})",
                      fleet.environment, "MIG instances per profile: how busy and how full they are.",
                      [_query_variable("pool", "Pool", 'label_values(gpushare:pool:info{sharing=~"mig.*"}, pool)')],
                      rows)


SHARED_POOL = 'pool=~"$pool", tenant=~"$tenant", node=~"$node"'
# The SM share below which a pod holding a GPU share counts as idle: policies' monitoring.idle_allocation_ratio
# default (the alert GpushareIdleGpuAllocation reads the policy; dashboards are built from the fleet alone).
IDLE_SM = 0.01


def _shared_gpus(fleet: ResolvedFleet) -> dict[str, Any]:
    """Who uses a shared GPU: per pod and tenant on each time-sliced or MPS GPU, from gpushare's per-process
    exporter (role gpu_process_exporter); dcgm-exporter repeats the device's figures for every pod there."""
    shared = f'{SHARED_POOL}, share=~"{SHARED_SM}"'
    pod = "{{node}} {{UUID}} {{namespace}}/{{pod}}"
    # Only where the exporter measures SM use (a MIG instance's driver may not sample per process).
    idle = (f"gpushare:pod_gpu_allocated_shares:sum{{{SHARED_POOL}}} > 0\n"
            "and on (node, UUID, GPU_I_ID, namespace, pod)\n"
            f"max_over_time(gpushare:pod_gpu_sm_utilization_ratio:avg5m{{{SHARED_POOL}}}[1h]) < {IDLE_SM:g}")
    rows = [
        ("SM time per pod and tenant", [
            PanelSpec("SM use per pod, per GPU", (Query(
                f"gpushare:pod_gpu_sm_utilization_ratio:avg5m{{{shared}}}", pod),), unit="percentunit", max=1,
                description="Each pod's share of its GPU's SM time (5m average), as the process exporter measures "
                            "it from the driver's per-process samples."),
            PanelSpec("SM use per tenant, per GPU", (Query(
                f"gpushare:gpu_tenant_sm_utilization_ratio:avg5m{{{shared}}}", "{{node}} {{UUID}} {{tenant}}"),),
                unit="percentunit", max=1),
            PanelSpec("Tenant's share of the SM time used, per GPU", (Query(
                f"gpushare:gpu_tenant_sm_share:ratio{{{shared}}}", "{{node}} {{UUID}} {{tenant}}"),),
                unit="percentunit", max=1,
                description="Above monitoring.noisy_neighbour_share while another tenant's pod is active, for "
                            "monitoring.noisy_neighbour_for: GpushareNoisyNeighbour fires."),
            PanelSpec("SM used per tenant and pool", (Query(
                'sum by (tenant, pool) (gpushare:tenant_sm_used:gpus{pool=~"$pool", tenant=~"$tenant"})',
                "{{tenant}} {{pool}}"),),
                description="GPU-equivalents of SM time (every sharing kind): what `gpushare showback --basis use` "
                            "charges on time-sliced and MPS GPUs."),
        ]),
        ("Memory and allocations", [
            PanelSpec("GPU memory per pod", (Query(
                f"gpushare:pod_gpu_memory_used_bytes:avg5m{{{shared}}}", pod),), unit="bytes",
                description="Framebuffer used by each pod's processes: replicas share memory without isolation."),
            PanelSpec("Shares held per pod", (Query(
                f"gpushare:pod_gpu_allocated_shares:sum{{{shared}}}", pod),),
                description="Time-slicing replicas or MPS clients of the GPU each pod holds."),
            PanelSpec("Idle allocations (no SM use for an hour)", (Query(f"count(\n{idle}\n) or vector(0)"),),
                      kind="stat", width=6,
                      description=f"Pods holding a GPU share whose SM use stayed below {IDLE_SM:g} for the last "
                                  "hour. GpushareIdleGpuAllocation fires after monitoring.idle_allocation_for."),
            PanelSpec("Idle allocations per pod", (Query(idle, pod),), width=12),
            PanelSpec("Process exporter sources up", (Query(
                "min by (source) (gpushare_process_exporter_up)", "{{source}}"),), kind="stat", width=6,
                description="nvml (the driver) and podresources (the kubelet) on every GPU host: 0 where one "
                            "host cannot read it."),
        ]),
    ]
    return _dashboard(f"gpushare-shared-gpus-{fleet.environment}", f"gpushare shared GPUs ({fleet.environment})",
                      fleet.environment, "Who uses a shared GPU: SM time and memory per pod and tenant on "
                      "time-sliced and MPS GPUs, and allocations nobody uses.",
                      [_query_variable("pool", "Pool",
                                       f'label_values(gpushare:pool:info{{sharing=~"{SHARED_SM}"}}, pool)'),
                       _query_variable("tenant", "Tenant",
                                       'label_values(gpushare:pod_gpu_allocated_shares:sum{pool=~"$pool"}, tenant)'),
                       _query_variable("node", "Node",
                                       'label_values(gpushare:pod_gpu_allocated_shares:sum{pool=~"$pool"}, node)')],
                      rows)


def _on_node(template: str) -> str:
    """A DCGM query (`{sel}` where the selector goes) narrowed to the $node variable whichever spelling of the node
    label its exporter wrote, the node's name then in `hostname` (see promql.HOST_LABEL)."""
    either = " or ".join(template.replace("{sel}", f'{{{label}=~"$node"}}')
                         for label in (HOST_LABEL, LEGACY_HOST_LABEL))
    return dcgm_host(f"({either})")


LEGEND = "{{" + HOST_LABEL + "}} {{UUID}}"


def _health(fleet: ResolvedFleet) -> dict[str, Any]:
    rows = [
        ("Errors", [
            PanelSpec("Last XID per GPU", (Query(
                f"max by ({DEVICE}) ({_on_node('DCGM_FI_DEV_XID_ERRORS{sel}')})", LEGEND),), unit="none"),
            PanelSpec("XIDs in the exporter's window", (Query(
                f"max by ({DEVICE}, xid) ({_on_node('DCGM_EXP_XID_ERRORS_COUNT{sel}')})", LEGEND + " XID {{xid}}"),)),
            PanelSpec("Double-bit ECC errors", (Query(
                f"max by ({DEVICE}) ({_on_node('increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{sel}[$__rate_interval])')})",
                LEGEND),)),
            PanelSpec("Row remap failures", (Query(
                f"max by ({DEVICE}) ({_on_node('DCGM_FI_DEV_ROW_REMAP_FAILURE{sel}')})", LEGEND),)),
        ]),
        ("Thermals and throttling", [
            PanelSpec("GPU temperature", (Query(
                f"max by ({DEVICE}) ({_on_node('DCGM_FI_DEV_GPU_TEMP{sel}')})", LEGEND),), unit="celsius"),
            PanelSpec("Memory temperature", (Query(
                f"max by ({DEVICE}) ({_on_node('DCGM_FI_DEV_MEMORY_TEMP{sel}')})", LEGEND),), unit="celsius"),
            PanelSpec("Thermal throttling", (Query(
                f"max by ({DEVICE}) ({_on_node('rate(DCGM_FI_DEV_THERMAL_VIOLATION{sel}[$__rate_interval])')}) / 1e9",
                LEGEND),), unit="percentunit", max=1),
            PanelSpec("Power throttling", (Query(
                f"max by ({DEVICE}) ({_on_node('rate(DCGM_FI_DEV_POWER_VIOLATION{sel}[$__rate_interval])')}) / 1e9",
                LEGEND),), unit="percentunit", max=1),
        ]),
        ("Memory and exporters", [
            PanelSpec("Framebuffer used per GPU or MIG instance", (Query(
                'gpushare:unit_memory_used:ratio{node=~"$node"}', "{{node}} {{UUID}} {{GPU_I_PROFILE}}"),),
                unit="percentunit", max=1),
            PanelSpec("GPU nodes without DCGM metrics", (Query(
                'count(gpushare:node_pool:info{node=~"$node"} unless on (node) '
                f'max by (node) (label_replace({dcgm_host("DCGM_FI_DEV_GPU_TEMP")}, "node", "$1", "{HOST_LABEL}", '
                '"(.*)")))'),),
                kind="stat", width=6),
            PanelSpec("GPUs reporting", (Query(f"count(max by ({DEVICE}) ({_on_node('DCGM_FI_DEV_GPU_TEMP{sel}')}))"),),
                      kind="stat", width=6),
        ]),
    ]
    return _dashboard(f"gpushare-health-{fleet.environment}", f"gpushare GPU health ({fleet.environment})",
                      fleet.environment, "XID, ECC, row remapping, temperatures and throttling per GPU.",
                      [_query_variable("pool", "Pool", "label_values(gpushare:pool:info, pool)"),
                       _query_variable("node", "Node", 'label_values(gpushare:node_pool:info{pool=~"$pool"}, node)')],
                      rows)


def build_dashboards(fleet: ResolvedFleet) -> dict[str, dict[str, Any]]:
    out = {
        "gpushare-overview.json": _overview(fleet),
        "gpushare-tenants.json": _tenants(fleet),
        "gpushare-health.json": _health(fleet),
        "gpushare-showback.json": _showback(fleet),
    }
    if any(n.mig_layout for n in fleet.nodes):
        out["gpushare-mig.json"] = _mig(fleet)
    if any(p.sharing in SHARED_SM.split("|") for p in fleet.pools):
        out["gpushare-shared-gpus.json"] = _shared_gpus(fleet)
    return out


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expression) for every query of every panel, rows included."""
    out = []
    for panel in dashboard.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []) or []:
                if target.get("expr"):
                    out.append((inner.get("title", ""), target["expr"]))
    return out


def variable_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(variable name, query) of the query variables (label_values(...) queries)."""
    out = []
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        if variable.get("type") == "query" and query:
            out.append((variable["name"], query["query"] if isinstance(query, dict) else query))
    return out
