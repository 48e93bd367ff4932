# One module: the models and the loader whose errors name their fields (file, line, field, fix) change together.
"""The environment and profile files as pydantic models (unknown keys are errors), and loading them with
errors that name the file, the line, the field and the fix."""

from __future__ import annotations

import difflib
import ipaddress
import re
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError, core_schema

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.files import load_yaml_file
from gpushare.core.paths import check_inside_workspace

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Label values are at most 63 characters; config names are built from a profile name, a GPU slug and a hash.
PROFILE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,28}[a-z0-9])?$"
# Digits are spelt [0-9]: `\d` also matches other scripts' digits (pydantic's and Python's regexes both), which
# int() would then read as numbers while every tool downstream sees a different string (one reading of each value).
VERSION_PATTERN = r"^[0-9]+\.[0-9]+(\.[0-9]+)?$"
RESOURCE_PATTERN = r"^[a-z0-9.-]+/[a-zA-Z0-9._-]+$"

KUBERNETES_MINOR_PATTERN = r"^1\.[0-9]{2}$"
MIN_KUBERNETES_MINOR = (1, 30)
# Dynamic Resource Allocation is GA (resource.k8s.io/v1, on by default) from 1.34.
MIN_DRA_KUBERNETES_MINOR = (1, 34)
DRA_DRIVER_VERSION_PATTERN = r"^v[0-9]+\.[0-9]+\.[0-9]+$"
FEATURE_GATE_PATTERN = r"^[A-Z][A-Za-z0-9]{0,62}$"
# Namespaces that run the cluster or GPU infrastructure: never a tenant's (the Pulumi program adds the ones its
# stack config names). Every kube-* namespace belongs to Kubernetes itself.
SYSTEM_NAMESPACES = ("default", "gpu-operator", "kueue-system", "monitoring", "kube-system", "kube-public",
                     "kube-node-lease")
SYSTEM_NAMESPACE_PREFIX = "kube-"


def is_system_namespace(namespace: str, extra: tuple[str, ...] = ()) -> bool:
    return namespace.startswith(SYSTEM_NAMESPACE_PREFIX) or namespace in SYSTEM_NAMESPACES or namespace in extra


def invalid(message: str, fix: str) -> PydanticCustomError:
    """A validation error that carries its fix, for the error report."""
    return PydanticCustomError("gpushare", message.replace("{", "(").replace("}", ")"), {"fix": fix})


class Strict(BaseModel):
    # strict: YAML's `true` is not a count and '4' is not a number, as the JSON Schema says.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# ---------------------------------------------------------------- strings that reach Ansible, Jinja2 and shells
# Environment files are data, never templates or shell (docs/safety-rules.md rule 12): every string matches the
# narrowest pattern its domain allows, so none can carry `{{ }}`, `{% %}`, `$( )` or backticks into Ansible, Jinja2
# or a command line.

_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
LABEL_KEY_PATTERN = rf"^({_DNS_LABEL}(\.{_DNS_LABEL})*/)?{_LABEL_NAME}$"
LABEL_VALUE_PATTERN = rf"^({_LABEL_NAME})?$"
# kubectl's context names: GKE writes gke_<project>_<location>_<cluster>, EKS an ARN (arn:aws:eks:...:cluster/x).
KUBECONFIG_CONTEXT_PATTERN = r"^[A-Za-z0-9._@:/-]+$"
CLOUD_LOCATION_PATTERN = rf"^{_DNS_LABEL}$"
MACHINE_TYPE_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
GPU_MODEL_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9 _.+()]*[A-Za-z0-9)])?$"
LAYOUT_TEXT_PATTERN = r"^[A-Za-z0-9.+=,@ ]*$"
# What starts template code in Jinja2 (and so in Ansible) or a command substitution in a shell.
TEMPLATE_OR_SHELL_MARKERS = ("{{", "{%", "{#", "$(", "`")
DESCRIPTION_MAX_LENGTH = 2000
HOSTNAME_MAX_LENGTH = 253


def _refused(value: str, message: str, fix: str, **context: str) -> PydanticCustomError:
    """A refusal that quotes the value (shortened) without reading its braces as a message template."""
    shown = value if len(value) <= 80 else value[:77] + "..."
    return PydanticCustomError("gpushare", "{value} " + message, {"value": repr(shown), "fix": fix, **context})


