"""Typed models of the cluster objects import and drift read, and of the configs embedded in ConfigMaps. A dump is
untrusted input (hand-edited, cut, or written by another tool): every field gpushare reads is checked here for the
type `kubectl get -o yaml` writes, so a wrong type is one located error instead of a crash further on. Fields
gpushare does not read are kept as they are (extra="allow"); every model is strict, so `4` is not a label value
and `"4"` is not a replica count."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from gpushare.core.errors import Problem


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)


# A Kubernetes quantity as a dump may spell it: text ("8", "64Gi") or a bare number.
Quantity = int | Annotated[float, Field(allow_inf_nan=False)] | str


class _LabelFields(_Open):
    labels: dict[str, Any] | None = Field(None, alias="f:labels")


class _FieldsV1(_Open):
    metadata: _LabelFields | None = Field(None, alias="f:metadata")


class ManagedField(_Open):
    time: str | None = None
    fieldsV1: _FieldsV1 | None = None

    @field_validator("time")
    @classmethod
    def _rfc3339(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                raise ValueError(f"{value!r} is not an RFC 3339 time (e.g. 2026-12-01T10:00:00Z)") from None
        return value


class Metadata(_Open):
    name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] | None = None
    managedFields: list[ManagedField] | None = None


class Taint(_Open):
    key: str
    value: str | None = None
    effect: str | None = None


class NodeSpec(_Open):
    taints: list[Taint] | None = None
    providerID: str | None = None


class Address(_Open):
    type: str
    address: str


class NodeInfo(_Open):
    kubeletVersion: str | None = None


class NodeStatus(_Open):
    addresses: list[Address] | None = None
    capacity: dict[str, Quantity] | None = None
    allocatable: dict[str, Quantity] | None = None
    nodeInfo: NodeInfo | None = None


class KubeObject(_Open):
    kind: str
    metadata: Metadata | None = None


class Node(KubeObject):
    spec: NodeSpec | None = None
    status: NodeStatus | None = None


class ConfigMap(KubeObject):
    data: dict[str, str] | None = None


class _OperandConfig(_Open):
    name: str | None = None
    default: str | None = None


class _Operand(_Open):
    config: _OperandConfig | None = None


class ClusterPolicySpec(_Open):
    devicePlugin: _Operand | None = None
    migManager: _Operand | None = None
    mig: dict[str, Any] | None = None
    toolkit: dict[str, Any] | None = None
    driver: dict[str, Any] | None = None
    cdi: dict[str, Any] | None = None
    daemonsets: dict[str, Any] | None = None
    dcgm: dict[str, Any] | None = None
    dcgmExporter: dict[str, Any] | None = None


class _PolicyStatus(_Open):
    namespace: str | None = None


class ClusterPolicy(KubeObject):
    spec: ClusterPolicySpec | None = None
    status: _PolicyStatus | None = None


class _QuotaSpec(_Open):
    hard: dict[str, Quantity] | None = None


class ResourceQuota(KubeObject):
    spec: _QuotaSpec | None = None


class _LocalQueueSpec(_Open):
    clusterQueue: str | None = None


class LocalQueue(KubeObject):
    spec: _LocalQueueSpec | None = None


class _FlavorResource(_Open):
    name: str
    nominalQuota: Quantity = 0
    borrowingLimit: Quantity | None = None


class _Flavor(_Open):
    resources: list[_FlavorResource] | None = None


class _ResourceGroup(_Open):
    flavors: list[_Flavor] | None = None


class _ClusterQueueSpec(_Open):
    resourceGroups: list[_ResourceGroup] | None = None


class ClusterQueue(KubeObject):
    spec: _ClusterQueueSpec | None = None


MODELS: dict[str, type[KubeObject]] = {"Node": Node, "ConfigMap": ConfigMap, "ClusterPolicy": ClusterPolicy,
                                    "ResourceQuota": ResourceQuota, "LocalQueue": LocalQueue,
                                    "ClusterQueue": ClusterQueue}


# ---------------------------------------------------------------- configs embedded in ConfigMaps


# A device reference in a device-plugin config's `devices` list: a GPU index, a MIG index (GPU:instance) or a UUID
# (k8s-device-plugin api/config/v1 ReplicatedDeviceRef: IsGPUIndex, IsMigIndex, IsUUID).
_DEVICE_REF = re.compile(r"\d+|\d+:\d+|(?:GPU|MIG)-[0-9A-Za-z-]+")


class _SharedResource(_Open):
    """One resource of a time-slicing or MPS block, held to the device plugin's own rules (k8s-device-plugin
    api/config/v1 replicas.go, ReplicatedResource.UnmarshalJSON): a config it refuses makes the plugin fail on every
    node that names it, so gpushare reports it instead of importing a count the cluster never ran."""

    name: str
    replicas: int
    rename: str | None = None
    devices: Any = None

    @field_validator("replicas")
    @classmethod
    def _at_least_two(cls, value: int) -> int:
        if value < 2:
            raise ValueError(f"replicas is {value}: the device plugin refuses fewer than 2 (\"number of replicas "
                             "must be >= 2\") and does not start with this config")
        return value

    @field_validator("devices")
    @classmethod
    def _device_list(cls, value: Any) -> Any:
        if value is None or value == "all":
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            if value <= 0:
                raise ValueError(f"devices is {value}: a count of devices must be above 0")
            return value
        if isinstance(value, list):
            for index, item in enumerate(value):
                ok = (isinstance(item, int) and not isinstance(item, bool) and item >= 0) or (
                    isinstance(item, str) and _DEVICE_REF.fullmatch(item) is not None)
                if not ok:
                    raise ValueError(f"devices[{index}] is {item!r}: the device plugin takes a GPU index, a MIG "
                                     "index (GPU:instance) or a UUID")
            return value
        raise ValueError(f"devices is {value!r}: the device plugin takes 'all', a count above 0 or a list of GPU "
                         "indices, MIG indices or UUIDs")


class _SharingBlock(_Open):
    renameByDefault: bool = False
    failRequestsGreaterThanOne: bool = False
    resources: list[_SharedResource] | None = None


class _Sharing(_Open):
    timeSlicing: _SharingBlock | None = None
    mps: _SharingBlock | None = None


class DevicePluginConfig(_Open):
    """One device-plugin config file (k8s-device-plugin api/config/v1)."""

    flags: dict[str, Any] | None = None
    sharing: _Sharing | None = None


class MigEntry(_Open):
    """One entry of a mig-parted config, held to mig-parted's own rules (api/spec/v1 MigConfigSpec.UnmarshalJSON,
    pkg/types MigConfig.AssertValidFormat): mig-manager refuses the whole file otherwise."""

    device_filter: str | list[str] | None = Field(None, alias="device-filter")
    devices: Literal["all"] | list[int] = "all"
    mig_enabled: bool = Field(False, alias="mig-enabled")
    mig_devices: dict[str, int] | None = Field(None, alias="mig-devices")

    @field_validator("devices")
    @classmethod
    def _gpu_indices(cls, value: Literal["all"] | list[int]) -> Literal["all"] | list[int]:
        if isinstance(value, list):
            for index, item in enumerate(value):
                if item < 0:
                    raise ValueError(f"devices[{index}] is {item}: a GPU index is 0 or more, so this entry would "
                                     "configure no GPU")
        return value

    @field_validator("mig_devices")
    @classmethod
    def _counts(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        for profile, count in (value or {}).items():
            if count < 0:
                raise ValueError(f"mig-devices[{profile}] is {count}: mig-parted refuses a negative count")
        if value and not any(count > 0 for count in value.values()):
            raise ValueError("mig-devices: every count is 0, which mig-parted refuses (\"all counts for all "
                             "MigProfiles are 0\")")
        return value

    @model_validator(mode="after")
    def _enabled_with_devices(self) -> MigEntry:
        if self.mig_enabled and self.mig_devices is None:
            raise ValueError("mig-enabled is true but mig-devices is missing, which mig-parted refuses")
        if not self.mig_enabled and self.mig_devices:
            raise ValueError("mig-devices is set but mig-enabled is false, which mig-parted refuses (\"MIG devices "
                             "included when 'mig-enabled' is false\")")
        return self


MIG_CONFIG = TypeAdapter(list[MigEntry])


_BRANCH = re.compile(r"int|str|float|bool|function-\w+\[.*\]|literal\[.*\]|list\[.*\]|dict\[.*\]")


def location(loc: tuple[int | str, ...]) -> str:
    """A pydantic location as a field path: metadata.labels[nvidia.com/gpu.count], items[2]."""
    out = ""
    for part in loc:
        if isinstance(part, str) and _BRANCH.fullmatch(part):
            continue  # which branch of a union pydantic tried, not a field
        if isinstance(part, int):
            out += f"[{part}]"
        elif "." in part or "/" in part or ":" in part:
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


_EXPECTED = {"string_type": "text (in quotes where it looks like a number, as kubectl writes label values and "
                            "quantities)",
             "int_type": "a whole number without quotes", "bool_type": "true or false",
             "dict_type": "a mapping (key: value)", "list_type": "a list", "model_type": "a mapping (key: value)",
             "float_finite_number": "a finite number"}


def problems(error: ValidationError, file: str, obj: str, prefix: str = "") -> list[Problem]:
    """Located problems, one per wrong field, each saying what the field must be."""
    out: dict[str, Problem] = {}
    for item in error.errors():
        path = location(tuple(item["loc"]))
        if path in out:
            continue  # a union reports each branch it tried: the first says enough
        want = _EXPECTED.get(item["type"])
        got = type(item.get("input")).__name__
        fix = (f"write {want}" if want else "correct the field") + ", or dump the object again with kubectl get -o yaml"
        out[path] = Problem(f"{obj}: {item['msg']} (the dump has {_shown(item.get('input'))}, a {got})", file=file,
                            path=f"{prefix}{path}", fix=fix)
    return list(out.values())[:10]


def reason(error: ValidationError) -> str:
    """The first wrong field of an embedded config, in one line."""
    item = error.errors()[0]
    path = location(tuple(item["loc"]))
    message = str(item["msg"]).removeprefix("Value error, ")
    return f"{path + ': ' if path else ''}{message} (it has {_shown(item.get('input'))})"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
