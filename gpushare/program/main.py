"""The Pulumi program: `pulumi up -s <env>` makes the Kubernetes side of the stack's environment true.

Per cluster: a Kubernetes provider, the monitoring prerequisite, node opt-out labels and pool labels/taints on bare
metal, the NVIDIA stack (GPU Operator chart with every sharing config), cloud node pools, and gpushare's rules and
dashboards. Every cluster is computed and checked before the first resource is registered, so bad input fails the
preview with nothing applied. Outputs: capacity per pool and for the environment."""

from __future__ import annotations

from pathlib import Path

import pulumi

from gpushare.core.errors import GpushareError
from gpushare.core.guardrails import load_guardrails
from gpushare.core.paths import project_root
from gpushare.core.resolve import resolve
from gpushare.core.stacks import environment_escape, environment_file, stack_config
from gpushare.policy.deployer import DEPLOYER_FIX, deployer_findings
from gpushare.program.components import operator_values as ov
from gpushare.program.program import plan_cluster, register_cluster
from gpushare.program.stack_config import load_stack_config


def main() -> None:
    stack = load_stack_config()
    root = project_root()
    # `pulumi up` takes gpushare:environment from Pulumi.<stack>.yaml: that file is held to the workspace as
    # `gpushare check` reads it (core.stacks), and a relative value may not climb out of the workspace either.
    if (root / stack.file).is_file():
        stack_config(stack.stack)
    if not Path(stack.environment).is_absolute() and (
            escape := environment_escape(root / stack.file, stack.environment)) is not None:
        raise GpushareError(escape)
    fleet = resolve(environment_file(stack.environment, root))
    stack.check_clusters(list(fleet.clusters))
    refused = deployer_findings(stack.deployer.users, stack.deployer.groups, (t.namespace for t in fleet.tenants))
    if refused:
        raise GpushareError([stack.problem(f"deployer.{setting}", why, DEPLOYER_FIX) for setting, why in refused])
    guardrails = load_guardrails()
    kept = ov.kept_device_plugin_configs(stack.keep_device_plugin_configs, fleet, project_root(), stack.file)
    plans = []
    for cluster in fleet.clusters.values():
        if not any(p.cluster == cluster.name for p in fleet.pools):
            pulumi.log.warn(f"cluster {cluster.name} has no GPU pools: nothing is registered for it")
            continue
        plans.append(plan_cluster(fleet, cluster, stack, guardrails, kept, stack.charts(root)))
    for warning in fleet.warnings:
        pulumi.log.warn(warning)

    for plan in plans:
        register_cluster(fleet, plan)
    for pool in fleet.pools:
        pulumi.export(f"pool:{pool.name}", {"cluster": pool.cluster, "profile": pool.profile,
                                            **pool.totals.as_dict()})
    pulumi.export("environment", {"name": fleet.environment, **fleet.totals.as_dict()})


def run() -> None:
    """What the workspace's infra/__main__.py calls: the program, with bad input as one readable Pulumi error."""
    try:
        main()
    except GpushareError as err:
        raise pulumi.RunError(f"stack {pulumi.get_stack()} cannot be planned:\n{err}") from err


if __name__ == "__main__":  # `python -m gpushare.program.main`, and the preview when a workspace has no infra/
    run()