@dataclass(frozen=True)
class TextRule:
    """A pattern a string field must match, with the error's wording; the JSON schema carries the pattern too."""

    pattern: str
    what: str
    fix: str
    max_length: int = 63

    def check(self, value: str) -> str:
        if len(value) > self.max_length or re.fullmatch(self.pattern, value) is None:
            raise _refused(value, f"is not {self.what} (at most {self.max_length} characters)", self.fix)
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> dict[str, Any]:
        return {**handler(schema), "pattern": self.pattern, "maxLength": self.max_length}


LabelKey = Annotated[str, TextRule(
    LABEL_KEY_PATTERN, "a Kubernetes label key", "write [prefix/]name: an optional lowercase DNS prefix, then letters, "
    "digits, '-', '_' or '.' starting and ending alphanumeric", max_length=HOSTNAME_MAX_LENGTH + 64)]
LabelValue = Annotated[str, TextRule(
    LABEL_VALUE_PATTERN, "a Kubernetes label value", "use letters, digits, '-', '_' and '.', starting and ending with "
    "a letter or digit (or leave it empty)")]
KubeconfigContext = Annotated[str, TextRule(
    KUBECONFIG_CONTEXT_PATTERN, "a kubeconfig context name", "use the name `kubectl config get-contexts` shows: "
    "letters, digits and . _ @ : / - (no spaces, quotes, braces, '$' or backticks)", max_length=HOSTNAME_MAX_LENGTH)]
CloudLocation = Annotated[str, TextRule(
    CLOUD_LOCATION_PATTERN, "a cloud region or zone", "use the cloud's own name, e.g. europe-west4, europe-west4-a "
    "or eu-west-1a")]
MachineType = Annotated[str, TextRule(
    MACHINE_TYPE_PATTERN, "a cloud machine type", "use the cloud's own name, e.g. g2-standard-24 or p5.48xlarge")]
GpuModelName = Annotated[str, TextRule(
    GPU_MODEL_PATTERN, "a GPU model name", "use the NVML product name, an alias or the PCI id that "
    "`gpushare gpus` lists, e.g. NVIDIA A100-SXM4-80GB", max_length=96)]
LayoutText = Annotated[str, TextRule(
    LAYOUT_TEXT_PATTERN, "a MIG layout", "write MIG profiles with counts, e.g. '1g.10gb=2,2g.20gb=1,3g.40gb=1'",
    max_length=512)]
ProfileName = Annotated[str, TextRule(
    PROFILE_NAME_PATTERN, "a sharing profile name", "name a profile from profiles/ or this file's profiles: "
    "lowercase letters, digits and '-'", max_length=30)]
DnsName = Annotated[str, TextRule(
    NAME_PATTERN, "a DNS label", "use lowercase letters, digits and '-', starting and ending with a letter or digit")]
ClusterName = Annotated[str, TextRule(
    NAME_PATTERN, "a cluster name", "name one of the environment's clusters: lowercase letters, digits and '-'")]
ResourceName = Annotated[str, TextRule(
    RESOURCE_PATTERN, "an advertised GPU resource name", "write <domain>/<name>, e.g. nvidia.com/mig-1g.10gb",
    max_length=HOSTNAME_MAX_LENGTH + 64)]


# A user or group as Kubernetes' authenticators name it (an OIDC claim with its prefix, a certificate's CN or O, a
# directory group's name or id, an email address): printable, no quotes, braces, '$' or backticks.
SUBJECT_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9._@:/+=, ]*[A-Za-z0-9])?$"
USER_PREFIX = "user:"
# Kubernetes' own identities and the groups it puts identities in (every signed-in user, every ServiceAccount, every
# kubelet, system:masters): none is a tenant's people.
SYSTEM_SUBJECT_PREFIX = "system:"


def _subject(value: str) -> str:
    name = value.removeprefix(USER_PREFIX)
    if not name:
        raise _refused(value, "names no user", f"write {USER_PREFIX}<name>, e.g. {USER_PREFIX}alice@example.com")
    if name.startswith(SYSTEM_SUBJECT_PREFIX):
        raise _refused(value, "is one of Kubernetes' own identities or groups (system:...), which hold every "
                       "signed-in user, ServiceAccount or node, or the cluster's own components",
                       "name the group (or user:<name>) your identity provider gives the tenant's people; a CI "
                       "ServiceAccount gets a RoleBinding of the tenant's own to gpushare-tenant-developer")
    return value


