"""Prometheus recording and alerting rules, rendered from the resolved fleet and the monitoring thresholds in
policies/guardrails.yaml: the assembly of the recording rules (recording.py) and the alerts (alerts.py) into the
PrometheusRule's groups. The sharing-aware conventions every rule follows are in expressions.py."""

from __future__ import annotations

from typing import Any

from gpushare.core.guardrails import Guardrails, duration_seconds
from gpushare.core.resolve import ResolvedFleet
from gpushare.render.monitoring.alerts import alert_groups
from gpushare.render.monitoring.recording import recording_rules


def prometheus_rule_groups(fleet: ResolvedFleet, guardrails: Guardrails, cluster: str | None = None
                           ) -> list[dict[str, Any]]:
    """The `spec.groups` of gpushare's PrometheusRule: for one cluster's pools, or for the whole environment."""
    pools = [p for p in fleet.pools if cluster is None or p.cluster == cluster]
    labels = {"environment": fleet.environment}
    if cluster is not None:
        labels["cluster"] = cluster
    interval = "1m"
    assert duration_seconds(interval) == 60  # the recording rules' windows assume one a minute
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
