"""The alerting rules: GPU health (XIDs, ECC, temperature, throttling, memory), pool capacity, sharing (noisy
neighbours, idle allocations, from the per-process exporter), MIG reconfiguration and the metrics pipeline. They read
the recording rules (recording.py) and the expressions and conventions of expressions.py; their thresholds are
monitoring's in policies/guardrails.yaml."""

from __future__ import annotations

from typing import Any

from gpushare.core.guardrails import Guardrails
from gpushare.core.resolve import ResolvedFleet, ResolvedPool
from gpushare.render.monitoring.expressions import (
    GPU_OF_POD,
    MIG_STATE_LABEL,
    OPERATOR_MIG_STATE_LABEL,
    POOL_LABEL,
    PROCESS_EXPORTER_ROLE,
    QUEUE_PREFIX,
    SHARED_SM,
    kube_state_metrics_label_allowlist,
    to_node,
)
from gpushare.render.monitoring.promql import HOST_LABEL, HOST_LABELS, alternatives, dcgm_host, ksm_label

DEVICE_ALERT = f"{HOST_LABEL}, UUID, gpu, modelName"  # over dcgm_host(...)


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

    pod_gpu = ("{{ $labels.namespace }}/{{ $labels.pod }} (tenant {{ $labels.tenant }}) on GPU {{ $labels.UUID }} "
               "of {{ $labels.node }}")
    sm_pods = f'gpushare:pod_gpu_sm_utilization_ratio:avg5m{{share=~"{SHARED_SM}"}}'
    sharing = [
        _alert("GpushareNoisyNeighbour", f"""
(
  gpushare:gpu_tenant_sm_share:ratio >= {m.noisy_neighbour_share:g}
  and on ({GPU_OF_POD}) (
    count by ({GPU_OF_POD}) (
      count by ({GPU_OF_POD}, tenant) ({sm_pods} > {m.noisy_neighbour_active_ratio:g})
    ) >= 2
  )
)
+ on ({GPU_OF_POD}, tenant) group_right ()
(0 * ({sm_pods} > {m.noisy_neighbour_active_ratio:g}))""",
               "warning", f"{pod_gpu}: tenant {{{{ $labels.tenant }}}} takes {{{{ $value | humanizePercentage }}}} "
               "of the GPU's SM time",
               f"On a {{{{ $labels.share }}}} GPU of pool {{{{ $labels.pool }}}}, tenant {{{{ $labels.tenant }}}}'s "
               f"pods took at least monitoring.noisy_neighbour_share ({m.noisy_neighbour_share:g}) of the SM time "
               f"used on the GPU for {m.noisy_neighbour_for} while another tenant's pod was active (above "
               f"monitoring.noisy_neighbour_active_ratio, {m.noisy_neighbour_active_ratio:g}): its neighbours "
               "wait for the GPU. Move the pod to a whole GPU or a MIG instance, or give the tenants separate GPUs.",
               m.noisy_neighbour_for, labels),
        _alert("GpushareIdleGpuAllocation", f"""
gpushare:pod_gpu_allocated_shares:sum > 0
and on ({GPU_OF_POD}, namespace, pod)
(gpushare:pod_gpu_sm_utilization_ratio:avg5m < {m.idle_allocation_ratio:g})""",
               "info", f"{pod_gpu} holds {{{{ $value }}}} GPU share(s) and does not use them",
               f"The pod has held a share of a GPU ({{{{ $labels.share }}}}) with SM use below "
               f"monitoring.idle_allocation_ratio ({m.idle_allocation_ratio:g}) for {m.idle_allocation_for}: "
               "others could run there. Ask its owner to release it (scale the notebook or job down).",
               m.idle_allocation_for, labels),
    ]
    pipeline.append(_alert(
        "GpushareProcessExporterDown", "gpushare_process_exporter_up == 0", "warning",
        "gpushare's process exporter on {{ $labels.instance }} cannot read {{ $labels.source }}",
        "The per-process exporter (role gpu_process_exporter) reports its source down (nvml: the driver; "
        "podresources: the kubelet's pod-resources socket): per-pod GPU use, the noisy-neighbour and idle-allocation "
        "alerts and `gpushare showback --basis use` miss this host.", m.absent_for, labels))
    shared_pools = sorted(p.name for p in pools if p.sharing in ("time-slicing", "mps")
                          and any(n.managed_by != "gke" for n in p.nodes))
    if shared_pools:
        pipeline.append(_alert(
            "GpushareProcessExporterAbsent", f"""
absent(gpushare_process_exporter_up)
and on () count(gpushare:node_pool:info{{pool=~"{alternatives(shared_pools)}"}}) > 0""",
            "warning", "No gpushare process exporter reports, yet time-sliced or MPS GPU nodes run",
            "Per-pod GPU use on shared GPUs comes from gpushare's per-process exporter: enable the Ansible role "
            f"{PROCESS_EXPORTER_ROLE} on the GPU hosts and scrape it. Until then the noisy-neighbour and "
            "idle-allocation alerts are blind and `gpushare showback --basis use` refuses to run.",
            m.absent_for, labels))

    return [
        {"name": "gpushare.health", "rules": health},
        {"name": "gpushare.capacity", "rules": capacity},
        {"name": "gpushare.sharing", "rules": sharing},
        {"name": "gpushare.mig", "rules": mig},
        {"name": "gpushare.pipeline", "rules": pipeline},
    ]
