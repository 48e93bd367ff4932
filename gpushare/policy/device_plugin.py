"""The GPU Operator's device-plugin settings for a cluster, computed once: the values gpushare sets (mig.strategy,
cdi.enabled and DEVICE_LIST_STRATEGY in devicePlugin.env, each explicit), what the plugin then really runs with
(built the way the operator builds its env, core.nvidia), and which operator values would rename the GPUs it
advertises. The Pulumi program's operator values use only these, and the device-plugin rules judge with the same."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpushare.core import spec
from gpushare.core.mappings import dig
from gpushare.core.nvidia.device_plugin import DEVICE_LIST_ENV, RENAMING_ENV, RENAMING_FLAGS, flag_from_args
from gpushare.core.nvidia.operator import effective_device_list_strategy, effective_device_plugin_env
from gpushare.core.resolve import device_plugin_content
from gpushare.core.stacks import OPERATOR_VALUES_KEY


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


# Operator values that decide which names GPUs are advertised under (core.nvidia.device_plugin's RENAMING_*).
# gpushare derives those names from the environment file (the cluster's mig_strategy, the profiles'
# rename_by_default), and tenants' quotas are checked against them; set in the GPU Operator's values they would
# rename GPUs past every quota and isolation rule.
RENAMING_FIX = ("set the device plugin through the environment file (the cluster's mig_strategy and cdi, the "
                "profiles' rename_by_default), where quotas follow it, and drop the setting from "
                f"{OPERATOR_VALUES_KEY}")


def renaming_findings(values: Mapping[str, Any], mig_strategy: str | None, site: bool = False
                      ) -> list[tuple[str, str]]:
    """(value path, why) for each GPU Operator value that would change the resource names the device plugin
    advertises. `mig_strategy`: the cluster's (None: any mig.strategy is refused). `site`: the values are the stack's
    own additions, where gpushare's device-plugin config (devicePlugin.config) may not be touched at all."""
    found: list[tuple[str, str]] = []
    plugin = values.get("devicePlugin") or {}
    plugin = plugin if isinstance(plugin, Mapping) else {}
    strategy = dig(values, "mig", "strategy")
    if strategy is not None and strategy != mig_strategy:
        found.append(("mig.strategy", f"mig.strategy {strategy!r} renames MIG instances (single advertises each as "
                      "nvidia.com/gpu) apart from the cluster's mig_strategy, which quotas are checked against"))
    args = plugin.get("args") or []
    for flag in RENAMING_FLAGS:
        if flag_from_args(args if isinstance(args, list) else [args], flag) is not None:
            found.append(("devicePlugin.args", f"devicePlugin.args sets --{flag}, which changes the names the "
                          "device plugin advertises GPUs under past every quota"))
    env = plugin.get("env") or []
    for item in env if isinstance(env, list) else []:
        spelt = str(item.get("name", "")) if isinstance(item, Mapping) else ""
        if spelt.upper().replace("-", "_") in RENAMING_ENV:
            found.append((f"devicePlugin.env {spelt}", f"devicePlugin.env sets {spelt}, which changes the names the "
                          "device plugin advertises GPUs under past every quota"))
    config = plugin.get("config") or {}
    if isinstance(config, Mapping) and (config if site else config.get("data")):
        found.append(("devicePlugin.config", "devicePlugin.config replaces gpushare's device-plugin configs "
                      "(resources, renameByDefault), whose names quotas are checked against"))
    if dig(values, "sandboxWorkloads", "enabled"):
        found.append(("sandboxWorkloads.enabled", "sandboxWorkloads.enabled advertises passthrough GPUs as "
                      "nvidia.com/<device name>, a resource no quota lists"))
    return found

