"""What the first rollout of an import does to the cluster's GPU Operator settings: gpushare installs the pinned
chart with its own values, so every ClusterPolicy setting is either one gpushare sets (to the same value, or to
another for a stated reason), or one it leaves to the chart's default, which drops the cluster's own value. The
import reports each setting that changes; this module finds them. Pure: it reads the ClusterPolicy's spec only."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpushare.core.mappings import dig
from gpushare.core.nvidia.operator import cluster_policy_spec_schema, gpu_operator_chart_values

# The operands gpushare turns off on a fleet of imported (bare-metal, Ansible-managed) hosts, as the Pulumi
# program's operator values do for such a cluster (program/components/operator_values.py; tests/unit/ops/brownfield/
# checks this table against it). Their other settings no longer matter, so only `enabled` is reported.
TURNED_OFF = {
    "driver": "Ansible takes the imported hosts over: it checks each host's driver (branch {driver}) and installs "
              "none, so where the operator's driver container provides the driver today, install that branch on "
              "every host before the first rollout",
    "toolkit": "Ansible installs the NVIDIA Container Toolkit ({toolkit}, from spec.toolkit.version) on every "
               "imported host",
    "migManager": "Ansible applies the MIG layouts on the imported hosts (mig-parted on the host)",
    "dcgm": "the exporter reads DCGM on the host, which Ansible's dcgm role runs",
}
# Operands gpushare keeps on: a cluster that had them off gets them.
TURNED_ON = {
    "devicePlugin": "gpushare's sharing configs reach the nodes through the operator's device plugin",
    "dcgmExporter": "gpushare's alerts, dashboards and capacity planning read dcgm-exporter",
}
# Settings the import itself carries over in another form: the configs become profiles and content-named configs.
CONVERTED = (("devicePlugin", "config"), ("migManager", "config"), ("mig", "strategy"), ("cdi", "enabled"))
# Settings gpushare writes itself, whatever the cluster had; a value other than the chart's default is replaced.
REPLACED = {
    ("devicePlugin", "env"): "gpushare sets the device plugin's env (its device list strategy and a config hash)",
    ("dcgmExporter", "env"): "gpushare sets the exporter's env (the fields it collects, the host's DCGM engine)",
    ("dcgmExporter", "config"): "gpushare's counters file (dcgm-exporter's defaults plus every field its rules "
                                "read) replaces the cluster's",
    ("dcgmExporter", "serviceMonitor"): "gpushare's monitoring sets the exporter's ServiceMonitor",
    ("dcgmExporter", "hostNetwork"): "the exporter reaches the host's DCGM on localhost",
    ("daemonsets", "tolerations"): "gpushare tolerates the chart's defaults and every pool taint; other "
                                   "tolerations are dropped",
    ("daemonsets", "labels"): "the chart writes its own operand labels",
}
KEEP_HINT = "to keep it, add it to gpushare:operatorValues in Pulumi.{env}.yaml"


@dataclass(frozen=True)
class Change:
    path: str  # dotted, below spec
    reason: str


_MISSING = object()


def _at(node: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return _MISSING
        node = node[key]
    return node


def _schema_at(path: tuple[str, ...]) -> dict[str, Any] | None:
    node: Any = cluster_policy_spec_schema()
    for key in path:
        node = dig(node, "properties", key)
        if node is None:
            return None
    return node if isinstance(node, dict) else None


def _leaves(node: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    if isinstance(node, dict) and node:
        return [leaf for k, v in node.items() for leaf in _leaves(v, (*path, str(k)))]
    return [(path, node)] if path else []


def _shown(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 100 else text[:97] + "..."


def _enabled(value: Any) -> bool:
    return value is True or str(value).lower() == "true"


def operator_changes(spec: dict[str, Any], env: str, driver: int, toolkit: str) -> list[Change]:
    """Every ClusterPolicy setting the first rollout of the import changes or drops, with why."""
    defaults = gpu_operator_chart_values()
    changes: list[Change] = []
    off = {c for c in TURNED_OFF if _enabled(_at(spec, (c, "enabled")))}
    for path, value in _leaves(spec):
        dotted = ".".join(path)
        if path[0] in TURNED_OFF:
            # Off after the rollout: its other settings do nothing, and one already off stays as it was.
            if path[0] in off and path[1:] == ("enabled",):
                changes.append(Change(dotted, f"{_shown(value)} -> false: " + TURNED_OFF[path[0]].format(
                    driver=driver, toolkit=toolkit)))
            continue
        if path[0] in TURNED_ON and path[1:] == ("enabled",):
            if not _enabled(value):
                changes.append(Change(dotted, f"{_shown(value)} -> true: {TURNED_ON[path[0]]}"))
            continue
        if any(path[:len(c)] == c for c in CONVERTED):
            continue
        default = _at(defaults, path)
        if default is _MISSING:
            schema = _schema_at(path)
            default = schema.get("default", _MISSING) if schema is not None else _MISSING
        if value == default or (default is _MISSING and value in (None, "", [], {})):
            continue
        replaced = next((why for prefix, why in REPLACED.items() if path[:len(prefix)] == prefix), None)
        if replaced is not None:
            changes.append(Change(dotted, f"{_shown(value)} is replaced: {replaced}"))
            continue
        schema = _schema_at(path) or {}
        if str(schema.get("description", "")).startswith("Deprecated"):
            changes.append(Change(dotted, f"{_shown(value)} is dropped: deprecated, the operator no longer uses it"))
            continue
        after = "leaves it unset" if default is _MISSING else f"puts back the chart's default {_shown(default)}"
        changes.append(Change(dotted, f"{_shown(value)} is dropped: the rollout installs the pinned GPU Operator "
                                      f"chart, which {after}; " + KEEP_HINT.format(env=env)))
    return changes