Subject = Annotated[str, TextRule(
    SUBJECT_PATTERN, "a Kubernetes group or user name", "write the group as your authenticator names it (e.g. "
    "oidc:ml-team), or user:<name> for one user: letters, digits, spaces and . _ @ : / + = , - (no quotes, braces, "
    "'$' or backticks)", max_length=HOSTNAME_MAX_LENGTH), AfterValidator(_subject)]


def _description(value: str) -> str:
    for marker in TEMPLATE_OR_SHELL_MARKERS:
        if marker in value:
            raise _refused(value, "holds {marker}, which starts template code in Jinja2 or a command in a shell",
                           "reword it without '{{', '{%', '{#', '$(' or backticks: gpushare passes environment "
                           "strings to Ansible and Jinja2 as data, and refuses anything that could run as code there",
                           marker=repr(marker))
    if len(value) > DESCRIPTION_MAX_LENGTH:
        raise _refused(value, f"is longer than {DESCRIPTION_MAX_LENGTH} characters", "shorten it")
    if not all(ch.isprintable() or ch in "\n\t" for ch in value):
        raise _refused(value, "holds control characters", "keep to printable text, newlines and tabs")
    return value


Description = Annotated[str, AfterValidator(_description), WithJsonSchema(
    {"type": "string", "maxLength": DESCRIPTION_MAX_LENGTH, "not": {"pattern": r"\{\{|\{%|\{#|\$\(|`"}})]


# A management address names another machine: these can only be the machine gpushare runs on (or no machine), so
# the same file would mean the CI runner in `check` and the deploy host in `rollout`.
_CONTROLLER_ONLY_NAMES = ("localhost", "localhost.localdomain")
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")  # RFC 1122 "this host on this network"; Linux reads it as local


