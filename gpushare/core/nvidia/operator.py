"""The GPU Operator: its pinned chart's values.yaml and the spec schema of its ClusterPolicy CRD (both copied into
gpushare/data from release CHART_VERSION), and how the operator builds the device plugin's env from its values
(gpu-operator assets/state-device-plugin/0500_daemonset.yaml and controllers/object_controls.go @ a22dbf6), so what
the plugin really runs with can be computed from the values alone."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

import yaml

from gpushare.core.mappings import dig
from gpushare.core.nvidia.device_plugin import DEVICE_LIST_ENV, device_list_from_args, device_list_strategies
from gpushare.core.paths import package_data

CHART_VERSION = "v26.7.0"  # the release whose values.yaml and ClusterPolicy CRD are copied into gpushare/data
# The env the GPU Operator's device-plugin DaemonSet starts from (gpu-operator assets/state-device-plugin/
# 0500_daemonset.yaml @ a22dbf6). Note DEVICE_LIST_STRATEGY=envvar: only CDI or devicePlugin.env replaces it.
DEVICE_PLUGIN_ASSET_ENV = {
    "PASS_DEVICE_SPECS": "true",
    "FAIL_ON_INIT_ERROR": "true",
    "DEVICE_LIST_STRATEGY": "envvar",
    "DEVICE_ID_STRATEGY": "uuid",
    "NVIDIA_VISIBLE_DEVICES": "all",
    "NVIDIA_DRIVER_CAPABILITIES": "all",
    "MPS_ROOT": "/run/nvidia/mps",
}
# What the operator sets with cdi.enabled (controllers/object_controls.go transformDevicePluginCtrForCDI @ a22dbf6).
OPERATOR_CDI_DEVICE_LIST = "cdi-annotations,cdi-cri"


@cache
def gpu_operator_chart_values() -> dict[str, Any]:
    """The pinned GPU Operator chart's values.yaml (gpushare/data), for the defaults the operator falls back on."""
    data = yaml.safe_load(package_data("gpu-operator-values.yaml").read_text())
    assert isinstance(data, dict)
    return data


@cache
def cluster_policy_spec_schema() -> dict[str, Any]:
    """The OpenAPI schema of the pinned ClusterPolicy CRD's spec (gpushare/data): every setting the operator takes."""
    crd = yaml.safe_load(package_data("crd-nvidia.com_clusterpolicies.yaml").read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def effective_device_plugin_env(values: Mapping[str, Any]) -> dict[str, str]:
    """The device plugin container's env the way the GPU Operator builds it: the asset's env, then MIG_STRATEGY from
    mig.strategy, then the CDI settings when cdi.enabled, then devicePlugin.env, which wins."""
    chart = gpu_operator_chart_values()
    env = dict(DEVICE_PLUGIN_ASSET_ENV)
    strategy = dig(values, "mig", "strategy", default=chart["mig"]["strategy"])
    if strategy:
        env["MIG_STRATEGY"] = str(strategy)
    if dig(values, "cdi", "enabled", default=chart["cdi"]["enabled"]):
        env[DEVICE_LIST_ENV] = OPERATOR_CDI_DEVICE_LIST
    for item in dig(values, "devicePlugin", "env") or []:
        env[str(item["name"])] = str(item.get("value", ""))
    return env


def effective_device_list_strategy(config: Mapping[str, Any], operator_values: Mapping[str, Any] | None
                                   ) -> list[str]:
    """What the device plugin really uses. Its flags override its config file, and under the GPU Operator the
    DEVICE_LIST_STRATEGY env is always set (envvar, CDI's pair, or devicePlugin.env's value, which wins); args given
    in devicePlugin.args beat the env (docs/nvidia-stack.md)."""
    flags = dig(config, "flags", "plugin") or {}
    result = device_list_strategies(flags.get("deviceListStrategy", "envvar"))
    if operator_values is not None:
        result = device_list_strategies(effective_device_plugin_env(operator_values)[DEVICE_LIST_ENV])
        from_args = device_list_from_args(dig(operator_values, "devicePlugin", "args") or [])
        if from_args is not None:
            result = from_args
    return result
