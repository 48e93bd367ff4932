"""Stack configuration (`Pulumi.<env>.yaml`): what the environment file does not describe (kubeconfig contexts,
cloud cluster prerequisites, the monitoring stack, rollout leftovers). Read once, as one typed model; every
default lives here and nowhere else."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pulumi
from pulumi.runtime import config as runtime_config
from pulumi_kubernetes.helm.v3 import RepositoryOptsArgs
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from gpushare.core import spec
from gpushare.core.errors import GpushareError, Problem
from gpushare.policy.admission import (
    DEFAULT_DEPLOYER_GROUPS,
    JOBSET_NAMESPACE,
    JOBSET_SERVICE_ACCOUNT,
    KUEUE_SERVICE_ACCOUNT,
    Deployer,
    jobset_user,
)

NAMESPACE = "gpushare"


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)


class MonitoringSettings(_Settings):
    mode: Literal["existing", "install"] = Field(
        description="existing: a kube-prometheus-stack release already runs in the cluster (only gpushare's rules and "
        "dashboards are created, with its release label); install: this program installs one (chart pinned).")
    release: str = Field("kube-prometheus-stack", description="Release name; its `release` label selects rules.")
    namespace: str = "monitoring"


class KueueSettings(_Settings):
    mode: Literal["install", "existing"] = Field(
        "install", description="install: this program installs Kueue (chart pinned, metrics on); existing: Kueue "
        "already runs in the cluster (only gpushare's flavors and queues are created).")
    namespace: str = "kueue-system"
    service_account: str = Field(
        KUEUE_SERVICE_ACCOUNT, description="Kueue's controller ServiceAccount in that namespace (the chart names it "
        "<release>-controller-manager): the only identity admission lets lift Kueue's scheduling gate from tenant "
        "pods and resume queued Jobs.")


class JobSetSettings(_Settings):
    """Where the JobSet controller runs, if the cluster has one (gpushare does not install it): Kueue's JobSet
    integration queues a JobSet as a whole, and the controller then creates its Jobs without a queue label."""

    namespace: str = JOBSET_NAMESPACE
    service_account: str = Field(
        JOBSET_SERVICE_ACCOUNT, description="The JobSet controller's ServiceAccount in that namespace (its release "
        "manifest's jobset-controller-manager): the only identity admission lets create and resume the unlabelled "
        "Jobs of a JobSet.")

    def user(self) -> str:
        return jobset_user(self.namespace, self.service_account)


class DeployerSettings(_Settings):
    """Who runs `pulumi up` in the cluster: the only identity allowed to change tenant namespaces' trust, tenant and
    Pod Security labels (an admission policy refuses everyone else)."""

    users: list[str] = Field(default_factory=list, description="Kubernetes user names, e.g. a CI service account "
                             "system:serviceaccount:<ns>:<name> or a cloud IAM identity.")
    groups: list[str] = Field(default_factory=lambda: list(DEFAULT_DEPLOYER_GROUPS),
                              description="Kubernetes groups; system:masters unless the stack names others.")

    def identity(self) -> Deployer:
        return Deployer(users=tuple(self.users), groups=tuple(self.groups))


class GkeSettings(_Settings):
    project: str
    location: str = Field(description="Region or zone of the GKE cluster.")
    cluster: str = Field(description="Name of the existing GKE cluster the node pools join.")
    driver_version: Literal["DEFAULT", "LATEST"] = Field(
        "DEFAULT", description="GKE's driver for GKE-managed pools (operator-managed pools disable GKE's installer).")
    driver_installer_manifest: str | None = Field(
        None, description="Google's driver-installer DaemonSet manifest (URL or path) for operator-managed pools, "
        "e.g. container-engine-accelerators nvidia-driver-installer/cos/daemonset-preloaded.yaml.")
    service_account: str | None = None


class EksSettings(_Settings):
    cluster: str = Field(description="Name of the existing EKS cluster the node groups join.")
    node_role_arn: str
    subnet_ids: list[str] = Field(min_length=1)


class ClusterSettings(_Settings):
    kubeconfig_context: str | None = None
    gke: GkeSettings | None = None
    eks: EksSettings | None = None
    monitoring: MonitoringSettings | None = None
    kueue: KueueSettings | None = None
    jobset: JobSetSettings | None = None


ChartName = Literal["gpu-operator", "dra-driver", "kube-prometheus-stack", "kueue"]


@dataclass(frozen=True)
class ChartSource:
    """Where each Helm release's chart comes from: the published chart at its pinned version, or a directory on disk
    holding that release's content (gpushare:localCharts), and whether releases wait for their workloads."""

    local: dict[str, str] = field(default_factory=dict)
    skip_await: bool = False

    def release_args(self, name: ChartName, chart: str, version: str, repository: str | None = None
                     ) -> dict[str, Any]:
        """The Release arguments naming the chart. A local chart has no version or repository to ask for: Helm
        reads the directory as it is."""
        args: dict[str, Any] = {"skip_await": True} if self.skip_await else {}
        if name in self.local:
            return {**args, "chart": self.local[name]}
        args.update(chart=chart, version=version)
        if repository is not None:
            args["repository_opts"] = RepositoryOptsArgs(repo=repository)
        return args


