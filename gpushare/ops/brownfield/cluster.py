"""A cluster's GPU state as `kubectl get -o yaml` shows it (read from dumps in a folder, or live through the
Kubernetes client in `live.py`), and the readers import and drift share. Read-only."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpushare.core.catalog import GpuModel, load_catalog
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.mappings import dig
from gpushare.core.reading import load_yaml_documents, parse_yaml
from gpushare.core.spec import NAME_PATTERN, is_system_namespace
from gpushare.ops.brownfield.objects import MIG_CONFIG, MODELS, DevicePluginConfig, KubeObject, problems, reason

DEVICE_PLUGIN_LABEL = "nvidia.com/device-plugin.config"
OPERATOR_MIG_LABEL = "nvidia.com/mig.config"
OPERATOR_STATE_LABEL = "nvidia.com/mig.config.state"
PRODUCT_LABEL = "nvidia.com/gpu.product"
COUNT_LABEL = "nvidia.com/gpu.count"
DRIVER_LABEL = "nvidia.com/cuda.driver.major"
MIG_DISABLED = "all-disabled"
# The ConfigMap mig-manager reads where spec.migManager.config.name is unset, and the key it reads
# (gpu-operator controllers/object_controls.go MigPartedDefaultConfigMapName, TransformMIGManager @ a22dbf6).
MIG_PARTED_DEFAULT_CONFIGMAP = "default-mig-parted-config"
MIG_PARTED_KEY = "config.yaml"
# Kinds the importer reads; every other object in the dumps is listed as unsupported, not ignored.
# The largest dump file read. `kubectl get nodes -o yaml --show-managed-fields` writes about 14 KB per GPU node
# (GFD labels, images, managedFields): a 5,000-node cluster is 69 MB in one file. Its `items` are read one by one
# (core.reading.parse_yaml_documents), so the import peaks at a few times the dump's size (benchmarks/import_memory.py:
# 313 MiB for 50 MB, where the whole file's YAML tree took 1,096 MiB). 128 MiB leaves room for bigger nodes.
MAX_DUMP_BYTES = 128 * 1024 * 1024
KINDS = ("ClusterPolicy", "NVIDIADriver", "ConfigMap", "Node", "ResourceQuota", "PriorityClass", "Namespace",
         "ResourceFlavor", "ClusterQueue", "LocalQueue", "Cohort")


@dataclass
class Unsupported:
    object: str
    field: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"object": self.object, "field": self.field, "reason": self.reason}


@dataclass
class SharingConfig:
    """One named device-plugin config, reduced to what decides what a GPU advertises."""

    name: str
    kind: str  # exclusive, time-slicing or mps
    replicas: int = 1
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    per_resource: dict[str, int] = field(default_factory=dict)  # resource name -> replicas, as written
    inexpressible: set[str] = field(default_factory=set)  # resources with a rename or a device list of their own
    mig_strategy: str | None = None


@dataclass
class ConfigSource:
    """The ConfigMap the GPU Operator mounts for one operand, as the ClusterPolicy names it, and the configs the dump
    holds in it. `problem` says why they cannot be read (not in the dump, no such key, not YAML)."""

    configmap: str | None  # None: the operator mounts none (a device plugin without spec.devicePlugin.config.name)
    named_by: str  # the ClusterPolicy field that names it
    configs: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None
    broken: dict[str, str] = field(default_factory=dict)  # config name -> why it cannot be read
    file: str | None = None  # the dump file the ConfigMap came from

    def why_missing(self, name: str) -> str:
        """Why the config `name` is not among `configs`: the ConfigMap is missing or unreadable, the config
        itself is, or the ConfigMap simply lacks it."""
        where = f"ConfigMap {self.configmap!r} ({self.named_by})"
        if self.problem:
            return f"{where} {self.problem}"
        if name in self.broken:
            return f"in {where} cannot be read: {self.broken[name]}"
        return f"{where} lacks it"


@dataclass
class ClusterState:
    """The GPU-related objects of one cluster, grouped by kind, with where each came from. Everything below reads
    only these objects, so a live read and a dump of the same cluster give the same answers."""

    source: str
    objects: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    unknown: list[tuple[str, str]] = field(default_factory=list)  # (kind/name, file) of objects not read
    origins: dict[tuple[str, str, str], tuple[str, dict[str, Any]]] = field(default_factory=dict)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return self.objects.get(kind, [])

    @property
    def cluster_policy(self) -> dict[str, Any]:
        policies = self.of("ClusterPolicy")
        return policies[0] if policies else {}

    @property
    def policy_spec(self) -> dict[str, Any]:
        return dict(self.cluster_policy.get("spec") or {})

    def gpu_nodes(self) -> list[dict[str, Any]]:
        return [n for n in self.of("Node") if is_gpu_node(n)]

    # -- the ConfigMaps the operator mounts: only their configs reach a node

    def mig_source(self) -> ConfigSource:
        """mig-manager's configs: the `config.yaml` key of the ConfigMap spec.migManager.config.name names, or of
        NVIDIA's default ConfigMap where it is unset (as the operator mounts them)."""
        name = _config_spec(self.policy_spec, "migManager").get("name") or MIG_PARTED_DEFAULT_CONFIGMAP
        source, cm = self._source(name, "spec.migManager.config.name")
        if cm is None:
            return source
        data = cm.get("data") or {}
        if MIG_PARTED_KEY not in data:
            source.problem = f"has no key {MIG_PARTED_KEY!r}, the one mig-manager reads"
            return source
        try:
            value = parse_yaml(data[MIG_PARTED_KEY], MIG_PARTED_KEY)
        except GpushareError as err:
            source.problem = f"its {MIG_PARTED_KEY} cannot be read: {_first(err)}"
            return source
        configs = value.get("mig-configs") if isinstance(value, dict) else None
        if not isinstance(configs, dict):
            source.problem = f"its {MIG_PARTED_KEY} is not a mig-parted file (no mig-configs)"
            return source
        for key, entries in configs.items():
            try:
                MIG_CONFIG.validate_python(entries)
            except ValidationError as exc:
                why = reason(exc)  # "[0].mig-devices: ..." within the config, or the config's own type
                source.broken[str(key)] = f"mig-configs.{key}" + (why if why.startswith("[") else f": {why}")
                continue
            source.configs[str(key)] = entries
        return source

    def device_plugin_source(self) -> ConfigSource:
        """The device plugin's configs: every key of the ConfigMap spec.devicePlugin.config.name names. Without that
        name the operator mounts no config and the plugin runs unshared, whatever the nodes' labels say."""
        name = self.device_plugin_configmap()
        if name is None:
            return ConfigSource(None, "spec.devicePlugin.config.name")
        source, cm = self._source(name, "spec.devicePlugin.config.name")
        for key, text in (dig(cm, "data") or {}).items():
            # Read as strictly as gpushare's own files: a key twice would leave which value the plugin takes to
            # its YAML library.
            try:
                value = parse_yaml(text, str(key))
            except GpushareError as err:
                source.broken[str(key)] = _first(err)
                continue
            if value is None:  # an empty file is a config too: no sharing
                value = {}
            if not isinstance(value, dict):
                source.broken[str(key)] = f"not a device-plugin config (a {type(value).__name__}, not a mapping)"
                continue
            try:
                DevicePluginConfig.model_validate(value)
            except ValidationError as exc:
                source.broken[str(key)] = reason(exc)
                continue
            source.configs[str(key)] = value
        return source

    def device_plugin_configmap(self) -> str | None:
        return _config_spec(self.policy_spec, "devicePlugin").get("name") or None

    def _source(self, name: str, where: str) -> tuple[ConfigSource, dict[str, Any] | None]:
        source = ConfigSource(name, where)
        found = [cm for cm in self.of("ConfigMap") if name_of(cm) == name]
        namespace = str(dig(self.cluster_policy, "status", "namespace") or "")
        if namespace:  # the operator's namespace, as the operator itself reports it
            found = [cm for cm in found if _namespace_of(cm) in (namespace, "")]
        if len(found) > 1:
            spaces = ", ".join(sorted({_namespace_of(cm) or "?" for cm in found}))
            raise GpushareError(Problem(
                f"ConfigMap {name!r} ({where}) is in several namespaces ({spaces}) and the ClusterPolicy's "
                "status.namespace does not say which one is the operator's", file=self.source, path=where,
                fix="dump ConfigMaps of the operator's namespace only: kubectl get configmaps -n NAMESPACE -o yaml"))
        if not found:
            source.problem = "is not in the dump"
            return source, None
        source.file = self.origins.get(("ConfigMap", _namespace_of(found[0]), name), (None, {}))[0]
        return source, found[0]

    def device_plugin_configs(self) -> dict[str, dict[str, Any]]:
        return dict(self.device_plugin_source().configs)

    def mig_configs(self) -> dict[str, list[dict[str, Any]]]:
        return dict(self.mig_source().configs)

    def device_plugin_config_for(self, node: dict[str, Any]) -> str | None:
        """The config the device plugin's config-manager picks for this node: its label, else the ClusterPolicy's
        default, else none (the operator sets FALLBACK_STRATEGIES=empty; gpu-operator TransformDevicePlugin @
        a22dbf6). None also where the ClusterPolicy mounts no config. Without a ClusterPolicy (the rollout's gate
        reads nodes only), the label."""
        label = labels_of(node).get(DEVICE_PLUGIN_LABEL)
        if not self.of("ClusterPolicy"):
            return label
        if self.device_plugin_configmap() is None:
            return None
        return label or _config_spec(self.policy_spec, "devicePlugin").get("default") or None

    def unread_config_maps(self) -> list[tuple[str, str]]:
        """(ConfigMap, what it holds) for ConfigMaps with mig-parted or device-plugin configs the operator does not
        mount: their configs reach no node, so the import does not read them."""
        mounted = {self.mig_source().configmap, self.device_plugin_source().configmap}
        out = []
        for cm in self.of("ConfigMap"):
            if name_of(cm) in mounted:
                continue
            values = [v for _, v in _entries(cm) if isinstance(v, dict)]
            if any(isinstance(v.get("mig-configs"), dict) for v in values):
                out.append((name_of(cm), "mig-parted configs"))
            elif any(v.get("version") == "v1" and ("sharing" in v or "flags" in v) for v in values):
                out.append((name_of(cm), "device-plugin configs"))
        return out


