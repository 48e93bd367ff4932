"""The environment and profile files as pydantic models (unknown keys are errors), and loading them with
errors that name the file, the line, the field and the fix."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from gpushare.errors import GpushareError, Problem

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Label values are at most 63 characters; config names are built from a profile name, a GPU slug and a hash.
PROFILE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,28}[a-z0-9])?$"
VERSION_PATTERN = r"^\d+\.\d+(\.\d+)?$"
RESOURCE_PATTERN = r"^[a-z0-9.-]+/[a-zA-Z0-9._-]+$"

DnsName = Annotated[str, Field(pattern=NAME_PATTERN, max_length=63)]


def invalid(message: str, fix: str) -> PydanticCustomError:
    """A validation error that carries its fix, for the error report."""
    return PydanticCustomError("gpushare", message.replace("{", "(").replace("}", ")"), {"fix": fix})


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
    layouts: dict[str, str] | None = Field(
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
    description: str = ""


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


class Cluster(Strict):
    name: DnsName
    kind: Literal["bare-metal", "gke", "eks"]
    mig_strategy: Literal["single", "mixed"] = Field(
        "mixed", description="GPU Operator mig.strategy: cluster-wide; mixed advertises nvidia.com/mig-<profile>."
    )
    cdi: bool = Field(True, description="GPU Operator cdi.enabled; the device plugin then uses CDI device lists.")
    kubeconfig_context: str | None = None
    region: str | None = None


class Taint(Strict):
    key: Annotated[str, Field(pattern=r"^([a-z0-9.-]+/)?[A-Za-z0-9._-]+$")]
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class Host(Strict):
    name: DnsName
    address: str = Field(description="Management address Ansible connects to.")
    gpu_model: str | None = Field(None, description="NVML product name, alias or PCI id; defaults to the pool's.")
    gpu_count: int = Field(ge=1, le=16)
    driver_branch: int | None = Field(None, ge=450, le=999)
    profile: str | None = Field(None, description="Overrides the pool's sharing profile on this host.")
    nvswitch: bool = Field(False, description="HGX system with NVSwitch: needs nvidia-fabricmanager.")
    containerd_version: Annotated[str, Field(pattern=VERSION_PATTERN)] | None = None


class CloudNodes(Strict):
    machine_type: str
    gpus_per_node: int = Field(ge=1, le=16)
    node_count: int = Field(ge=0, le=1000)
    min_node_count: int | None = Field(None, ge=0)
    max_node_count: int | None = Field(None, ge=0)
    zones: list[str] = Field(default_factory=list)
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
    cluster: str
    purpose: Literal["inference", "training", "development", "batch"]
    gpu_model: str | None = None
    profile: str
    description: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=list)
    hosts: list[Host] = Field(default_factory=list)
    cloud: CloudNodes | None = None

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
    clusters: list[str] | None = Field(None, description="Clusters the tenant uses; all when absent.")
    quota: dict[Annotated[str, Field(pattern=RESOURCE_PATTERN)], Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict, description="GPU resources the tenant is guaranteed, by advertised resource name."
    )
    borrowing_limit: dict[str, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict, description="Extra resources the tenant may borrow from idle quota in its cohort."
    )


class Environment(Strict):
    name: DnsName
    description: str = ""
    defaults: Defaults
    clusters: list[Cluster] = Field(min_length=1)
    pools: list[Pool] = Field(min_length=1)
    tenants: list[Tenant] = Field(default_factory=list)
    profiles: list[SharingProfile] = Field(
        default_factory=list, description="Profiles local to this environment, beside those in profiles/."
    )


# ---------------------------------------------------------------- loading with located errors


_Loader: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _DuplicateKey(Exception):
    def __init__(self, key: str, line: int) -> None:
        self.key, self.line = key, line


class _StrictLoader(_Loader):
    """Safe loading (libyaml when present) that refuses duplicate keys instead of keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = key_node.value
            if key in seen:
                raise _DuplicateKey(str(key), key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    lambda loader, node: loader.construct_mapping(node, deep=True),
)


def _load_yaml(text: str, file: str) -> Any:
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a safe loader subclass
    except _DuplicateKey as dup:
        raise GpushareError(Problem(f"key {dup.key!r} appears twice; YAML would keep only the last", file=file,
                                    line=dup.line, fix="remove one of them")) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise GpushareError(
            Problem(f"not valid YAML: {getattr(exc, 'problem', exc)}", file=file, line=line, fix="fix the syntax")
        ) from None


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
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        return "use a value in the allowed range"
    if kind in ("literal_error", "union_tag_invalid", "enum"):
        expected = err.get("ctx", {}).get("expected") or err.get("ctx", {}).get("expected_tags")
        return f"use one of: {expected}" if expected else None
    if kind == "string_pattern_mismatch":
        return "use lowercase letters, digits and '-' (a DNS label) or the documented format"
    return None


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
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        data_loc = doc.data_path(loc)[len(doc.base):]
        message = err["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, "):]
        if err["type"] == "extra_forbidden":
            message = f"unknown key {data_loc[-1]!r}" if data_loc else "unknown key"
        problems.append(doc.problem(loc, message, _fix_for(err, model, data_loc)))
    return problems


def read_yaml(path: Path) -> Located:
    file = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise GpushareError(Problem("file not found", file=file, fix="check the path or the environment name"),
                            exit_code=2) from None
    return Located(file, _load_yaml(text, file), text)


def load_environment(path: Path) -> tuple[Environment, Located]:
    doc = read_yaml(path)
    if not isinstance(doc.data, dict):
        raise GpushareError(Problem("an environment file must be a mapping", file=doc.file, line=1,
                                    fix="start from environments/dev.yaml"))
    try:
        env = Environment.model_validate(doc.data)
    except ValidationError as exc:
        raise GpushareError(validation_problems(exc, doc, Environment)) from None
    return env, doc


def load_profile_file(path: Path) -> tuple[Any, Located]:
    doc = read_yaml(path)
    if not isinstance(doc.data, dict):
        raise GpushareError(Problem("a profile file must be a mapping", file=doc.file, line=1))
    kind = doc.data.get("kind")
    model = _PROFILE_MODELS.get(kind) if isinstance(kind, str) else None
    try:
        profile = PROFILE_ADAPTER.validate_python(doc.data)
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
    return tuple(int(p) for p in re.findall(r"\d+", text))


def json_schemas() -> dict[str, dict[str, Any]]:
    env = Environment.model_json_schema()
    env["title"] = "gpushare environment"
    profile = PROFILE_ADAPTER.json_schema()
    profile["title"] = "gpushare sharing profile"
    from gpushare.guardrails import Guardrails  # guardrails builds on this module

    guardrails = Guardrails.model_json_schema()
    guardrails["title"] = "gpushare guardrails"
    return {"environment.schema.json": env, "profile.schema.json": profile, "guardrails.schema.json": guardrails}