class KeptConfig(_Settings):
    """A device-plugin config no longer in the environment that nodes still use, with its rendered file."""

    name: str
    file: str
    adopted: bool = Field(
        False, description="A config the cluster ran before `gpushare import`, kept under its own name (no content "
        "hash) exactly as the cluster had it, because nodes still name it until their rollout batch relabels them; "
        "the rollout's prune step removes it once none does.")


class StackConfig(_Settings):
    stack: str
    environment: str
    protect: bool = Field(False, description="Protect the GPU Operator release from deletion (prod).")
    monitoring: MonitoringSettings | None = None
    kueue: KueueSettings = Field(default_factory=lambda: KueueSettings.model_validate({}))
    jobset: JobSetSettings = Field(default_factory=lambda: JobSetSettings.model_validate({}))
    deployer: DeployerSettings = Field(default_factory=lambda: DeployerSettings.model_validate({}))
    clusters: dict[str, ClusterSettings] = Field(default_factory=dict)
    keep_device_plugin_configs: list[str | KeptConfig] = Field(default_factory=list)
    operator_values: dict[str, Any] = Field(
        default_factory=dict, description="Site additions to the GPU Operator values (image mirrors, resources); "
        "keys gpushare sets itself are refused.")
    local_charts: dict[ChartName, str] = Field(
        default_factory=dict, description="A chart directory on disk in place of the published chart and version "
        "(gpu-operator, dra-driver, kube-prometheus-stack, kueue; relative to the workspace): sites that cannot reach "
        "the chart registries, and the real-engine tests. The directory must hold the pinned release's chart.")
    skip_await: bool = Field(
        False, description="Helm releases do not wait for their workloads to become ready: only for clusters whose "
        "nodes run no containers (the test control plane's kwok nodes).")

    @property
    def adopted_configs(self) -> frozenset[str]:
        """The kept configs that are the cluster's own from before the import."""
        return frozenset(e.name for e in self.keep_device_plugin_configs if isinstance(e, KeptConfig) and e.adopted)

    def charts(self, root: Path) -> ChartSource:
        return ChartSource({k: str(root / v) for k, v in self.local_charts.items()}, self.skip_await)

    @property
    def file(self) -> str:
        return f"Pulumi.{self.stack}.yaml"

    def problem(self, key: str, message: str, fix: str) -> Problem:
        return Problem(message, file=self.file, path=f"{NAMESPACE}:{key}", fix=fix)

    def cluster(self, name: str) -> ClusterSettings:
        return self.clusters.get(name) or ClusterSettings()

    def kubeconfig_context(self, cluster: spec.Cluster) -> str:
        context = self.cluster(cluster.name).kubeconfig_context or cluster.kubeconfig_context
        if not context:
            raise GpushareError(self.problem(
                f"clusters.{cluster.name}.kubeconfigContext",
                f"cluster {cluster.name!r} has no kubeconfig context",
                "set kubeconfig_context on the cluster in the environment file, or "
                f"gpushare:clusters.{cluster.name}.kubeconfigContext in {self.file}"))
        return context

    def gke(self, cluster: spec.Cluster) -> GkeSettings:
        found = self.cluster(cluster.name).gke
        if found is None:
            raise GpushareError(self.problem(
                f"clusters.{cluster.name}.gke", f"GKE cluster {cluster.name!r} needs its project, location and name",
                f"add gpushare:clusters.{cluster.name}.gke: {{project, location, cluster}} to {self.file}"))
        return found

    def eks(self, cluster: spec.Cluster) -> EksSettings:
        found = self.cluster(cluster.name).eks
        if found is None:
            raise GpushareError(self.problem(
                f"clusters.{cluster.name}.eks", f"EKS cluster {cluster.name!r} needs its name, node role and subnets",
                f"add gpushare:clusters.{cluster.name}.eks: {{cluster, nodeRoleArn, subnetIds}} to {self.file}"))
        return found

    def monitoring_for(self, cluster: spec.Cluster) -> MonitoringSettings:
        found = self.cluster(cluster.name).monitoring or self.monitoring
        if found is None:
            raise GpushareError(self.problem(
                "monitoring", f"no monitoring stack is named for cluster {cluster.name!r}",
                "set gpushare:monitoring: {mode: existing|install, release, namespace} (or per cluster under "
                f"gpushare:clusters.{cluster.name}.monitoring) in {self.file}"))
        return found

    def kueue_for(self, cluster: spec.Cluster) -> KueueSettings:
        return self.cluster(cluster.name).kueue or self.kueue

    def jobset_for(self, cluster: spec.Cluster) -> JobSetSettings:
        return self.cluster(cluster.name).jobset or self.jobset

    def check_clusters(self, known: list[str]) -> None:
        unknown = sorted(set(self.clusters) - set(known))
        if unknown:
            raise GpushareError(self.problem(
                f"clusters.{unknown[0]}", f"stack config names cluster(s) {', '.join(unknown)} that the environment "
                "does not define", f"use the environment's cluster names: {', '.join(known)}"))


