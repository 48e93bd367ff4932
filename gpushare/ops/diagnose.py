"""Why the DCGM and kube-state-metrics series joined no pool: the one diagnosis of `gpushare capacity` and
`gpushare showback` when no pool has GPU utilization."""

from __future__ import annotations

import time
from typing import Any

from gpushare.core.errors import Problem
from gpushare.core.guardrails import duration_seconds
from gpushare.core.resolve import ResolvedFleet
from gpushare.ops.prometheus import Prometheus
from gpushare.render.monitoring import expressions as r
from gpushare.render.monitoring.promql import HOST_LABEL, LEGACY_HOST_LABEL

DCGM_UTILIZATION = "DCGM_FI_DEV_GPU_UTIL|DCGM_FI_PROF_GR_ENGINE_ACTIVE"


def _series_text(sample: dict[str, Any]) -> str:
    labels = dict(sample.get("metric", {}))
    name = labels.pop("__name__", "")
    shown = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())
                      if k in ("instance", "gpu", "UUID", "pod", "node"))
    return f"{name}{{{shown}}}"


def diagnose_join(prom: Prometheus, fleet: ResolvedFleet, window: str, at: float) -> Problem:
    """Why no pool has GPU utilization: which series lack which label (dcgm-exporter's hostname, or Hostname from
    exporters before 4.6.0-4.8.3; kube-state-metrics' node label) or do not match each other, and the exporter
    setting that fixes it."""
    when = f"the {window} before {time.strftime('%Y-%m-%d %H:%M', time.gmtime(at))} UTC"
    pool_label = r.ksm_label(r.POOL_LABEL)

    def some(name: str, selector: str) -> list[dict[str, Any]]:
        # Label sets only (no samples): the diagnosis stays cheap at any scrape interval and window.
        found = prom.series(name, selector, at - duration_seconds(window), at)
        return sorted(found, key=lambda s: sorted(s["metric"].items()))[:3]

    dcgm = some("DCGM utilization series", f'{{__name__=~"{DCGM_UTILIZATION}"}}')
    if not dcgm:
        return Problem(f"Prometheus at {prom.url} has no DCGM utilization series "
                       f"({DCGM_UTILIZATION.replace('|', ', ')}) in {when}",
                       fix="check --window and --end, and that dcgm-exporter is scraped")
    hostless = some("DCGM series without hostname",
                    f'{{__name__=~"{DCGM_UTILIZATION}", {HOST_LABEL}="", {LEGACY_HOST_LABEL}=""}}')
    if hostless:
        return Problem(
            f"DCGM series have no {HOST_LABEL} label ({LEGACY_HOST_LABEL} before dcgm-exporter 4.6.0-4.8.3), so "
            f"gpushare cannot tell which node (and pool) a GPU is on: "
            f"{', '.join(map(_series_text, hostless))} in {when}",
            fix="run dcgm-exporter without --no-hostname (-n) and without DCGM_EXPORTER_NO_HOSTNAME=true; on "
                f"Kubernetes give it NODE_NAME from the pod's spec.nodeName (the GPU Operator does), so {HOST_LABEL} "
                "is the node's name")
    nodes = some("kube_node_labels", "kube_node_labels")
    if not nodes:
        return Problem(f"Prometheus at {prom.url} has no kube_node_labels series in {when}",
                       fix="scrape kube-state-metrics (it exports kube_node_labels)")
    pooled = some("kube_node_labels with the pool label", f'kube_node_labels{{{pool_label}!=""}}')
    if not pooled:
        return Problem(
            f"kube_node_labels has no {pool_label} label (node label {r.POOL_LABEL}) on any series in {when}, e.g. "
            f"{', '.join(map(_series_text, nodes))}",
            fix="start kube-state-metrics with --metric-labels-allowlist=nodes=[" +
                ",".join(r.kube_state_metrics_label_allowlist()) + "] (Helm: metricLabelsAllowlist), and check that "
                "`pulumi up` labelled the nodes")
    hosts = sorted({str(s["metric"].get(HOST_LABEL) or s["metric"].get(LEGACY_HOST_LABEL)) for s in dcgm})
    names = sorted({str(s["metric"].get("node")) for s in pooled})
    return Problem(
        f"DCGM's {HOST_LABEL} values (e.g. {', '.join(hosts)}) match no node of kube_node_labels with a pool label "
        f"(e.g. {', '.join(names)}) for any pool of {fleet.environment} in {when}",
        fix=f"make dcgm-exporter's {HOST_LABEL} the Kubernetes node name (NODE_NAME from spec.nodeName on Kubernetes, "
            "or the host's name equal to the node's), and check that the pools' names match the environment file")
