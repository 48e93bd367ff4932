"""Tenancy: per cluster, Kueue (pinned chart, metrics on) and gpushare's tenant namespaces, quotas, host defaults,
priority classes, Kueue flavors and queues, the tenant roles and their RoleBindings, and the admission policies that
guard tenant namespaces.

Every object comes from gpushare.core.tenancy and gpushare.admission (the one place their numbers are decided); this
component only registers them, one resource per object so each shows in the preview and reaches the policies."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pulumi
import yaml
from pulumi_kubernetes.admissionregistration.v1 import ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding
from pulumi_kubernetes.apiextensions import CustomResource
from pulumi_kubernetes.core.v1 import LimitRange, Namespace, ResourceQuota
from pulumi_kubernetes.helm.v3 import Release
from pulumi_kubernetes.rbac.v1 import ClusterRole, RoleBinding
from pulumi_kubernetes.resource.v1 import ResourceClaimTemplate
from pulumi_kubernetes.scheduling.v1 import PriorityClass

from gpushare.core import dra, spec
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.guardrails import Guardrails
from gpushare.core.paths import package_data
from gpushare.core.resolve import ResolvedFleet
from gpushare.core.tenancy import (
    KUEUE_EXCLUDED_PREFIXES,
    ClusterTenancy,
    cluster_tenancy,
    kueue_resources,
    priority_class_names,
)
from gpushare.policy.admission import Deployer, DraClaims, admission_objects, kueue_user, pool_taints
from gpushare.program.stack_config import ChartSource, JobSetSettings, KueueSettings

KUEUE_CHART = "oci://registry.k8s.io/kueue/charts/kueue"
KUEUE_VERSION = "0.19.2"
KUEUE_VALUES = {"enablePrometheus": True}  # Kueue exposes no metrics unless asked (docs/nvidia-stack.md)


@cache
def kueue_chart_defaults() -> dict[str, Any]:
    data = yaml.safe_load(package_data("kueue-values.yaml").read_text())
    assert isinstance(data, dict)
    return data


def check_kueue_values(values: dict[str, Any]) -> list[Problem]:
    defaults = kueue_chart_defaults()
    return [Problem(f"Kueue chart {KUEUE_VERSION} has no value {key!r}", path=f"kueue.{key}",
                    fix="use a key from the pinned chart's values.yaml (gpushare/data/kueue-values.yaml)")
            for key in values if key not in defaults]


@dataclass
class TenancyArgs:
    fleet: ResolvedFleet
    cluster: spec.Cluster
    guardrails: Guardrails
    kueue: KueueSettings
    jobset: JobSetSettings = field(default_factory=lambda: JobSetSettings.model_validate({}))
    # Namespaces this stack deploys infrastructure into (operator, Kueue, monitoring): never a tenant's.
    infrastructure_namespaces: tuple[str, ...] = ()
    deployer: Deployer = field(default_factory=Deployer)
    provider: pulumi.ProviderResource | None = None
    # DRA clusters: the driver and its DeviceClasses, which tenants' claim templates name.
    after: list[pulumi.Resource] = field(default_factory=list)
    charts: ChartSource = field(default_factory=ChartSource)


def kueue_values(fleet: ResolvedFleet, cluster: spec.Cluster) -> dict[str, Any]:
    """Kueue's chart values: its Configuration exports pending work per ClusterQueue and resource (the recording
    rules and `gpushare capacity` attribute demand to pools with it), leaves host cpu and memory out of quota (the
    queues cover GPUs only, core.tenancy.KUEUE_EXCLUDED_PREFIXES); on DRA clusters it also maps each gpushare
    DeviceClass to the quota name the device-plugin path uses for the same profile, so one quota counts on both."""
    config = yaml.safe_load(kueue_chart_defaults()["managerConfig"]["controllerManagerConfigYaml"])
    config["metrics"] = {**config.get("metrics", {}), "enableClusterQueueResources": True}
    mappings = dra.kueue_device_class_mappings(fleet, cluster.name)
    config["resources"] = {**config.get("resources", {}), **kueue_resources(mappings)}
    values: dict[str, Any] = {**KUEUE_VALUES,
                              "managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(config, sort_keys=False)}}
    gates = dra.kueue_feature_gates(mappings)
    if gates:  # the chart passes them as --feature-gates (its Configuration's featureGates may not be set beside)
        values["controllerManager"] = {"featureGates": [{"name": k, "enabled": v} for k, v in sorted(gates.items())]}
    return values


def device_class_mapping_problems(mappings: list[dict[str, Any]]) -> list[Problem]:
    """What Kueue's configuration validation would refuse at start-up (the manager would not run)."""
    return [Problem(message, fix=fix) for message, fix in dra.mapping_limit_problems(mappings)]


