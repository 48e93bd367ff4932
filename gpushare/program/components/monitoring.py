"""Monitoring: gpushare's PrometheusRule and Grafana dashboards for one cluster (content from
gpushare.render.monitoring, the one source of rules, panels and the node-label allowlist), on the
kube-prometheus-stack the stack config names: an existing release (only gpushare's objects, with its `release`
label) or one installed here with a pinned chart."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi_kubernetes.apiextensions import CustomResource
from pulumi_kubernetes.core.v1 import ConfigMap, Namespace
from pulumi_kubernetes.helm.v3 import Release

from gpushare.core import spec
from gpushare.core.guardrails import Guardrails
from gpushare.core.resolve import ResolvedFleet
from gpushare.program.stack_config import ChartSource, MonitoringSettings
from gpushare.render import monitoring

KPS_CHART = "kube-prometheus-stack"
KPS_VERSION = "88.5.3"  # prometheus-operator v0.93.1, the CRDs' line (gpushare/data/crd-monitoring.coreos.com_*)
KPS_REPOSITORY = "https://prometheus-community.github.io/helm-charts"
DASHBOARD_LABEL = "grafana_dashboard"
RULE_NAME = "gpushare-gpu"


def node_labels_allowlist() -> str:
    """kube-state-metrics exports no node label unless --metric-labels-allowlist names it."""
    return f"nodes=[{','.join(monitoring.kube_state_metrics_label_allowlist())}]"


# Opt-in kube-state-metrics series the rules read: a pending pod's node selector attributes it to one pool.
KSM_OPT_IN = ("kube_pod_nodeselectors",)


def ksm_opt_in_arg() -> str:
    return f"--metric-opt-in-list={','.join(KSM_OPT_IN)}"


def kps_values() -> dict[str, Any]:
    return {
        "kube-state-metrics": {"metricLabelsAllowlist": [node_labels_allowlist()], "extraArgs": [ksm_opt_in_arg()]},
        "grafana": {"sidecar": {"dashboards": {
            "enabled": True, "label": DASHBOARD_LABEL, "labelValue": "1", "searchNamespace": "ALL"}}},
    }


def prometheus_rule(fleet: ResolvedFleet, guardrails: Guardrails, cluster: spec.Cluster,
                    settings: MonitoringSettings) -> dict[str, Any]:
    rule: dict[str, Any] = monitoring.prometheus_rule(
        fleet, guardrails, cluster.name, name=RULE_NAME, namespace=settings.namespace,
        labels={"release": settings.release})
    return rule


def dashboard_configmaps(fleet: ResolvedFleet) -> dict[str, tuple[str, str]]:
    """ConfigMap name -> (file name, dashboard JSON) for Grafana's dashboard sidecar."""
    import json

    out = {}
    for file, model in monitoring.dashboards(fleet).items():
        stem = re.sub(r"[^a-z0-9-]+", "-", file.removesuffix(".json").lower()).strip("-").removeprefix("gpushare-")
        out[f"dashboard-{stem}"] = (file, json.dumps(model, indent=2, sort_keys=True))
    return out


@dataclass
class MonitoringArgs:
    fleet: ResolvedFleet
    cluster: spec.Cluster
    settings: MonitoringSettings
    guardrails: Guardrails
    provider: pulumi.ProviderResource | None = None  # the cluster's Kubernetes provider
    charts: ChartSource = field(default_factory=ChartSource)


class Monitoring(pulumi.ComponentResource):
    """`prerequisite` is what other components of the cluster wait for (the installed chart and its CRDs)."""

    prerequisite: pulumi.Resource | None

    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpushare:monitoring:Monitoring", name, None, opts)
        settings = args.settings
        rule = prometheus_rule(args.fleet, args.guardrails, args.cluster, settings)
        dashboards = dashboard_configmaps(args.fleet)
        k8s = pulumi.ResourceOptions(parent=self, provider=args.provider)

        self.prerequisite = None
        if settings.mode == "install":
            namespace = Namespace(f"{name}-namespace", metadata={"name": settings.namespace}, opts=k8s)
            self.prerequisite = Release(
                f"{name}-kube-prometheus-stack", name=settings.release,
                **args.charts.release_args("kube-prometheus-stack", KPS_CHART, KPS_VERSION, KPS_REPOSITORY),
                namespace=settings.namespace,
                values=kps_values(),
                opts=pulumi.ResourceOptions.merge(k8s, pulumi.ResourceOptions(depends_on=[namespace])))
        else:
            pulumi.log.warn(
                f"cluster {args.cluster.name}: kube-prometheus-stack release {settings.release!r} already exists, so "
                f"its kube-state-metrics allowlist cannot be checked here; it must include {node_labels_allowlist()} "
                f"and run with {ksm_opt_in_arg()}")
        after = pulumi.ResourceOptions.merge(k8s, pulumi.ResourceOptions(
            depends_on=[self.prerequisite] if self.prerequisite else []))
        CustomResource(f"{name}-rules", api_version=rule["apiVersion"], kind=rule["kind"],
                       metadata=rule["metadata"], spec=rule["spec"], opts=after)
        for key, (file, text) in dashboards.items():
            ConfigMap(f"{name}-{key}", metadata={
                "name": f"gpushare-{key}", "namespace": settings.namespace,
                "labels": {"release": settings.release, "app.kubernetes.io/part-of": "gpushare", DASHBOARD_LABEL: "1"},
            }, data={file: text}, opts=after)
        self.register_outputs({"mode": settings.mode, "release": settings.release})
