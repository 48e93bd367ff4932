"""The environment file (environments/<env>.yaml), v1: clusters, pools of GPU nodes, tenants, and the profiles
local to it."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from gpushare.core.loading import Located, Strict, invalid, load_model
from gpushare.core.spec.v1.patterns import (
    DRA_DRIVER_VERSION_PATTERN,
    FEATURE_GATE_PATTERN,
    KUBERNETES_MINOR_PATTERN,
    VERSION_PATTERN,
    Address,
    CloudLocation,
    ClusterName,
    Description,
    DnsName,
    GpuModelName,
    KubeconfigContext,
    LabelKey,
    LabelValue,
    MachineType,
    ProfileName,
    ResourceName,
    Subject,
    version_tuple,
)
from gpushare.core.spec.v1.profiles import SharingProfile

MIN_KUBERNETES_MINOR = (1, 30)
# Dynamic Resource Allocation is GA (resource.k8s.io/v1, on by default) from 1.34.
MIN_DRA_KUBERNETES_MINOR = (1, 34)

# Namespaces that run the cluster or GPU infrastructure: never a tenant's (the Pulumi program adds the ones its
# stack config names). Every kube-* namespace belongs to Kubernetes itself.
SYSTEM_NAMESPACES = ("default", "gpu-operator", "kueue-system", "monitoring", "kube-system", "kube-public",
                     "kube-node-lease")
SYSTEM_NAMESPACE_PREFIX = "kube-"


def is_system_namespace(namespace: str, extra: tuple[str, ...] = ()) -> bool:
    return namespace.startswith(SYSTEM_NAMESPACE_PREFIX) or namespace in SYSTEM_NAMESPACES or namespace in extra


class Defaults(Strict):
    driver_branch: int = Field(ge=450, le=999, description="NVIDIA driver branch, e.g. 570 for R570.")
    toolkit_version: Annotated[str, Field(pattern=VERSION_PATTERN)] = Field(
        description="NVIDIA Container Toolkit version to pin, e.g. 1.18.2."
    )
    containerd_version: Annotated[str, Field(pattern=VERSION_PATTERN)] = Field(
        "2.1", description="containerd on bare-metal hosts (major.minor); decides the drop-in's config format."
    )


class DraDriver(Strict):
    """How a DRA cluster gets NVIDIA's DRA driver for GPUs."""

    version: Annotated[str, Field(pattern=DRA_DRIVER_VERSION_PATTERN)] | None = Field(
        None, description="Driver release to pin, e.g. v0.5.0; absent: the one the pinned GPU Operator names.")
    install: Literal["chart", "gpu-cluster"] = Field(
        "chart", description="chart: the driver's own Helm chart beside the GPU Operator (its device plugin off); "
        "gpu-cluster: the GPU Operator's GPUCluster resource (experimental; new clusters only, no ClusterPolicy).")
    feature_gates: list[Annotated[str, Field(pattern=FEATURE_GATE_PATTERN)]] = Field(
        default_factory=list, description="Driver feature gates to turn on beyond those the profiles in use need; "
        "checked against the pinned version (unknown gates and pairs the driver refuses are errors).")
    kubernetes_feature_gates: list[Annotated[str, Field(pattern=FEATURE_GATE_PATTERN)]] = Field(
        default_factory=list, description="Kubernetes feature gates the cluster's API server, scheduler and kubelets "
        "run with, as its operators state them (gpushare cannot see them offline): DRAConsumableCapacity for "
        "time-slicing profiles, DRAPartitionableDevices for dynamic MIG before Kubernetes 1.36.")