def _namespace_of(obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata")
    return str(metadata.get("namespace") or "") if isinstance(metadata, dict) else ""


def _config_spec(spec: dict[str, Any], operand: str) -> dict[str, Any]:
    return dict(dig(spec, operand, "config") or {})


def _entries(cm: dict[str, Any] | None) -> Iterable[tuple[str, Any]]:
    for key, text in (dig(cm, "data") or {}).items():
        try:
            yield key, parse_yaml(text, str(key))
        except GpushareError:
            continue  # only looked at to say what an unmounted ConfigMap holds


def _first(err: GpushareError) -> str:
    problem = err.problems[0]
    return f"line {problem.line}: {problem.message}" if problem.line else problem.message


def labels_of(obj: dict[str, Any]) -> dict[str, str]:
    return dict(dig(obj, "metadata", "labels") or {})


def name_of(obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata")  # also called on an object not yet checked, to name it in the error
    return str(metadata.get("name", "?")) if isinstance(metadata, dict) else "?"


def is_gpu_node(node: dict[str, Any]) -> bool:
    labels = labels_of(node)
    return labels.get("nvidia.com/gpu.present") == "true" or COUNT_LABEL in labels


# ---------------------------------------------------------------- reading dumps


def read_dumps(directory: Path) -> ClusterState:
    """Every `*.yaml` in DIR: documents that are each a `kind: List` (as `kubectl get -o yaml` writes) or one
    object."""
    if not directory.is_dir():
        raise GpushareError(Problem("not a directory", file=str(directory), path="--from",
                                    fix="give a folder of `kubectl get ... -o yaml` dumps"), exit_code=2)
    state = ClusterState(source=str(directory))
    files = sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml"))
    if not files:
        raise GpushareError(Problem("holds no .yaml files", file=str(directory), path="--from",
                                    fix="dump the objects with `kubectl get nodes -o yaml > nodes.yaml` (see "
                                        "docs/adoption.md)"), exit_code=2)
    for path in files:
        # One file may hold several `kubectl get -o yaml` outputs, `---` between them.
        for data in load_yaml_documents(path, "cluster dump", MAX_DUMP_BYTES):
            add_objects(state, data, str(path))
    return state


def add_objects(state: ClusterState, data: Any, where: str) -> None:
    """The objects of one document, each checked against its model (objects.py): a field of another type than
    kubectl writes is a located error. An object in two places is read once where both copies agree, and refused
    where they differ (which one the cluster holds cannot be known)."""
    listed = isinstance(data, dict) and str(data.get("kind", "")).endswith("List")
    items = data.get("items") if listed else [data]
    if not isinstance(items, list):
        raise GpushareError(Problem(f"items is a {type(items).__name__}, not a list of objects", file=where,
                                    path="items", fix="dump with `kubectl get KIND -o yaml`"))
    for i, obj in enumerate(items):
        prefix = f"items[{i}]." if listed else ""
        if not isinstance(obj, dict) or "kind" not in obj:
            raise GpushareError(Problem("an item is not a Kubernetes object (no kind)", file=where,
                                        path=prefix.rstrip(".") or None, fix="dump with `kubectl get KIND -o yaml`"))
        kind = str(obj["kind"])
        model = MODELS.get(kind)
        if kind in KINDS:
            try:
                (model or KubeObject).model_validate(obj)
            except ValidationError as exc:
                raise GpushareError(problems(exc, where, f"{kind}/{name_of(obj)}", prefix)) from None
            key = (kind, _namespace_of(obj), name_of(obj))
            if key in state.origins:
                first, copy = state.origins[key]
                if copy == obj:
                    continue  # the same object dumped twice: one object
                raise GpushareError(Problem(
                    f"{kind}/{name_of(obj)} is also in {first}, with other content", file=where,
                    path=f"{prefix}metadata.name", fix="dump each object once (one file per kind, as "
                    "docs/adoption.md writes them), or remove the older copy"))
            state.origins[key] = (where, obj)
            state.objects.setdefault(kind, []).append(obj)
        else:
            state.unknown.append((f"{kind}/{name_of(obj)}", where))


# ---------------------------------------------------------------- reading the objects


def product_model(product: str) -> GpuModel | None:
    """The catalog model of a GPU Feature Discovery product label (`-SHARED` under time-slicing and MPS,
    `-MIG-<profile>` under the single strategy)."""
    base = re.sub(r"-SHARED$", "", product)
    base = re.sub(r"-MIG-\d+g\.\d+gb.*$", "", base)
    return load_catalog().find(base)


def sharing_config(name: str, data: dict[str, Any], unsupported: list[Unsupported], where: str) -> SharingConfig:
    flags = data.get("flags") or {}
    sharing = data.get("sharing") or {}
    known = {"version", "flags", "sharing"}
    for key in sorted(set(data) - known):
        unsupported.append(Unsupported(where, f"{name}.{key}", "device-plugin setting gpushare does not render"))
    for key in sorted(set(flags) - {"migStrategy", "failOnInitError", "plugin"}):
        unsupported.append(Unsupported(where, f"{name}.flags.{key}", "device-plugin flag gpushare does not render"))
    config = SharingConfig(name=name, kind="exclusive", mig_strategy=flags.get("migStrategy"))
    for kind, block_name in (("time-slicing", "timeSlicing"), ("mps", "mps")):
        block = sharing.get(block_name)
        if not block:
            continue
        entries = block.get("resources") or []
        resources = {str(r.get("name")): int(r.get("replicas", 1)) for r in entries}
        config.kind, config.per_resource = kind, resources
        config.replicas = max(resources.values(), default=1)
        config.rename_by_default = bool(block.get("renameByDefault", False))
        config.fail_requests_greater_than_one = bool(block.get("failRequestsGreaterThanOne", False))
        # A per-resource rename or device list shares differently than one count for the whole node can say.
        config.inexpressible = {str(r.get("name")) for r in entries if set(r) - {"name", "replicas"}}
    return config


def mig_layout(entries: list[dict[str, Any]], model: GpuModel) -> dict[str, int] | None:
    """The layout a mig-parted config gives every GPU of this model; None where MIG is off."""
    catalog = load_catalog()
    for entry in entries:
        filters = entry.get("device-filter")
        if filters is not None:
            wanted = [filters] if isinstance(filters, str) else list(filters)
            if model.name not in {m.name for m in (catalog.find(f) for f in wanted) if m is not None}:
                continue
        if not entry.get("mig-enabled"):
            return None
        # A count of 0 leaves the profile out (mig-parted allows it beside others); gpushare's layouts omit it.
        return {str(k): int(v) for k, v in (entry.get("mig-devices") or {}).items() if int(v) > 0}
    return None


def mig_entries_partial(entries: list[dict[str, Any]]) -> bool:
    """A config that gives some GPUs of a node another layout (devices: [0, 1]) cannot be a gpushare profile."""
    return any(entry.get("devices", "all") != "all" for entry in entries)


def kubernetes_minor(nodes: list[dict[str, Any]]) -> str:
    versions = [str(dig(n, "status", "nodeInfo", "kubeletVersion", default="")) for n in nodes]
    minors = sorted({m.group(1) for v in versions if (m := re.match(r"v?(1\.\d+)", v))},
                    key=lambda t: tuple(int(x) for x in t.split(".")))
    return minors[0] if minors else "1.31"


def internal_ip(node: dict[str, Any]) -> str | None:
    for address in dig(node, "status", "addresses") or []:
        if address.get("type") == "InternalIP":
            return str(address.get("address"))
    return None


def quantity(text: Any) -> int | None:
    """An extended-resource quantity (whole numbers only: GPUs cannot be fractions)."""
    try:
        return int(str(text))
    except ValueError:
        return None


def gpu_resources(values: dict[str, Any]) -> dict[str, int]:
    """The nvidia.com/* resources of a node's capacity or allocatable, or a quota's hard limits."""
    out: dict[str, int] = {}
    for key, value in (values or {}).items():
        resource = key.removeprefix("requests.")
        count = quantity(value)
        if resource.startswith("nvidia.com/") and count is not None and count > 0:
            out[resource] = count
    return out


def valid_name(text: str, limit: int = 63) -> str:
    """A DNS label from a config or object name: `all-1g.10gb` becomes `all-1g-10gb`."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:limit].strip("-")
    return cleaned or "imported"


def is_dns_label(text: str) -> bool:
    return re.fullmatch(NAME_PATTERN, text) is not None and len(text) <= 63


def tenant_namespaces(state: ClusterState) -> list[str]:
    namespaces = {str(dig(q, "metadata", "namespace", default="")) for q in state.of("ResourceQuota")}
    namespaces |= {str(dig(q, "metadata", "namespace", default="")) for q in state.of("LocalQueue")}
    return sorted(n for n in namespaces if n and not is_system_namespace(n))