def _config_keys() -> set[str]:
    return {k for k in {*runtime_config.CONFIG.get(), *runtime_config.get_config_env()}
            if k.startswith(f"{NAMESPACE}:")}


def load_stack_config() -> StackConfig:
    """Every `gpushare:*` key of the stack, validated at once (unknown keys are errors)."""
    config = pulumi.Config(NAMESPACE)
    stack = pulumi.get_stack()
    raw: dict[str, Any] = {"stack": stack, "environment": config.require("environment")}
    for key in sorted(_config_keys()):
        name = key.split(":", 1)[1]
        if name == "environment":
            continue
        value: Any = config.get(name)
        if name != "protect" and isinstance(value, str) and value[:1] in "{[":
            value = config.get_object(name)
        elif name == "protect":
            value = config.get_bool(name)
        raw[name] = value
    try:
        return StackConfig.model_validate(raw)
    except ValidationError as exc:
        file = f"Pulumi.{stack}.yaml"
        problems = []
        for err in exc.errors(include_url=False):
            path = ".".join(str(p) for p in err["loc"])
            fix = ("remove the key; known keys: " + ", ".join(sorted(_known_keys())) if err["type"] == "extra_forbidden"
                   else "see infra/stack_config.py for the expected shape")
            problems.append(Problem(err["msg"], file=file, path=f"{NAMESPACE}:{path}", fix=fix))
        raise GpushareError(problems) from None


def _known_keys() -> list[str]:
    return [f.alias or n for n, f in StackConfig.model_fields.items() if n != "stack"]