class Cluster(Strict):
    name: DnsName
    kind: Literal["bare-metal", "gke", "eks"]
    gpu_allocation: Literal["device-plugin", "dra"] = Field(
        "device-plugin", description="How pods get GPUs: the NVIDIA device plugin (extended resources), or Dynamic "
        "Resource Allocation (DeviceClasses and ResourceClaims; Kubernetes 1.34 or later).")
    dra: DraDriver | None = Field(None, description="The DRA driver of a cluster with gpu_allocation: dra.")
    mig_strategy: Literal["single", "mixed"] = Field(
        "mixed", description="GPU Operator mig.strategy: cluster-wide; mixed advertises nvidia.com/mig-<profile>."
    )
    cdi: bool = Field(True, description="GPU Operator cdi.enabled; the device plugin then uses CDI device lists.")
    kubernetes_version: Annotated[str, Field(pattern=KUBERNETES_MINOR_PATTERN)] = Field(
        description="The cluster's Kubernetes minor, as \"1.NN\" (1.30 or later: ValidatingAdmissionPolicy v1 is GA "
        "there; gpushare supports 1.35 to 1.37 and warns outside them); tenant namespaces pin their Pod Security "
        "version to it, and `preview` validates the cluster's objects against its schemas."
    )
    kubeconfig_context: KubeconfigContext | None = None
    region: CloudLocation | None = None

    @field_validator("kubernetes_version")
    @classmethod
    def _admission_policies_are_ga(cls, version: str) -> str:
        if version_tuple(version) < MIN_KUBERNETES_MINOR:
            minimum = ".".join(str(p) for p in MIN_KUBERNETES_MINOR)
            raise invalid(f"Kubernetes {version} is older than {minimum}, where ValidatingAdmissionPolicy v1 (which "
                          "guards tenant namespaces) became GA", f"upgrade the cluster to {minimum} or later and "
                          "set kubernetes_version to its minor")
        return version

    @model_validator(mode="after")
    def _dra_needs_its_api(self) -> Cluster:
        if self.dra is not None and self.gpu_allocation != "dra":
            raise invalid("a 'dra' block on a cluster whose gpu_allocation is device-plugin does nothing",
                          "set gpu_allocation: dra, or remove the dra block")
        if self.gpu_allocation == "dra" and version_tuple(self.kubernetes_version) < MIN_DRA_KUBERNETES_MINOR:
            minimum = ".".join(str(p) for p in MIN_DRA_KUBERNETES_MINOR)
            raise invalid(f"gpu_allocation dra needs Kubernetes {minimum} or later (resource.k8s.io/v1), but "
                          f"kubernetes_version is {self.kubernetes_version}",
                          f"upgrade the cluster to {minimum} or later, or keep gpu_allocation: device-plugin")
        if self.gpu_allocation == "dra" and self.mig_strategy == "single":
            raise invalid("mig_strategy single names every MIG instance nvidia.com/gpu, which on a DRA cluster would "
                          "map MIG classes and whole-GPU classes onto one quota name (a tenant's MIG quota would "
                          "match nothing, its GPU quota would count slices as GPUs)",
                          "remove mig_strategy (DRA claims name MIG devices by profile) or set it to mixed")
        return self

    @property
    def dra_driver(self) -> DraDriver:
        """The DRA block with its defaults filled in (device-plugin clusters get the defaults too)."""
        return self.dra if self.dra is not None else DraDriver.model_validate({})


class Taint(Strict):
    key: LabelKey
    value: LabelValue = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class Host(Strict):
    name: DnsName
    address: Address = Field(description="Management address Ansible connects to: an IP address or a hostname; never "
                             "one that can only be the controller itself (loopback, unspecified, link-local, "
                             "multicast, localhost). Two spellings of one address are one host.")
    gpu_model: GpuModelName | None = Field(
        None, description="NVML product name, alias or PCI id; defaults to the pool's.")
    gpu_count: int = Field(ge=1, le=16)
    driver_branch: int | None = Field(None, ge=450, le=999)
    profile: ProfileName | None = Field(None, description="Overrides the pool's sharing profile on this host.")
    nvswitch: bool = Field(False, description="HGX system with NVSwitch: needs nvidia-fabricmanager.")
    containerd_version: Annotated[str, Field(pattern=VERSION_PATTERN)] | None = None


class CloudNodes(Strict):
    machine_type: MachineType
    gpus_per_node: int = Field(ge=1, le=16)
    node_count: int = Field(ge=0, le=1000)
    min_node_count: int | None = Field(None, ge=0)
    max_node_count: int | None = Field(None, ge=0)
    zones: list[CloudLocation] = Field(default_factory=list)
    sharing: Literal["gke-managed", "operator"] = Field(
        "operator",
        description="gke-managed: GKE's own device plugin (gpu_sharing_config / gpu_partition_size); "
        "operator: the GPU Operator's plugin. EKS pools always use the operator.",
    )
    driver_branch: int | None = Field(None, ge=450, le=999)

    @model_validator(mode="after")
    def _bounds(self) -> CloudNodes:
        lo, hi = self.min_node_count, self.max_node_count
        if lo is not None and hi is not None and lo > hi:
            raise invalid(f"min_node_count {lo} is above max_node_count {hi}", "swap or correct the bounds")
        return self


