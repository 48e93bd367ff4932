"""Rules over the monitoring the plan sets up: every cluster with GPU pools runs dcgm-exporter and carries
gpushare's PrometheusRule."""

from __future__ import annotations

from collections.abc import Iterator

from gpushare.core.mappings import dig
from gpushare.policy.registry import Context, Finding, rule


@rule("gpu-pools-monitored", "mandatory",
      "Every cluster with GPU pools runs dcgm-exporter (the GPU Operator's, or a host exporter where DCGM runs on "
      "the hosts) and carries gpushare's PrometheusRule, so no pool goes unwatched.",
      "keep dcgmExporter enabled in the operator values and the Monitoring component in the program", needs_plan=True)
def _monitored(ctx: Context) -> Iterator[Finding]:
    clusters = sorted({p.cluster for p in ctx.fleet.pools})
    operators = {r.cluster: r for r in ctx.plan_of("helm.sh/v3:Release")
                 if str(r.inputs.get("chart", "")).endswith("gpu-operator")}
    rules = {r.cluster for r in ctx.plan_of("monitoring.coreos.com/v1:PrometheusRule")}
    for cluster in clusters:
        release = operators.get(cluster)
        if release is None:
            yield f"cluster {cluster}", "no GPU Operator release, so no dcgm-exporter"
        elif dig(release.inputs, "values", "dcgmExporter", "enabled", default=True) is False:
            yield f"cluster {cluster}", f"dcgm-exporter is disabled in release {release.name}"
        if cluster not in rules:
            yield f"cluster {cluster}", "no gpushare PrometheusRule (GPU health and sharing alerts)"

