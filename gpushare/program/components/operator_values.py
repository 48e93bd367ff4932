"""GPU Operator values for one cluster, derived from the resolved fleet, and the checks they must pass before the
release is registered. Pure functions over data: the NvidiaStack component and the tests call them directly."""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpushare.core import spec
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.nvidia.operator import CHART_VERSION, cluster_policy_spec_schema, gpu_operator_chart_values
from gpushare.core.resolve import (
    MIG_DISABLED,
    ResolvedFleet,
    ResolvedNode,
    device_plugin_content,
    device_plugin_digest,
)
from gpushare.policy.device_plugin import device_plugin_values
from gpushare.render.fleet import mig_parted_configs, parse_device_plugin
from gpushare.render.monitoring import dcgm_counters
from gpushare.render.monitoring import dcgm_exporter_env as monitoring_env
from gpushare.render.templating import environment as templates

CHART = "gpu-operator"  # at CHART_VERSION (core.nvidia.operator), the release gpushare/data copies
CHART_REPOSITORY = "https://helm.ngc.nvidia.com/nvidia"
NAMESPACE = "gpu-operator"
RELEASE = "gpu-operator"
DEVICE_PLUGIN_CONFIGMAP = "gpushare-device-plugin-configs"
MIG_PARTED_CONFIGMAP = "gpushare-mig-parted-config"
DEFAULT_DEVICE_PLUGIN_CONFIG = "gpushare-default"
DEVICE_PLUGIN_HASH_ENV = "GPUSHARE_DEVICE_PLUGIN_CONFIGS_SHA256"
MIG_PARTED_HASH_ENV = "GPUSHARE_MIG_PARTED_CONFIG_SHA256"
DCGM_COUNTERS_CONFIGMAP = "gpushare-dcgm-exporter-counters"
DCGM_COUNTERS_KEY = "dcgm-metrics.csv"  # the key the operator mounts (values.yaml, dcgmExporter.config)
DCGM_COUNTERS_HASH_ENV = "GPUSHARE_DCGM_COUNTERS_SHA256"
# NVIDIA's GKE instructions (cloud-native-docs gpu-operator/google-gke.rst): driver and toolkit live here on GKE nodes.
GKE_INSTALL_DIR = "/home/kubernetes/bin/nvidia"
# nv-hostengine of the host's nvidia-dcgm service (Ansible-managed hosts).
HOST_DCGM_ENGINE = "localhost:5555"


# ---------------------------------------------------------------- what one cluster needs


@dataclass(frozen=True)
class ClusterGpus:
    """The GPU nodes of one cluster and what they ask of the GPU Operator."""

    cluster: spec.Cluster
    nodes: tuple[ResolvedNode, ...]

    @classmethod
    def of(cls, fleet: ResolvedFleet, cluster: spec.Cluster) -> ClusterGpus:
        return cls(cluster, tuple(n for n in fleet.nodes if n.cluster == cluster.name))

    @property
    def operand_nodes(self) -> list[ResolvedNode]:
        """Nodes the operator's operands serve (GKE-managed nodes opt out of all of them)."""
        return [n for n in self.nodes if n.managed_by != "gke"]

    @property
    def all_ansible(self) -> bool:
        nodes = self.operand_nodes
        return bool(nodes) and all(n.managed_by == "ansible" for n in nodes)

    @property
    def mixed(self) -> bool:
        kinds = {n.managed_by for n in self.operand_nodes}
        return kinds == {"ansible", "gpu-operator"}

    @property
    def operator_nodes(self) -> list[ResolvedNode]:
        return [n for n in self.nodes if n.managed_by == "gpu-operator"]

    @property
    def needs_driver(self) -> bool:
        # GKE's driver installer and the EKS NVIDIA AMI bring the driver; only operator-managed bare metal needs it.
        return self.cluster.kind == "bare-metal" and bool(self.operator_nodes)

    @property
    def needs_toolkit(self) -> bool:
        return self.cluster.kind != "eks" and bool(self.operator_nodes)

    @property
    def needs_mig_manager(self) -> bool:
        return any(n.mig_config is not None for n in self.operator_nodes)

    @property
    def taints(self) -> list[spec.Taint]:
        seen: dict[tuple[str, str, str], spec.Taint] = {}
        for n in self.nodes:
            for t in n.taints:
                seen.setdefault((t.key, t.value, t.effect), t)
        return list(seen.values())

    @property
    def device_plugin_configs(self) -> list[str]:
        return sorted({n.device_plugin_config for n in self.operand_nodes if n.device_plugin_config})

    @property
    def mig_configs(self) -> list[str]:
        return sorted({n.mig_config for n in self.operator_nodes if n.mig_config})


# ---------------------------------------------------------------- rendered configs


