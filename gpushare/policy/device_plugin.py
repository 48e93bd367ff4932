"""The GPU Operator's device-plugin settings for a cluster, computed once: the values gpushare sets (mig.strategy,
cdi.enabled and DEVICE_LIST_STRATEGY in devicePlugin.env, each explicit) and what the plugin then really runs with,
built the way the operator builds its env (policy.rules). The Pulumi program's operator values use only these."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpushare.core import spec
from gpushare.core.resolve import device_plugin_content
from gpushare.policy.rules import DEVICE_LIST_ENV, effective_device_list_strategy, effective_device_plugin_env


def device_list_strategy(cluster: spec.Cluster) -> list[str]:
    """The strategy gpushare's device-plugin config files name for this cluster (CDI's pair, else volume-mounts)."""
    content = device_plugin_content(spec.ExclusiveProfile(name="gpushare-default", kind="exclusive"), cluster, None)
    return list(content["flags"]["plugin"]["deviceListStrategy"])


def device_plugin_values(cluster: spec.Cluster) -> dict[str, Any]:
    """The operator values that decide the plugin's settings; none is left to the operator, whose default is envvar."""
    return {
        "mig": {"strategy": cluster.mig_strategy},
        "cdi": {"enabled": cluster.cdi},
        "devicePlugin": {"env": [{"name": DEVICE_LIST_ENV, "value": ",".join(device_list_strategy(cluster))}]},
    }


@dataclass(frozen=True)
class DevicePluginSettings:
    """What the device plugin container runs with under the operator."""

    mig_strategy: str | None
    device_list_strategy: list[str]
    env: dict[str, str]


def effective_settings(values: Mapping[str, Any]) -> DevicePluginSettings:
    env = effective_device_plugin_env(values)
    return DevicePluginSettings(env.get("MIG_STRATEGY"), effective_device_list_strategy({}, values), env)


def settings_problems(values: Mapping[str, Any], cluster: spec.Cluster) -> list[str]:
    """Where the effective settings would differ from the cluster's, or let NVIDIA_VISIBLE_DEVICES widen access."""
    effective = effective_settings(values)
    strategies = effective.device_list_strategy
    problems = []
    if "envvar" in strategies or not strategies:
        problems.append(f"the device plugin's effective device list strategy would be {','.join(strategies)!r}"
                        ": a container setting NVIDIA_VISIBLE_DEVICES would reach GPUs it was not allocated")
    expected = device_list_strategy(cluster)
    if strategies != expected:
        problems.append(f"effective DEVICE_LIST_STRATEGY {','.join(strategies)} differs from the configs' "
                        f"{','.join(expected)}")
    if effective.mig_strategy != cluster.mig_strategy:
        problems.append(f"effective MIG_STRATEGY {effective.mig_strategy!r} differs from cluster "
                        f"{cluster.name!r}'s mig_strategy {cluster.mig_strategy!r}")
    return problems
