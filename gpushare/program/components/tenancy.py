"""Tenancy: per cluster, Kueue (pinned chart, metrics on) and gpushare's tenant namespaces, quotas, host defaults,
priority classes, Kueue flavors and queues, and the admission policies that guard tenant namespaces.

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
from pulumi_kubernetes.scheduling.v1 import PriorityClass

from gpushare.core import spec
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.guardrails import Guardrails
from gpushare.core.resolve import ResolvedFleet
from gpushare.core.tenancy import ClusterTenancy, cluster_tenancy
from gpushare.policy.admission import Deployer, admission_objects
from gpushare.program.stack_config import KueueSettings

KUEUE_CHART = "oci://registry.k8s.io/kueue/charts/kueue"
KUEUE_VERSION = "0.19.2"
KUEUE_VALUES = {"enablePrometheus": True}  # Kueue exposes no metrics unless asked (docs/nvidia-stack.md)


@cache
def kueue_chart_defaults() -> dict[str, Any]:
    from gpushare.core.paths import package_data

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
    # Namespaces this stack deploys infrastructure into (operator, Kueue, monitoring): never a tenant's.
    infrastructure_namespaces: tuple[str, ...] = ()
    deployer: Deployer = field(default_factory=Deployer)
    provider: pulumi.ProviderResource | None = None


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
    problems = check_kueue_values(KUEUE_VALUES) + system_namespace_problems(args)
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
                f"{name}-kueue", name="kueue", chart=KUEUE_CHART, version=KUEUE_VERSION,
                namespace=args.kueue.namespace, create_namespace=True, values=KUEUE_VALUES, opts=k8s))

        namespaces: dict[str, pulumi.Resource] = {}
        for obj in tenancy.objects:
            if obj["kind"] == "Namespace":
                namespaces[obj["metadata"]["name"]] = Namespace(
                    f"{name}-ns-{obj['metadata']['name']}", metadata=_meta(obj), opts=k8s)
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
            elif obj["apiVersion"].startswith("kueue.x-k8s.io/"):
                crd_opts = pulumi.ResourceOptions.merge(k8s, pulumi.ResourceOptions(depends_on=[*kueue, *after]))
                if "spec" in obj:
                    CustomResource(res_name, api_version=obj["apiVersion"], kind=kind, metadata=meta,
                                   spec=obj["spec"], opts=crd_opts)
                else:
                    TopLevelCustomResource(res_name, obj, crd_opts)

        excluded = (*args.infrastructure_namespaces, args.kueue.namespace)
        for obj in admission_objects(args.deployer, excluded):
            res_name = f"{name}-{obj['kind'].lower()}-{obj['metadata']['name']}"
            if obj["kind"] == "ValidatingAdmissionPolicy":
                ValidatingAdmissionPolicy(res_name, metadata=_meta(obj), spec=obj["spec"], opts=k8s)
            else:
                ValidatingAdmissionPolicyBinding(res_name, metadata=_meta(obj), spec=obj["spec"], opts=k8s)
        self.register_outputs({"tenants": [s.tenant.name for s in tenancy.shares],
                               "kueue": args.kueue.mode})