def default_device_plugin_content(cluster: spec.Cluster) -> dict[str, Any]:
    """The config for GPU nodes without a device-plugin.config label: whole GPUs, no sharing, same strategies."""
    exclusive = spec.ExclusiveProfile(name=DEFAULT_DEVICE_PLUGIN_CONFIG, kind="exclusive")
    return device_plugin_content(exclusive, cluster, None)


def device_plugin_configmap_data(fleet: ResolvedFleet, gpus: ClusterGpus, kept: dict[str, dict[str, Any]]
                                 ) -> dict[str, str]:
    """Every sharing config the cluster's nodes reference, those nodes still use (kept), and the safe default,
    rendered with the same template as `gpushare render`."""
    template = templates().get_template("device-plugin-config.yaml.j2")
    contents: dict[str, dict[str, Any]] = {DEFAULT_DEVICE_PLUGIN_CONFIG: default_device_plugin_content(gpus.cluster)}
    for name in gpus.device_plugin_configs:
        contents[name] = fleet.device_plugin_configs[name].content
    for name, content in kept.items():
        contents.setdefault(name, content)
    return {name: template.render(name=name, cluster=gpus.cluster.name, content=contents[name])
            for name in sorted(contents)}


def mig_parted_configmap_data(fleet: ResolvedFleet, gpus: ClusterGpus) -> dict[str, str]:
    """mig-parted config for the operator's mig-manager: the configs of operator-managed MIG nodes, and all-disabled."""
    wanted = {MIG_DISABLED, *gpus.mig_configs}
    configs = {k: v for k, v in mig_parted_configs(fleet).items() if k in wanted}
    text = templates().get_template("mig-parted-config.yaml.j2").render(environment=fleet.environment,
                                                                        configs=configs)
    return {"config.yaml": text}


def kept_device_plugin_configs(entries: list[Any], fleet: ResolvedFleet, root: Path, stack_file: str
                               ) -> dict[str, dict[str, Any]]:
    """Configs nodes still use (`gpushare:keepDevicePluginConfigs`): a name the fleet still renders, or a name with
    the file `gpushare render` wrote for it. A config's name ends in its content hash, which must match."""
    out: dict[str, dict[str, Any]] = {}
    for i, entry in enumerate(entries):
        name = entry if isinstance(entry, str) else entry.name
        where = f"gpushare:keepDevicePluginConfigs[{i}]"
        if isinstance(entry, str):
            if name not in fleet.device_plugin_configs:
                raise GpushareError(Problem(
                    f"kept device-plugin config {name!r} is not in the environment any more, so its content is "
                    "unknown", file=stack_file, path=where,
                    fix="give it as {name, file} with the file `gpushare render` wrote for it"))
            out[name] = fleet.device_plugin_configs[name].content
            continue
        path = Path(entry.file) if Path(entry.file).is_absolute() else root / entry.file
        if entry.adopted:
            out[name] = _adopted_config(path, stack_file, where)
            continue
        try:
            content = parse_device_plugin(path.read_text())
        except OSError as exc:
            raise GpushareError(Problem(f"cannot read {path}: {exc.strerror}", file=stack_file, path=where,
                                        fix="point file at the rendered device-plugin config")) from None
        except Exception as exc:  # noqa: BLE001 - any parse or schema failure is the same bad input
            raise GpushareError(Problem(f"{path} is not a device-plugin config: {exc}", file=stack_file,
                                        path=where, fix="point file at the rendered device-plugin config")) from None
        digest = device_plugin_digest(content)
        if not name.endswith(f"-{digest}"):
            raise GpushareError(Problem(f"{path} does not hold config {name!r} (its content hashes to {digest})",
                                        file=stack_file, path=where, fix="use the file rendered for that name"))
        out[name] = content
    return out