class Pool(Strict):
    name: DnsName
    cluster: ClusterName
    purpose: Literal["inference", "training", "development", "batch"]
    gpu_model: GpuModelName | None = None
    profile: ProfileName
    description: Description = ""
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=list)
    hosts: list[Host] = Field(default_factory=list)
    cloud: CloudNodes | None = None
    mig_mode: Literal["static", "dynamic"] = Field(
        "static", description="MIG on a DRA cluster: static = the profile's layout applied by mig-parted before the "
        "node takes work; dynamic = the DRA driver creates instances per claim (its DynamicMIG gate, alpha, which "
        "destroys instances it did not make: all MIG pools of a cluster share one mode). The layout is checked "
        "either way.")

    @model_validator(mode="after")
    def _hosts_or_cloud(self) -> Pool:
        if self.cloud is None and not self.hosts:
            raise invalid("a pool needs 'hosts' (bare metal) or 'cloud' (GKE/EKS node pool)",
                          "list the pool's hosts, or add a cloud block")
        if self.cloud is not None and self.hosts:
            raise invalid("a pool has either 'hosts' (bare metal) or 'cloud', not both",
                          "split it into a bare-metal pool and a cloud pool")
        if self.cloud is not None and self.gpu_model is None:
            raise invalid("a cloud pool needs 'gpu_model'", "set gpu_model, e.g. NVIDIA L4")
        return self

    @field_validator("labels")
    @classmethod
    def _no_owned_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for key in labels:
            if key.startswith(("gpushare.io/", "nvidia.com/")):
                raise invalid(
                    f"label {key!r} is set by gpushare itself (gpushare.io/* and nvidia.com/* have one owner each)",
                    "use a label under your own prefix",
                )
        return labels


class Tenant(Strict):
    name: DnsName
    namespace: DnsName
    trust: Literal["trusted", "untrusted"] = Field(
        description="untrusted tenants get only hardware-isolated GPUs (MIG instances or whole GPUs)."
    )
    priority: Literal["online", "batch"] = Field(description="Default priority class for the tenant's work.")
    clusters: list[ClusterName] | None = Field(None, description="Clusters the tenant uses; all when absent.")
    quota: dict[ResourceName, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict, description="GPU resources the tenant is guaranteed, by advertised resource name."
    )
    borrowing_limit: dict[ResourceName, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict, description="Extra resources the tenant may borrow from idle quota in its cohort."
    )
    pod_security: Literal["restricted", "baseline"] | None = Field(
        None, description="Pod Security Standard enforced on the tenant's namespace: restricted by default for "
        "untrusted tenants (and never less), baseline by default for trusted ones; privileged is never allowed."
    )

    quota_name: DnsName | None = Field(
        None, description="The namespace's existing ResourceQuota gpushare takes over in place (its GPU limits; "
        "other limits in it stay the cluster's), instead of adding gpushare-gpu-quota beside it. `gpushare import` "
        "sets it where the namespace has one GPU quota.")
    developers: list[Subject] = Field(
        default_factory=list, description="Groups (or user:NAME) that run the tenant's work: bound in its "
        "namespace to gpushare-tenant-developer (workloads with its queue label, reading its LocalQueue, quota and "
        "Workloads; docs/tenancy.md). Absent: no binding, the site grants its own.")
    admins: list[Subject] = Field(
        default_factory=list, description="Groups (or user:NAME) that run the tenant's namespace: bound to "
        "gpushare-tenant-admin (the developers' rights, and Roles, RoleBindings, ServiceAccounts and "
        "NetworkPolicies of the namespace; never more than gpushare-tenant-admin holds).")

    @field_validator("clusters")
    @classmethod
    def _in_some_cluster(cls, clusters: list[str] | None) -> list[str] | None:
        if clusters is not None and not clusters:
            raise invalid("an empty list puts the tenant in no cluster: its quota would reach no queue",
                          "name the clusters the tenant uses, or remove clusters (all clusters)")
        return clusters

    @field_validator("namespace")
    @classmethod
    def _not_a_system_namespace(cls, namespace: str) -> str:
        if is_system_namespace(namespace):
            raise invalid(f"namespace {namespace!r} runs cluster or GPU infrastructure and cannot be a tenant's: "
                          "admission policies and Pod Security would either break it or exempt the tenant",
                          "give the tenant its own namespace, e.g. its name")
        return namespace

    @model_validator(mode="after")
    def _untrusted_stays_restricted(self) -> Tenant:
        if self.trust == "untrusted" and self.pod_security == "baseline":
            raise invalid("an untrusted tenant cannot run under Pod Security baseline: it would admit root "
                          "containers and privilege escalation next to other tenants' GPUs",
                          "remove pod_security (untrusted tenants get restricted) or set it to restricted")
        return self

    @property
    def pod_security_level(self) -> str:
        """The level enforced on the tenant's namespace, with the trust-based default filled in."""
        if self.pod_security is not None:
            return self.pod_security
        return "restricted" if self.trust == "untrusted" else "baseline"


