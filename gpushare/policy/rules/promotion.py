"""Rules over promotion: an environment promoted from another (prod from pilot) runs only what the other runs."""

from __future__ import annotations

from collections.abc import Iterator

from gpushare.policy.registry import Context, Finding, rule


@rule("promotion-from-pilot", "mandatory",
      "An environment promoted from another (prod from pilot) runs only profiles, MIG layouts, driver branches and "
      "toolkit versions that the other already runs.",
      "run the change in pilot first; `gpushare promote` checks how long and how well it ran there")
def _promotion(ctx: Context) -> Iterator[Finding]:
    source = ctx.promotion_source
    if source is None:
        if ctx.promotion_missing:
            yield (f"environment {ctx.name}", f"{ctx.name} is promoted from {ctx.promotion_missing} "
                   f"(policies/guardrails.yaml environments.{ctx.name}.promote_from), which has no environment file "
                   f"here: nothing shows {ctx.name}'s profiles, layouts, driver branches and toolkit ran there. Make "
                   f"environments/{ctx.promotion_missing}.yaml (gpushare import or init), or waive this until it "
                   "exists")
        return
    theirs = {
        "profile": {n.profile for n in source.nodes},
        "MIG layout": set(source.mig_configs),
        "driver branch": {f"R{n.driver_branch} on {n.gpu_model.name}" for n in source.nodes},
        "toolkit version": {source.env.defaults.toolkit_version} | {n.toolkit_version for n in source.nodes},
        "device-plugin config": {k for k, v in source.device_plugin_configs.items()},
    }
    ours = {
        "profile": {n.profile: n.pool for n in ctx.fleet.nodes},
        "MIG layout": {n.mig_config: n.pool for n in ctx.fleet.nodes if n.mig_config and n.mig_config in
                       ctx.fleet.mig_configs},
        "driver branch": {f"R{n.driver_branch} on {n.gpu_model.name}": n.pool for n in ctx.fleet.nodes},
        "toolkit version": {ctx.fleet.env.defaults.toolkit_version: "defaults"},
        "device-plugin config": {n.device_plugin_config: n.pool for n in ctx.fleet.nodes if n.device_plugin_config},
    }
    for what, used in ours.items():
        for value, pool in sorted(used.items()):
            if value not in theirs[what]:
                yield (f"pool {pool}" if pool != "defaults" else "defaults.toolkit_version",
                       f"{what} {value} does not run in {source.environment}")

