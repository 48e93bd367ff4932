"""Monitoring for shared GPUs: dcgm-exporter fields, Prometheus rules, Grafana dashboards.

What the Pulumi Monitoring component calls (one source for every rule, field and panel):
- prometheus_rule_groups(fleet, guardrails[, cluster]) -> the `spec.groups` of the PrometheusRule
- dashboards(fleet) -> {file name: Grafana dashboard JSON}
- dcgm_counters(fleet) -> dcgm-exporter's counters CSV; dcgm_exporter_env(fleet) -> its env (virtual GPUs)
- kube_state_metrics_label_allowlist() -> node labels for kube-state-metrics' --metric-labels-allowlist"""

from __future__ import annotations

from typing import Any

from gpushare.core.files import yaml_text
from gpushare.core.guardrails import Guardrails
from gpushare.core.resolve import ResolvedFleet
from gpushare.render.monitoring.counters import read_counters
from gpushare.render.monitoring.expressions import kube_state_metrics_label_allowlist
from gpushare.render.monitoring.fields import dcgm_exporter_env, exported_fields, needs_virtual_gpus
from gpushare.render.monitoring.rules import prometheus_rule, prometheus_rule_groups

__all__ = [
    "dashboards", "dcgm_counters", "dcgm_exporter_env", "kube_state_metrics_label_allowlist", "prometheus_rule",
    "prometheus_rule_groups", "prometheus_rules_file", "render_monitoring",
]

COUNTERS_TEMPLATE = "dcgm-exporter-counters.csv.j2"
RULES_TEMPLATE = "prometheus-rules.yaml.j2"


def dcgm_counters(fleet: ResolvedFleet) -> str:
    """dcgm-exporter's counters CSV (its `--collectors` file): the defaults plus what gpushare's rules read."""
    from gpushare.render.templating import environment

    sections: dict[str, list[Any]] = {}
    for f in exported_fields():
        sections.setdefault(f.section or "Other", []).append(f)
    text = environment().get_template(COUNTERS_TEMPLATE).render(
        environment=fleet.environment, virtual_gpus=needs_virtual_gpus(fleet), sections=list(sections.items()))
    # A file dcgm-exporter refuses stops the exporter and with it every GPU metric: never hand one on.
    read_counters(text, f"gpushare/templates/{COUNTERS_TEMPLATE} (rendered for {fleet.environment})")
    return text


def prometheus_rules_file(fleet: ResolvedFleet, guardrails: Guardrails, cluster: str | None = None) -> str:
    """A Prometheus rules file (`groups:`) for promtool and reviewers; the PrometheusRule's spec is the same."""
    from gpushare.render.templating import environment

    return environment().get_template(RULES_TEMPLATE).render(
        environment=fleet.environment, cluster=cluster or "(all clusters)",
        groups=rules_yaml(prometheus_rule_groups(fleet, guardrails, cluster)))


def rules_yaml(groups: list[dict[str, Any]]) -> str:
    """The groups as the rules file lists them: multi-line expressions as literal blocks (gpushare.core.files)."""
    return yaml_text(groups).rstrip("\n")


def dashboards(fleet: ResolvedFleet) -> dict[str, dict[str, Any]]:
    """File name -> Grafana dashboard (JSON model), built with grafana-foundation-sdk."""
    from gpushare.render.monitoring.grafana import build_dashboards

    return build_dashboards(fleet)


def render_monitoring(fleet: ResolvedFleet, guardrails: Guardrails) -> dict[str, str]:
    """Relative path -> content, for `gpushare render` (under monitoring/)."""
    import json

    files = {"monitoring/dcgm-exporter-counters.csv": dcgm_counters(fleet)}
    for cluster in fleet.clusters:
        files[f"monitoring/{cluster}/prometheus-rules.yaml"] = prometheus_rules_file(fleet, guardrails, cluster)
    for name, model in dashboards(fleet).items():
        files[f"monitoring/dashboards/{name}"] = json.dumps(model, indent=2, sort_keys=True) + "\n"
    return files