class Adoption(Strict):
    """A cluster gpushare adopted while it runs (`gpushare import` writes this block): which of gpushare's guards are
    still staged, so the first rollout keeps what runs. Each field moves to its strict value in a reviewed change of
    its own once `gpushare diff` shows no running workload it would break (docs/adoption.md); with every field strict
    the block can go."""

    imported: Annotated[date, Field(strict=False)] | None = Field(
        None, description="The day `gpushare import` read the cluster.")
    admission: Literal["warn", "deny"] = Field(
        "warn", description="gpushare's ValidatingAdmissionPolicies: warn binds them with [Warn, Audit] (the API "
        "server admits and warns, the audit log records), deny with [Deny]. Untrusted tenants need deny.")
    pod_security: Literal["warn", "enforce"] = Field(
        "warn", description="Tenant namespaces' Pod Security labels: warn sets the warn and audit modes only (a "
        "namespace's own enforce label stays as it is), enforce sets enforce too.")
    shared_gpu_taint: bool = Field(
        False, description="Taint nodes whose GPUs are shared without hardware isolation with gpushare.io/shared-gpu "
        "(NoSchedule). Running pods do not tolerate it: turn it on once workloads queue through Kueue, whose "
        "flavors carry the toleration.")
    host_defaults: bool = Field(
        False, description="gpushare's namespace limits: its LimitRange (per-container CPU and memory defaults and "
        "maximums) in tenant namespaces, and 0 in an adopted quota (quota_name) for every GPU resource it never "
        "named; off, the namespaces keep their own limits and what their quota never limited stays unlimited.")

    priority_classes: dict[Literal["online", "batch"], DnsName] = Field(
        default_factory=dict, description="The cluster's own PriorityClasses for online and batch work, kept in "
        "place of gpushare-online and gpushare-batch (which are then not made): `gpushare import` names those whose "
        "value and preemption policy equal the guardrails' tenancy.priority_classes, never a second class beside "
        "them.")

    @property
    def strict(self) -> bool:
        return self.admission == "deny" and self.pod_security == "enforce" and self.shared_gpu_taint \
            and self.host_defaults

    def staged(self) -> list[tuple[str, str]]:
        """(field, what it leaves out) for each guard not yet at its strict value."""
        out = []
        if self.admission != "deny":
            out.append(("admission", "gpushare's admission policies warn and audit instead of refusing"))
        if self.pod_security != "enforce":
            out.append(("pod_security", "tenant namespaces' Pod Security level warns and audits, enforces nothing"))
        if not self.shared_gpu_taint:
            out.append(("shared_gpu_taint", "time-sliced and MPS nodes carry no gpushare.io/shared-gpu taint"))
        if not self.host_defaults:
            out.append(("host_defaults", "tenant namespaces get no gpushare LimitRange"))
        return out


class Environment(Strict):
    name: DnsName
    description: Description = ""
    adoption: Adoption | None = Field(
        None, description="Staged guards of a cluster adopted while it runs (docs/adoption.md); absent: every guard "
        "enforced.")
    defaults: Defaults
    clusters: list[Cluster] = Field(min_length=1)
    pools: list[Pool] = Field(min_length=1)
    tenants: list[Tenant] = Field(default_factory=list)
    profiles: list[SharingProfile] = Field(
        default_factory=list, description="Profiles local to this environment, beside those in profiles/."
    )


def load_environment(path: Path) -> tuple[Environment, Located]:
    return load_model(path, Environment, "Environment", "environment file", "environments/dev.yaml")