def dra_claims(fleet: ResolvedFleet, cluster: spec.Cluster) -> DraClaims | None:
    """What admission lets tenants' pods claim on a DRA cluster; None on device-plugin clusters."""
    if not dra.is_dra(cluster):
        return None
    templates = {t.name: tuple(sorted(dra.allowed_templates(fleet, cluster.name, t))) for t in fleet.tenants}
    isolated = tuple(p.name for p in dra.class_plans(fleet, cluster.name) if p.hardware_isolated)
    return DraClaims(templates={k: v for k, v in templates.items() if v}, isolated=isolated)


def system_namespace_problems(args: TenancyArgs) -> list[Problem]:
    """Tenants of this cluster whose namespace is a system one or one the stack deploys infrastructure into."""
    extra = (*args.infrastructure_namespaces, args.kueue.namespace)
    problems = []
    for i, t in enumerate(args.fleet.tenants):
        if args.cluster.name in t.clusters and spec.is_system_namespace(t.namespace, extra):
            problems.append(Problem(
                f"tenant {t.name!r} uses namespace {t.namespace!r}, which cluster {args.cluster.name!r} runs "
                "infrastructure in (the stack config names it): admission and Pod Security would not guard it",
                file=str(args.fleet.source), path=f"tenants[{i}].namespace",
                fix="give the tenant its own namespace, or move the infrastructure in the stack config"))
    return problems


def prepare(args: TenancyArgs) -> ClusterTenancy:
    """The cluster's tenancy objects, checked before any resource exists."""
    problems = check_kueue_values(kueue_values(args.fleet, args.cluster)) + system_namespace_problems(args)
    problems += device_class_mapping_problems(dra.kueue_device_class_mappings(args.fleet, args.cluster.name))
    if problems:
        raise GpushareError(problems)
    tenancy = cluster_tenancy(args.fleet, args.cluster.name, args.guardrails)
    limits = args.guardrails.environments.get(args.fleet.environment)
    if tenancy.over_capacity and limits is not None and limits.quota_above_capacity == "error":
        raise GpushareError(tenancy.over_capacity)
    return tenancy


def _meta(obj: dict[str, Any]) -> Any:
    return obj["metadata"]


class TopLevelCustomResource(pulumi.CustomResource):
    """A custom resource whose fields sit at the top level (Kueue's WorkloadPriorityClass has `value`, no `spec`),
    which apiextensions.CustomResource cannot carry; the Kubernetes provider takes any such type token."""

    def __init__(self, name: str, obj: dict[str, Any], opts: pulumi.ResourceOptions) -> None:
        super().__init__(f"kubernetes:{obj['apiVersion']}:{obj['kind']}", name, dict(obj), opts)