def _adopted_config(path: Path, stack_file: str, where: str) -> dict[str, Any]:
    """A config the cluster ran before the import, as the import copied it: the device plugin's own file (version
    v1), taken as it is; gpushare wrote none of it, so its own subset schema does not judge it."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise GpushareError(Problem(f"cannot read adopted config {path}: {exc}", file=stack_file, path=where,
                                    fix="point file at the copy `gpushare import` wrote under imports/")) from None
    if not isinstance(data, dict) or data.get("version") != "v1":
        raise GpushareError(Problem(f"{path} is not a device-plugin config file (version: v1)", file=stack_file,
                                    path=where, fix="point file at the copy `gpushare import` wrote under imports/"))
    return data


def kept_for_cluster(kept: dict[str, dict[str, Any]], cluster: spec.Cluster, adopted: frozenset[str] = frozenset()
                     ) -> dict[str, dict[str, Any]]:
    """A kept config belongs where its strategies are the cluster's (content-hashed names are cluster-specific); an
    adopted one (the cluster's own, under its own name) everywhere, as the cluster had it."""
    flags = default_device_plugin_content(cluster)["flags"]
    return {name: content for name, content in kept.items()
            if name in adopted or content.get("flags", {}).get("migStrategy") == flags["migStrategy"]
            and content.get("flags", {}).get("plugin", {}).get("deviceListStrategy")
            == flags["plugin"]["deviceListStrategy"]}


def content_hash(data: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- tolerations


def toleration_for(taint: spec.Taint) -> dict[str, str]:
    if taint.value:
        return {"key": taint.key, "operator": "Equal", "value": taint.value, "effect": taint.effect}
    return {"key": taint.key, "operator": "Exists", "effect": taint.effect}


def tolerates(toleration: dict[str, Any], taint: spec.Taint) -> bool:
    """Kubernetes' matching rule (k8s.io/api core/v1 Toleration.ToleratesTaint)."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if key and key != taint.key:
        return False
    if operator == "Exists":
        return True
    return bool(key) and (toleration.get("value") or "") == taint.value


def untolerated(taints: list[spec.Taint], tolerations: list[dict[str, Any]]) -> list[spec.Taint]:
    return [t for t in taints if not any(tolerates(tol, t) for tol in tolerations)]


def with_tolerations(defaults: list[dict[str, Any]], taints: list[spec.Taint]) -> list[dict[str, Any]]:
    out = [dict(t) for t in defaults]
    for taint in taints:
        if not any(tolerates(tol, taint) for tol in out):
            out.append(toleration_for(taint))
    return out


# ---------------------------------------------------------------- the values


def _env(pairs: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in pairs.items()]


def dcgm_counters_configmap_data(fleet: ResolvedFleet) -> dict[str, str]:
    """dcgm-exporter's counters: its defaults plus every field gpushare's rules and capacity planning read."""
    return {DCGM_COUNTERS_KEY: dcgm_counters(fleet)}


def dcgm_exporter_env(fleet: ResolvedFleet, gpus: ClusterGpus, counters_hash: str) -> dict[str, str]:
    env = dict(monitoring_env(fleet))
    if gpus.all_ansible:
        # Every GPU node runs DCGM on the host (docs/nvidia-stack.md): the exporter reads it instead of embedding one.
        env["DCGM_REMOTE_HOSTENGINE_INFO"] = HOST_DCGM_ENGINE
    env[DCGM_COUNTERS_HASH_ENV] = counters_hash
    return env


def operator_values(fleet: ResolvedFleet, gpus: ClusterGpus, *, device_plugin_hash: str,
                    mig_parted_hash: str | None, dcgm_counters_hash: str, monitoring_release: str
                    ) -> dict[str, Any]:
    """Values for the pinned GPU Operator chart. Every switch that matters is set explicitly, never left to the
    chart's defaults: mig.strategy and cdi.enabled, the operands, the device-plugin env (applied last by the
    operator, so it decides the effective device list strategy), tolerations for every pool taint."""
    cluster = gpus.cluster
    defaults = gpu_operator_chart_values()
    plugin = device_plugin_values(cluster)  # the library's one computation of the plugin's settings
    taints = gpus.taints
    values: dict[str, Any] = {
        "mig": plugin["mig"],
        "cdi": plugin["cdi"],
        "driver": {"enabled": gpus.needs_driver},
        "toolkit": {"enabled": gpus.needs_toolkit},
        "migManager": {"enabled": gpus.needs_mig_manager},
        "devicePlugin": {
            "enabled": True,
            "config": {"create": False, "name": DEVICE_PLUGIN_CONFIGMAP, "default": DEFAULT_DEVICE_PLUGIN_CONFIG},
            # The operator does not watch this ConfigMap (gpu-operator issues 1144, 412): a content hash rolls the
            # plugin. DEVICE_LIST_STRATEGY is spelt out because the operator's own default is envvar.
            "env": [*plugin["devicePlugin"]["env"], *_env({DEVICE_PLUGIN_HASH_ENV: device_plugin_hash})],
        },
        "daemonsets": {"tolerations": with_tolerations(defaults["daemonsets"]["tolerations"], taints)},
        # NFD labels the GPU nodes the operands select on: its worker must reach tainted pools too.
        "node-feature-discovery": {"worker": {"tolerations": with_tolerations(
            defaults["node-feature-discovery"]["worker"]["tolerations"], taints)}},
        "dcgm": {"enabled": False},
        "dcgmExporter": {
            "enabled": True,
            "config": {"name": DCGM_COUNTERS_CONFIGMAP},
            "env": _env(dcgm_exporter_env(fleet, gpus, dcgm_counters_hash)),
            # gpushare's rules attribute GPU series to pods by the exporter's own pod/namespace labels.
            "serviceMonitor": {"enabled": True, "honorLabels": True,
                               "additionalLabels": {"release": monitoring_release}},
        },
    }
    if gpus.needs_toolkit:
        values["toolkit"]["env"] = _env({
            "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED": "false",
            "ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS": "true",
        })
    if gpus.needs_mig_manager:
        values["migManager"]["config"] = {"create": False, "name": MIG_PARTED_CONFIGMAP, "default": MIG_DISABLED}
        env = {MIG_PARTED_HASH_ENV: mig_parted_hash or ""}
        if cluster.kind == "gke":
            env["WITH_REBOOT"] = "true"  # NVIDIA's GKE instructions for MIG Manager
        values["migManager"]["env"] = _env(env)
    if cluster.kind == "gke":
        values["hostPaths"] = {"driverInstallDir": GKE_INSTALL_DIR}
        if gpus.needs_toolkit:
            values["toolkit"]["installDir"] = GKE_INSTALL_DIR
    if gpus.all_ansible:
        # The operator applies dcgmExporter.env after deciding hostNetwork (TransformDCGMExporter), so the host's
        # localhost engine also needs hostNetwork set here.
        values["dcgmExporter"]["hostNetwork"] = True
    return values


# ---------------------------------------------------------------- checks


def _free_form(values_node: Any, schema_node: Any) -> bool:
    """Below this point any key is allowed: an empty map in the chart's values, or an open map in the CRD."""
    if isinstance(values_node, dict) and not values_node and schema_node is None:
        return True
    if isinstance(schema_node, dict):
        extra = schema_node.get("additionalProperties")
        if extra not in (None, False) or schema_node.get("x-kubernetes-preserve-unknown-fields"):
            return True
    return False


def unknown_chart_keys(values: dict[str, Any]) -> list[str]:
    """Value paths that neither the pinned chart's values.yaml nor the ClusterPolicy CRD knows."""
    found: list[str] = []

    def walk(node: Any, values_node: Any, schema_node: Any, path: str) -> None:
        if isinstance(node, list):
            items = schema_node.get("items") if isinstance(schema_node, dict) else None
            sample = values_node[0] if isinstance(values_node, list) and values_node else None
            for i, item in enumerate(node):
                if isinstance(item, dict):
                    walk(item, sample, items, f"{path}[{i}]")
            return
        if not isinstance(node, dict) or _free_form(values_node, schema_node):
            return
        props = schema_node.get("properties", {}) if isinstance(schema_node, dict) else {}
        for key, child in node.items():
            known_in_values = isinstance(values_node, dict) and key in values_node
            child_schema = props.get(key)
            where = f"{path}.{key}" if path else str(key)
            if not known_in_values and child_schema is None:
                found.append(where)
                continue
            walk(child, values_node.get(key) if isinstance(values_node, dict) else None, child_schema, where)

    walk(values, gpu_operator_chart_values(), cluster_policy_spec_schema(), "")
    return found


def check_chart_values(values: dict[str, Any]) -> list[Problem]:
    import jsonschema

    problems = [Problem(f"GPU Operator {CHART_VERSION} has no value {path!r}",
                        fix="use a key from the pinned chart's values.yaml (gpushare/data/gpu-operator-values.yaml) "
                            "or the ClusterPolicy CRD")
                for path in unknown_chart_keys(values)]
    # Values the CRD knows must also have the CRD's types (the operator would reject the ClusterPolicy).
    schema = cluster_policy_spec_schema()
    for key, value in values.items():
        sub = schema.get("properties", {}).get(key)
        if sub is None:
            continue
        for err in jsonschema.Draft7Validator(sub).iter_errors(value):
            where = ".".join([key, *(str(p) for p in err.absolute_path)])
            problems.append(Problem(f"GPU Operator value {where}: {err.message}",
                                    fix="use the type the ClusterPolicy CRD gives"))
    return problems


def _leaf_paths(node: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(node, dict) and node:
        return [p for k, v in node.items() for p in _leaf_paths(v, (*path, str(k)))]
    return [path] if path else []


def merge_site_values(ours: dict[str, Any], site: dict[str, Any]) -> dict[str, Any]:
    """Add the site's own values (image mirrors, resources) to ours; a key that gpushare sets is refused, so the
    stack config cannot undo a safety setting."""
    ours_paths = set(_leaf_paths(ours))
    conflicts = []
    for path in _leaf_paths(site):
        if any(path[:len(p)] == p or p[:len(path)] == path for p in ours_paths):
            conflicts.append(".".join(path))
    if conflicts:
        raise GpushareError([Problem(f"gpushare:operatorValues sets {c!r}, which gpushare derives from the fleet",
                                     path=f"gpushare:operatorValues.{c}",
                                     fix="change the environment file instead, or drop the key")
                             for c in conflicts])
    merged = copy.deepcopy(ours)

    def merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
        for key, value in extra.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = copy.deepcopy(value)

    merge(merged, site)
    return merged
