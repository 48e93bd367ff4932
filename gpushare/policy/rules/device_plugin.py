"""Rules over the device plugin's settings, wherever they are set (its config files, the plan's GPU Operator
releases, the stack's gpushare:operatorValues): its effective device list strategy is CDI or volume-mounts, and
nothing renames the resources it advertises GPUs under."""

from __future__ import annotations

from collections.abc import Iterator

from gpushare.core.nvidia.device_plugin import (
    DEVICE_LIST_ENV,
    SAFE_DEVICE_LIST_STRATEGIES,
    device_list_from_args,
    device_list_strategies,
)
from gpushare.core.nvidia.operator import effective_device_list_strategy
from gpushare.core.stacks import OPERATOR_VALUES_KEY
from gpushare.policy.device_plugin import RENAMING_FIX, renaming_findings
from gpushare.policy.registry import Context, Finding, operator_releases, rule, site_operator_values


def _unsafe_strategy(effective: list[str]) -> str | None:
    if not effective:
        return "the effective deviceListStrategy is empty"
    unsafe = [s for s in effective if s not in SAFE_DEVICE_LIST_STRATEGIES]
    if unsafe:
        return (f"the effective deviceListStrategy is {','.join(effective)}; only "
                f"{', '.join(SAFE_DEVICE_LIST_STRATEGIES)} keep NVIDIA_VISIBLE_DEVICES from reaching other GPUs")
    return None


@rule("device-list-strategy-not-envvar", "mandatory",
      "The device plugin's effective device list strategy (its config file, then the GPU Operator's env, "
      "devicePlugin.env and devicePlugin.args, in every spelling) is CDI or volume-mounts, never envvar: with envvar a "
      "container that sets NVIDIA_VISIBLE_DEVICES reaches GPUs it was not allocated.",
      "enable CDI in the cluster (cdi: true), and set no envvar DEVICE_LIST_STRATEGY in devicePlugin.env nor "
      "--device-list-strategy in devicePlugin.args")
def _device_list(ctx: Context) -> Iterator[Finding]:
    for name, cfg in sorted(ctx.fleet.device_plugin_configs.items()):
        problem = _unsafe_strategy(effective_device_list_strategy(cfg.content, None))
        if problem:
            yield f"config {name}", problem
    values_by_source = [(f"release {rel}", values) for rel, values in operator_releases(ctx)]
    site = site_operator_values(ctx)
    if site.get("devicePlugin") or site.get("cdi"):
        values_by_source.append((OPERATOR_VALUES_KEY, site))
    for where, values in values_by_source:
        plugin = values.get("devicePlugin") or {}
        if where == OPERATOR_VALUES_KEY:
            # The site's additions alone: judged for what they say, not with the defaults they would merge into.
            said = [device_list_strategies(e.get("value", "")) for e in plugin.get("env") or []
                    if str(e.get("name", "")).upper() == DEVICE_LIST_ENV]
            from_args = device_list_from_args(plugin.get("args") or [])
            for effective in [*said, *([from_args] if from_args is not None else [])]:
                problem = _unsafe_strategy(effective)
                if problem:
                    yield where, problem.replace("the effective", "the site's")
            continue
        problem = _unsafe_strategy(effective_device_list_strategy({}, values))
        if problem:
            yield where, problem
        for item in plugin.get("env") or []:
            spelt = str(item.get("name", ""))
            if spelt != DEVICE_LIST_ENV and spelt.upper().replace("-", "_") == DEVICE_LIST_ENV:
                yield (f"{where}, devicePlugin.env {spelt}",
                       f"devicePlugin.env sets {spelt}={item.get('value', '')!r}, a spelling of {DEVICE_LIST_ENV} the "
                       "plugin does not read: remove it so the setting that applies is the one reviewed")


@rule("operator-values-keep-resource-names", "mandatory",
      f"Nothing in the GPU Operator's values ({OPERATOR_VALUES_KEY} and the plan's releases) changes the names the "
      "device plugin advertises GPUs under: no mig.strategy other than the cluster's, no --mig-strategy or "
      "--config-file in devicePlugin.args (or their env), no other devicePlugin.config, no sandbox workloads.",
      RENAMING_FIX)
def _resource_names(ctx: Context) -> Iterator[Finding]:
    site = site_operator_values(ctx)
    for path, why in renaming_findings(site, None, site=True):
        yield f"{OPERATOR_VALUES_KEY}.{path}", why
    for r in ctx.plan_of("helm.sh/v3:Release"):
        if str(r.inputs.get("chart", "")).endswith("gpu-operator"):
            cluster = ctx.fleet.clusters.get(r.cluster)
            for path, why in renaming_findings(r.inputs.get("values", {}) or {},
                                               cluster.mig_strategy if cluster else None):
                yield f"release {r.name}, {path}", why

