"""Typed models of the cluster objects import and drift read, and of the configs embedded in ConfigMaps. A dump is
untrusted input (hand-edited, cut, or written by another tool): every field gpushare reads is checked here for the
type `kubectl get -o yaml` writes, so a wrong type is one located error instead of a crash further on. Fields
gpushare does not read are kept as they are (extra="allow"); every model is strict, so `4` is not a label value
and `"4"` is not a replica count."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

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


class _SharedResource(_Open):
    name: str
    replicas: int = 1
    rename: str | None = None
    devices: Any = None


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
    """One entry of a mig-parted config (mig-parted api/spec/v1)."""

    device_filter: str | list[str] | None = Field(None, alias="device-filter")
    devices: Literal["all"] | list[int] = "all"
    mig_enabled: bool = Field(False, alias="mig-enabled")
    mig_devices: dict[str, int] | None = Field(None, alias="mig-devices")


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
    return f"{path + ': ' if path else ''}{item['msg']} (it has {_shown(item.get('input'))})"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