class Tenancy(pulumi.ComponentResource):
    def __init__(self, name: str, args: TenancyArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpushare:tenancy:Tenancy", name, None, opts)
        tenancy = prepare(args)
        for warning in tenancy.warnings:
            pulumi.log.warn(warning)
        k8s = pulumi.ResourceOptions(parent=self, provider=args.provider)

        kueue: list[pulumi.Resource] = []
        if args.kueue.mode == "install":
            kueue.append(Release(
                f"{name}-kueue", name="kueue", **args.charts.release_args("kueue", KUEUE_CHART, KUEUE_VERSION),
                namespace=args.kueue.namespace, create_namespace=True,
                values=kueue_values(args.fleet, args.cluster), opts=k8s))
        else:
            # gpushare cannot change a Kueue it did not install: say what its Configuration needs.
            pulumi.log.warn(f"cluster {args.cluster.name} runs its own Kueue: its Configuration needs "
                            f"resources.excludeResourcePrefixes {list(KUEUE_EXCLUDED_PREFIXES)} (gpushare's queues "
                            "cover GPUs only and every tenant pod asks for cpu and memory, so Kueue would admit no "
                            "tenant work; docs/tenancy.md)")
            mappings = dra.kueue_device_class_mappings(args.fleet, args.cluster.name)
            if mappings:
                gates = dra.kueue_feature_gates(mappings)
                pulumi.log.warn(f"cluster {args.cluster.name} runs its own Kueue: add gpushare's deviceClassMappings "
                                "(`gpushare plan`, docs/dra.md) to its Configuration"
                                + (f" and turn on its feature gate(s) {', '.join(sorted(gates))}" if gates else "")
                                + ", or DRA workloads stay inadmissible")
            pulumi.log.info(f"cluster {args.cluster.name} runs its own Kueue: set metrics.enableClusterQueueResources "
                            "in its Configuration, or capacity splits pending work evenly (docs/capacity.md)")

        namespaces: dict[str, pulumi.Resource] = {}
        roles: dict[str, pulumi.Resource] = {}
        for obj in tenancy.objects:
            if obj["kind"] == "Namespace":
                namespaces[obj["metadata"]["name"]] = Namespace(
                    f"{name}-ns-{obj['metadata']['name']}", metadata=_meta(obj), opts=k8s)
            elif obj["kind"] == "ClusterRole":
                roles[obj["metadata"]["name"]] = ClusterRole(
                    f"{name}-clusterrole-{obj['metadata']['name']}", metadata=_meta(obj), rules=obj["rules"],
                    opts=k8s)
        for obj in tenancy.objects:
            kind, meta = obj["kind"], obj["metadata"]
            ns = meta.get("namespace")
            after = [namespaces[ns]] if ns in namespaces else []
            res_name = f"{name}-{kind.lower()}-" + (f"{ns}-" if ns else "") + meta["name"]
            if kind in ("PriorityClass",):
                PriorityClass(res_name, metadata=_meta(obj), value=obj["value"],
                              preemption_policy=obj["preemptionPolicy"], global_default=obj["globalDefault"],
                              description=obj["description"], opts=k8s)
            elif kind == "ResourceQuota":
                ResourceQuota(res_name, metadata=_meta(obj), spec=obj["spec"],
                              opts=pulumi.ResourceOptions.merge(k8s, pulumi.ResourceOptions(depends_on=after)))
            elif kind == "LimitRange":
                LimitRange(res_name, metadata=_meta(obj), spec=obj["spec"],
                           opts=pulumi.ResourceOptions.merge(k8s, pulumi.ResourceOptions(depends_on=after)))
            elif kind == "RoleBinding":
                role = [roles[obj["roleRef"]["name"]]] if obj["roleRef"]["name"] in roles else []
                RoleBinding(res_name, metadata=_meta(obj), role_ref=obj["roleRef"], subjects=obj["subjects"],
                            opts=pulumi.ResourceOptions.merge(k8s, pulumi.ResourceOptions(depends_on=[*after, *role])))
            elif obj["apiVersion"].startswith("kueue.x-k8s.io/"):
                crd_opts = pulumi.ResourceOptions.merge(k8s, pulumi.ResourceOptions(depends_on=[*kueue, *after]))
                if "spec" in obj:
                    CustomResource(res_name, api_version=obj["apiVersion"], kind=kind, metadata=meta,
                                   spec=obj["spec"], opts=crd_opts)
                else:
                    TopLevelCustomResource(res_name, obj, crd_opts)

        self._claim_templates(name, args, namespaces, k8s)
        excluded = (*args.infrastructure_namespaces, args.kueue.namespace)
        kueue_identity = kueue_user(args.kueue.namespace, args.kueue.service_account)
        adoption = args.fleet.env.adoption
        for obj in admission_objects(args.deployer, excluded, dra_claims(args.fleet, args.cluster),
                                     pool_taints(tenancy), kueue_identity,
                                     enforcement=adoption.admission if adoption else "deny",
                                     priority_classes=priority_class_names(args.fleet),
                                     jobset=args.jobset.user()):
            res_name = f"{name}-{obj['kind'].lower()}-{obj['metadata']['name']}"
            if obj["kind"] == "ValidatingAdmissionPolicy":
                ValidatingAdmissionPolicy(res_name, metadata=_meta(obj), spec=obj["spec"], opts=k8s)
            else:
                ValidatingAdmissionPolicyBinding(res_name, metadata=_meta(obj), spec=obj["spec"], opts=k8s)
        self.register_outputs({"tenants": [s.tenant.name for s in tenancy.shares],
                               "kueue": args.kueue.mode})

    def _claim_templates(self, name: str, args: TenancyArgs, namespaces: dict[str, pulumi.Resource],
                         k8s: pulumi.ResourceOptions) -> None:
        """DRA clusters: in each tenant namespace, the claim templates of the classes the tenant may use."""
        for tenant in args.fleet.tenants:
            for obj in dra.claim_templates(args.fleet, args.cluster.name, tenant):
                meta = obj["metadata"]
                after = [*args.after, *([namespaces[meta["namespace"]]] if meta["namespace"] in namespaces else [])]
                ResourceClaimTemplate(f"{name}-claimtemplate-{meta['namespace']}-{meta['name']}", metadata=meta,
                                      spec=obj["spec"],
                                      opts=pulumi.ResourceOptions.merge(k8s, pulumi.ResourceOptions(depends_on=after)))
