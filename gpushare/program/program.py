"""How one cluster of the fleet becomes Pulumi resources: first every component's arguments, computed and checked
(`plan_cluster`), then the registration in the rollout order of docs/rollout.md (`register_cluster`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from gpushare.core import dra, spec
from gpushare.core.guardrails import Guardrails
from gpushare.core.resolve import ResolvedFleet, host_opt_outs
from gpushare.program.components import dra_driver
from gpushare.program.components import monitoring as mon
from gpushare.program.components import operator_values as ov
from gpushare.program.components.node_pool import GpuNodePool, GpuNodePoolArgs, node_pool_inputs
from gpushare.program.components.nvidia_stack import NvidiaStack, NvidiaStackArgs, prepare
from gpushare.program.components.tenancy import Tenancy, TenancyArgs
from gpushare.program.components.tenancy import prepare as prepare_tenancy
from gpushare.program.stack_config import ChartSource, StackConfig


@dataclass
class ClusterPlan:
    """One cluster's component arguments, checked, before any resource exists."""

    cluster: spec.Cluster
    context: str
    monitoring: mon.MonitoringArgs
    pools: list[GpuNodePoolArgs]
    nvidia: NvidiaStackArgs
    tenancy: TenancyArgs
    dra: dra_driver.DraDriverArgs | None = None  # DRA clusters only


def plan_cluster(fleet: ResolvedFleet, cluster: spec.Cluster, stack: StackConfig, guardrails: Guardrails,
                 kept: dict[str, dict[str, Any]], charts: ChartSource | None = None) -> ClusterPlan:
    charts = charts or ChartSource()
    context = stack.kubeconfig_context(cluster)
    monitoring = stack.monitoring_for(cluster)
    gke = stack.gke(cluster) if cluster.kind == "gke" else None
    eks = stack.eks(cluster) if cluster.kind == "eks" else None
    pools = [p for p in fleet.pools if p.cluster == cluster.name]
    opt_outs = host_opt_outs(n for p in pools for n in p.nodes)
    index = {p.name: i for i, p in enumerate(fleet.env.pools)}
    pool_args = [GpuNodePoolArgs(pool=p, cluster=cluster, profiles=fleet.profiles, opt_outs=opt_outs,
                                 gke=gke, eks=eks, source=str(fleet.source), index=index[p.name]) for p in pools]
    for args in pool_args:
        node_pool_inputs(args)
    nvidia = NvidiaStackArgs(
        fleet=fleet, cluster=cluster, monitoring_release=monitoring.release,
        kept_device_plugin_configs=ov.kept_for_cluster(kept, cluster, stack.adopted_configs),
        site_values=stack.operator_values,
        protect=stack.protect, gke_driver_installer=gke.driver_installer_manifest if gke else None, charts=charts)
    prepare(nvidia)
    monitoring_args = mon.MonitoringArgs(fleet=fleet, cluster=cluster, settings=monitoring, guardrails=guardrails,
                                      charts=charts)
    mon.prometheus_rule(fleet, guardrails, cluster, monitoring)
    mon.dashboard_configmaps(fleet)
    tenancy = TenancyArgs(fleet=fleet, cluster=cluster, guardrails=guardrails, kueue=stack.kueue_for(cluster),
                          jobset=stack.jobset_for(cluster),
                          infrastructure_namespaces=(ov.NAMESPACE, monitoring.namespace),
                          deployer=stack.deployer.identity(), charts=charts)
    prepare_tenancy(tenancy)
    driver = None
    if dra.is_dra(cluster):
        driver = dra_driver.DraDriverArgs(fleet=fleet, cluster=cluster, gpus=ov.ClusterGpus.of(fleet, cluster),
                                          protect=stack.protect, charts=charts)
        dra_driver.prepare(driver)
    return ClusterPlan(cluster, context, monitoring_args, pool_args, nvidia, tenancy, driver)


def register_cluster(fleet: ResolvedFleet, plan: ClusterPlan) -> None:
    name = plan.cluster.name
    provider = k8s.Provider(name, context=plan.context)
    monitoring = mon.Monitoring(f"{name}-monitoring", replace(plan.monitoring, provider=provider))
    # The order of docs/rollout.md: node opt-out labels first, then the NVIDIA stack, then cloud node pools.
    metal = [GpuNodePool(f"{name}-{a.pool.name}", replace(a, provider=provider))
             for a in plan.pools if a.pool.cloud is None]
    prerequisites: list[pulumi.Resource] = [*metal]
    if monitoring.prerequisite is not None:
        prerequisites.append(monitoring.prerequisite)
    nvidia = NvidiaStack(f"{name}-nvidia", replace(plan.nvidia, provider=provider, after=prerequisites))
    for a in plan.pools:
        if a.pool.cloud is not None:
            GpuNodePool(f"{name}-{a.pool.name}", replace(a, after=[nvidia.release]))
    tenancy_after: list[pulumi.Resource] = []
    if plan.dra is not None:
        # After the operator (driver, toolkit); tenants' claim templates name the classes it registers.
        tenancy_after.append(dra_driver.DraDriver(f"{name}-dra", replace(plan.dra, provider=provider,
                                                                         after=[nvidia.release])))
    Tenancy(f"{name}-tenancy", replace(plan.tenancy, provider=provider, after=tenancy_after))