def _ip_of(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(value.partition("%")[0])
    except ValueError:
        return None


def address_key(value: str) -> str:
    """One spelling per machine, to find two hosts at one address: an IPv4-mapped IPv6 address (::ffff:10.0.0.1)
    is its IPv4 address, IPv6 is compressed and lowercase, a hostname is itself."""
    ip = _ip_of(value)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return value if ip is None else ip.compressed


def _controller_only(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why an address cannot be another machine's management address, or None."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "is a loopback address: it would be the machine gpushare runs on, not a GPU host"
    if ip.is_unspecified or (isinstance(ip, ipaddress.IPv4Address) and ip in _THIS_NETWORK):
        return "is an unspecified (\"this host\") address, which names no other machine"
    if ip.is_link_local:
        return ("is a link-local address: which machine it reaches depends on the controller's own links (169.254."
                "169.254 is a cloud's metadata server)")
    if ip.is_multicast or (isinstance(ip, ipaddress.IPv4Address) and ip.is_reserved):
        return "is a multicast, broadcast or reserved address, not one machine's"
    if isinstance(ip, ipaddress.IPv6Address) and int(ip) >> 32 == 0:
        return "is an IPv4-compatible IPv6 address (::a.b.c.d, deprecated by RFC 4291), which no host answers at"
    return None


def _address(value: str) -> str:
    """An IP address (v4, or v6 with at most an interface scope) or an RFC 1123 hostname in lowercase; never one
    that can only be the controller itself."""
    fix = "write an IPv4 or IPv6 address (e.g. 10.40.1.11) or a lowercase DNS hostname (e.g. gpu-01.example.net)"
    address, _, scope = value.partition("%")
    ip = _ip_of(value)
    if ip is not None:
        if scope and not (":" in address and re.fullmatch(r"[A-Za-z0-9_.-]{1,15}", scope)):
            raise _refused(value, "has a scope that is not an interface name", fix)
        why = _controller_only(ip)
        if why is not None:
            raise _refused(value, why, "write the host's own routable management address or DNS hostname (e.g. "
                           "10.40.1.11 or gpu-01.example.net)")
        return value
    labels = value.split(".")
    # isascii: str.isdigit() is also true of other scripts' digits (and of superscripts), which are no address.
    if all(label.isascii() and label.isdigit() for label in labels):
        raise _refused(value, "is not an IP address (four parts of 0-255, no leading zeros)", fix)
    if len(value) > HOSTNAME_MAX_LENGTH or not all(re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", label)
                                                   for label in labels):
        raise _refused(value, "is neither an IP address nor an RFC 1123 hostname (labels of 1-63 lowercase "
                       "letters, digits and '-', not starting or ending with '-'; 253 characters at most)", fix)
    if labels[-1].isdigit():
        raise _refused(value, "ends in a number, so it reads as a broken IP address rather than a hostname", fix)
    if value in _CONTROLLER_ONLY_NAMES or value.endswith(".localhost"):
        raise _refused(value, "names the machine gpushare runs on (RFC 6761 localhost), not a GPU host",
                       "write the host's own DNS hostname or routable management address")
    return value


Address = Annotated[str, AfterValidator(_address), WithJsonSchema(
    {"type": "string", "anyOf": [{"format": "ipv4"}, {"format": "ipv6"}, {"format": "hostname"}],
     "pattern": r"^[A-Za-z0-9.:%_-]+$", "maxLength": HOSTNAME_MAX_LENGTH})]


# ---------------------------------------------------------------- sharing profiles


class TimeSlicingSpec(Strict):
    replicas: int = Field(ge=2, le=64, description="Pods that share one GPU (or one MIG instance); at least 2.")
    rename_by_default: bool = Field(
        True, description="Advertise shared replicas as <resource>.shared so quotas can tell them apart."
    )
    fail_requests_greater_than_one: bool = Field(
        True, description="Refuse pods asking for more than one replica (they would get no more compute)."
    )


class MpsSpec(Strict):
    replicas: int = Field(ge=2, le=48, description="MPS clients per GPU; each gets 1/replicas of memory and SMs.")
    rename_by_default: bool = True


GenericLayout = Literal["balanced", "all-smallest", "whole"]


class MigSpec(Strict):
    layout: GenericLayout | None = Field(
        None,
        description="A layout that resolves per GPU model: balanced (one 3g, one 2g, 1g to fill, as NVIDIA's "
        "all-balanced), all-smallest (the most 1g instances), whole (one full-GPU instance).",
    )
    layouts: dict[GpuModelName, LayoutText] | None = Field(
        None,
        description="Explicit layouts keyed by GPU model (NVML name, alias or PCI id), as "
        "'1g.10gb=2,2g.20gb=1,3g.40gb=1'. Multisets only: mig-parted cannot place at chosen starts.",
    )

    @model_validator(mode="after")
    def _one_form(self) -> MigSpec:
        if (self.layout is None) == (self.layouts is None):
            raise invalid("a MIG block needs exactly one of 'layout' and 'layouts'",
                          "use layout: balanced|all-smallest|whole, or layouts: {<GPU model>: '<profile>=<n>,...'}")
        if self.layouts is not None:
            for key, text in self.layouts.items():
                if "@" in text:
                    raise invalid(
                        f"layouts[{key!r}] fixes starts ({text!r}); layouts here are multisets because "
                        "mig-parted cannot place instances at chosen starts",
                        "write 'profile=count' (use `gpushare mig validate` to check placements)",
                    )
        return self


class _ProfileBase(Strict):
    name: Annotated[str, Field(pattern=PROFILE_NAME_PATTERN)]
    description: Description = ""


class ExclusiveProfile(_ProfileBase):
    kind: Literal["exclusive"]


class TimeSlicingProfile(_ProfileBase):
    kind: Literal["time-slicing"]
    time_slicing: TimeSlicingSpec


class MpsProfile(_ProfileBase):
    kind: Literal["mps"]
    mps: MpsSpec

    @model_validator(mode="before")
    @classmethod
    def _never_on_mig(cls, data: Any) -> Any:
        if isinstance(data, dict) and "mig" in data:
            raise invalid(
                "MPS is never used on MIG devices (the device plugin does not support it)",
                "use kind mig-time-slicing to share MIG instances, or drop the mig block",
            )
        return data


class MigProfile(_ProfileBase):
    kind: Literal["mig"]
    mig: MigSpec


class MigTimeSlicingProfile(_ProfileBase):
    kind: Literal["mig-time-slicing"]
    mig: MigSpec
    time_slicing: TimeSlicingSpec


SharingProfile = Annotated[
    ExclusiveProfile | TimeSlicingProfile | MpsProfile | MigProfile | MigTimeSlicingProfile,
    Field(discriminator="kind"),
]
PROFILE_ADAPTER: TypeAdapter[Any] = TypeAdapter(SharingProfile)

ISOLATION = {
    "exclusive": "hardware",
    "mig": "hardware",
    "mps": "memory-partitioned",
    "time-slicing": "none",
    "mig-time-slicing": "none",
}


# ---------------------------------------------------------------- environment


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


# ---------------------------------------------------------------- loading with located errors


_Loader: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class Located:
    """A loaded YAML document that can say on which line a dotted path sits."""

    def __init__(self, file: str, data: Any, text: str, base: tuple[Any, ...] = ()) -> None:
        self.file = file
        self.data = data
        self.text = text
        self.base = base
        self._node: yaml.Node | None = None

    @property
    def node(self) -> yaml.Node | None:
        """The node tree, composed only when an error needs a line number."""
        if self._node is None:
            self._node = yaml.compose(self.text, Loader=_Loader)
        return self._node

    def at(self, *base: Any) -> Located:
        located = Located(self.file, self.data, self.text, base)
        located._node = self._node
        return located

    def line(self, loc: tuple[Any, ...]) -> int | None:
        node = self.node
        best = node.start_mark.line + 1 if node is not None else None
        for part in self.data_path(loc):
            if isinstance(node, yaml.MappingNode):
                nxt = next((v for k, v in node.value if k.value == part), None)
                if nxt is None:
                    key = next((k for k, _ in node.value if k.value == part), None)
                    return key.start_mark.line + 1 if key is not None else best
                node = nxt
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
                node = node.value[part]
            else:
                continue
            best = node.start_mark.line + 1
        return best

    def problem(self, loc: tuple[Any, ...], message: str, fix: str | None = None) -> Problem:
        return Problem(message, file=self.file, path=format_path(self.data_path(loc)), fix=fix, line=self.line(loc))

    def data_path(self, loc: tuple[Any, ...]) -> tuple[Any, ...]:
        """Drop the parts of a pydantic location that are not in the data (union tags, model names)."""
        data = self.data
        for part in self.base:
            data = data[part] if isinstance(data, (dict, list)) else data
        kept: list[Any] = []
        tag_skipped_at: int | None = None
        for part in loc:
            if isinstance(data, dict) and data.get("kind") == part and tag_skipped_at != id(data):
                tag_skipped_at = id(data)  # pydantic puts a discriminated union's tag into the location
                continue
            if isinstance(data, dict) and part in data:
                data = data[part]
                kept.append(part)
            elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
                data = data[part]
                kept.append(part)
            elif isinstance(data, dict) and isinstance(part, str) and not _is_tag(part):
                kept.append(part)  # a missing key: still worth naming
                data = None
        return (*self.base, *kept)


def _is_tag(part: str) -> bool:
    return part in ISOLATION or part.endswith("Profile") or part.startswith("function-")


def format_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _fix_for(err: Any, model: type[BaseModel] | None, data_loc: tuple[Any, ...]) -> str | None:
    kind = err["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model, data_loc[:-1]) if model is not None else []
        bad = str(data_loc[-1]) if data_loc else ""
        close = difflib.get_close_matches(bad, allowed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"{hint}remove the key or use one of: {', '.join(allowed)}" if allowed else "remove the key"
    if kind == "gpushare":
        return str(err.get("ctx", {}).get("fix")) or None
    if kind == "missing":
        return "add this field"
    if kind == "union_tag_not_found":
        return f"add kind: one of {', '.join(ISOLATION)}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        return "use a value in the allowed range"
    if kind in ("literal_error", "union_tag_invalid", "enum"):
        expected = err.get("ctx", {}).get("expected") or err.get("ctx", {}).get("expected_tags")
        return f"use one of: {expected}" if expected else None
    if kind == "string_pattern_mismatch":
        pattern = str(err.get("ctx", {}).get("pattern", ""))
        return _PATTERN_FIXES.get(pattern, f"write a value that matches {pattern}")
    if kind in _TYPE_FIXES:
        return _TYPE_FIXES[kind]
    return None


_PATTERN_FIXES = {
    NAME_PATTERN: "use lowercase letters, digits and '-', starting and ending with a letter or digit (a DNS label)",
    PROFILE_NAME_PATTERN: "use at most 30 lowercase letters, digits and '-' (a DNS label)",
    VERSION_PATTERN: "write a version as MAJOR.MINOR or MAJOR.MINOR.PATCH in quotes, in the digits 0-9, e.g. "
                     "\"1.18.2\"",
    KUBERNETES_MINOR_PATTERN: "write the cluster's Kubernetes minor as \"1.NN\" in quotes, in the digits 0-9, "
                              "e.g. \"1.33\"",
    DRA_DRIVER_VERSION_PATTERN: "write a driver release as vMAJOR.MINOR.PATCH in the digits 0-9, e.g. v0.5.0",
    RESOURCE_PATTERN: "write an extended resource name, e.g. nvidia.com/gpu or nvidia.com/mig-1g.10gb",
}
_TYPE_FIXES = {
    "int_type": "write a whole number without quotes, e.g. 4",
    "int_from_float": "write a whole number, e.g. 4",
    "float_type": "write a number without quotes, e.g. 1.5",
    "finite_number": "write a finite number, e.g. 1.5 (not .inf or .nan)",
    "bool_type": "write true or false without quotes",
    "string_type": "write text; quote it if YAML would read it as something else, e.g. '123'",
    "dict_type": "write a mapping (key: value lines)",
    "list_type": "write a list (- item lines, or [a, b])",
    "model_type": "write a mapping (key: value lines)",
    "date_from_datetime_parsing": "write a date as YYYY-MM-DD",
    "date_parsing": "write a real date as YYYY-MM-DD",
    "date_from_datetime_inexact": "write a date as YYYY-MM-DD",
}


def _read_as(value: Any) -> str:
    """What YAML made of a value, for messages: users see `yes` turned into a boolean, `010` into a number."""
    kind = {bool: "a boolean", int: "a number", float: "a number", str: "text", list: "a list", dict: "a mapping",
            type(None): "nothing (null)"}.get(type(value), type(value).__name__)
    shown = repr(value) if not isinstance(value, (dict, list)) else ""
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return f"YAML read {shown + ', ' if shown else ''}{kind}"


def _allowed_keys(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> list[str]:
    """Follow a data path through the model's fields to list the keys allowed there."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        current = _inner_model(fields[part].annotation)
    fields = getattr(current, "model_fields", None)
    return list(fields) if fields else []


def _inner_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def validation_problems(exc: ValidationError, doc: Located, model: type[BaseModel] | None) -> list[Problem]:
    problems = []
    errors = exc.errors(include_url=False)
    # A misspelt key shows as an unknown key and a missing one: say it once, as the unknown key with its fix.
    misspelt = {(tuple(e["loc"][:-1]), m) for e in errors if e["type"] == "extra_forbidden" and e["loc"]
                for m in difflib.get_close_matches(str(e["loc"][-1]), [str(x["loc"][-1]) for x in errors
                                                                       if x["type"] == "missing" and x["loc"]], n=1)}
    for err in errors:
        loc = tuple(err["loc"])
        if err["type"] == "missing" and loc and (loc[:-1], str(loc[-1])) in misspelt:
            continue
        data_loc = doc.data_path(loc)[len(doc.base):]
        message = err["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, "):]
        if err["type"] == "extra_forbidden":
            message = f"unknown key {data_loc[-1]!r}" if data_loc else "unknown key"
        elif err["type"] == "union_tag_not_found":
            message = f"'{err.get('ctx', {}).get('discriminator', 'kind')}' is missing".replace("''", "'")
        elif err["type"] in _TYPE_FIXES:
            message = f"{message} ({_read_as(err.get('input'))})"
        problems.append(doc.problem(loc, message, _fix_for(err, model, data_loc)))
    return problems


def read_yaml(path: Path, what: str = "file") -> Located:
    """A YAML file through the one shared loader (gpushare.files), kept with its text for line numbers. A file in a
    workspace must really be there: a symbolic link out of it is refused (core.paths.check_inside_workspace)."""
    check_inside_workspace(path, what)
    text, data = load_yaml_file(path, what)
    return Located(str(path), data, text)


API_VERSION = "gpushare.io/v1"  # the one version of every workspace file format; a file without one reads as it
_FILE_KINDS = ("Environment", "SharingProfile", "Guardrails", "Waivers", "Demand")


def file_body(doc: Located, kind: str | None) -> Any:
    """The document without its header (`apiVersion: gpushare.io/v1`, `kind: <kind>`), after checking both; a file
    without an apiVersion reads as v1. `kind=None` where `kind` is the document's own field (sharing profiles)."""
    data = doc.data
    if not isinstance(data, dict) or ("apiVersion" not in data and (kind is None or "kind" not in data)):
        return data
    version = data.get("apiVersion", API_VERSION)
    if version != API_VERSION:
        raise GpushareError(doc.problem(("apiVersion",), f"unknown apiVersion {version!r}: this gpushare reads "
                                        f"{API_VERSION}", fix=f"write apiVersion: {API_VERSION}, or upgrade gpushare "
                                        "to a release that reads this version"), exit_code=2)
    body = {k: v for k, v in data.items() if k != "apiVersion"}
    if kind is not None and "kind" in body:
        if body.pop("kind") != kind:
            raise GpushareError(doc.problem(("kind",), f"kind is {data['kind']!r}, but this file is read as a {kind}",
                                            fix=f"write kind: {kind}, or pass this file where a {data['kind']} "
                                                "is expected"), exit_code=2)
    return body


def with_header(schema: dict[str, Any], kind: str | None) -> dict[str, Any]:
    """A file's JSON schema with the optional header keys that `file_body` accepts."""
    props = {"apiVersion": {"const": API_VERSION, "description": "File format version; absent reads as v1."}}
    if kind is not None:
        props["kind"] = {"const": kind, "description": "What this file is."}
    if "properties" in schema:
        schema["properties"] = {**props, **schema["properties"]}
    return schema


ModelT = TypeVar("ModelT", bound=BaseModel)


def load_model(path: Path, model: type[ModelT], kind: str, what: str, start_from: str,
               empty: dict[str, Any] | None = None) -> tuple[ModelT, Located]:
    """A workspace file through the shared loader, its header checked and its body validated by `model`; every
    problem located. `empty`: what an empty file means, where an empty file is allowed."""
    doc = read_yaml(path, what)
    data = empty if doc.data is None and empty is not None else doc.data
    if not isinstance(data, dict):
        raise GpushareError(Problem(f"a {what} must be a mapping", file=doc.file, line=1,
                                    fix=f"start from {start_from}"))
    try:
        return model.model_validate(file_body(Located(doc.file, data, doc.text), kind)), doc
    except ValidationError as exc:
        raise GpushareError(validation_problems(exc, doc, model)) from None


def load_environment(path: Path) -> tuple[Environment, Located]:
    return load_model(path, Environment, "Environment", "environment file", "environments/dev.yaml")


def load_profile_file(path: Path) -> tuple[Any, Located]:
    doc = read_yaml(path, "profile file")
    if not isinstance(doc.data, dict):
        raise GpushareError(Problem("a profile file must be a mapping", file=doc.file, line=1,
                                    fix="start from a profile in profiles/, e.g. profiles/exclusive.yaml"))
    kind = doc.data.get("kind")
    if kind in _FILE_KINDS:
        raise GpushareError(doc.problem(("kind",), f"kind is {kind!r}: a profile file's kind is its sharing mode",
                                        fix=f"write kind: one of {', '.join(ISOLATION)}"), exit_code=2)
    model = _PROFILE_MODELS.get(kind) if isinstance(kind, str) else None
    try:
        profile = PROFILE_ADAPTER.validate_python(file_body(doc, None))
    except ValidationError as exc:
        raise GpushareError(validation_problems(exc, doc, model)) from None
    stem = path.name.removesuffix(".yaml").removesuffix(".yml")
    if profile.name != stem:
        raise GpushareError(doc.problem(("name",), f"profile name {profile.name!r} differs from its file name",
                                        fix=f"rename the file to {profile.name}.yaml or set name: {stem}"))
    return profile, doc


_PROFILE_MODELS: dict[str, type[BaseModel]] = {
    "exclusive": ExclusiveProfile,
    "time-slicing": TimeSlicingProfile,
    "mps": MpsProfile,
    "mig": MigProfile,
    "mig-time-slicing": MigTimeSlicingProfile,
}


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"[0-9]+", text))
