"""Render the files NVIDIA's tools read, from the package templates (gpushare/templates/) and the resolved fleet,
and parse them back."""

from __future__ import annotations

import json
import os
import shutil
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from gpushare.core.catalog import load_catalog
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.files import complete_swap, replace_dir
from gpushare.core.guardrails import load_guardrails
from gpushare.core.resolve import ResolvedFleet
from gpushare.core.spec import version_tuple
from gpushare.render.monitoring import render_monitoring
from gpushare.render.templating import environment

MARKER = ".gpushare-render"
# What `gpushare preview --out DIR` writes (gpushare/ops/preview.py): a render into the same DIR (the README uses
# build/<env> for both) keeps these, so neither command deletes the other's output.
PREVIEW_MARKER = ".gpushare-preview"
PREVIEW_PARTS = ("manifests", "helm-values", PREVIEW_MARKER)


# ---------------------------------------------------------------- settings (data; templates stay thin)


@dataclass(frozen=True)
class ToolkitSettings:
    """nvidia-container-runtime settings gpushare enforces (docs/safety-rules.md rule 5)."""

    accept_envvar_when_unprivileged: bool = False
    accept_volume_mounts: bool = True
    mode: str = "cdi"
    driver_capabilities: str = "compat32,compute,display,graphics,ngx,utility,video"
    ldconfig: str = "@/sbin/ldconfig"
    runtimes: tuple[str, ...] = ("runc", "crun")
    cdi_annotation_prefixes: tuple[str, ...] = ("cdi.k8s.io/",)
    cdi_spec_dirs: tuple[str, ...] = ("/etc/cdi", "/var/run/cdi")


@dataclass(frozen=True)
class ContainerdRuntime:
    containerd: str  # major.minor
    config_version: int
    cri_plugin: str
    default_runtime: bool
    binary: str = "/usr/bin/nvidia-container-runtime"
    systemd_cgroup: bool = True

    @property
    def filename(self) -> str:
        return f"nvidia-runtime-containerd{self.containerd}.toml"


def toolkit_settings(fleet: ResolvedFleet) -> ToolkitSettings:
    cdi = any(c.cdi for c in fleet.clusters.values() if c.kind == "bare-metal")
    return ToolkitSettings(mode="cdi" if cdi else "legacy")


def containerd_runtime(version: str) -> ContainerdRuntime:
    major_minor = version_tuple(version)[:2]
    text = ".".join(str(v) for v in major_minor)
    if major_minor >= (2, 0):
        return ContainerdRuntime(text, 3, "io.containerd.cri.v1.runtime", default_runtime=False)
    # containerd 1.6 has no CDI: pods reach GPUs only if nvidia is the default runtime.
    return ContainerdRuntime(text, 2, "io.containerd.grpc.v1.cri", default_runtime=major_minor < (1, 7))


# ---------------------------------------------------------------- rendering


@dataclass
class Rendered:
    files: dict[str, str] = field(default_factory=dict)  # relative path -> content


def mig_parted_configs(fleet: ResolvedFleet) -> dict[str, list[dict[str, Any]]]:
    catalog = load_catalog()
    configs: dict[str, list[dict[str, Any]]] = {"all-disabled": [{"devices": "all", "mig-enabled": False}]}
    for name in sorted(fleet.mig_configs):
        entries = []
        for model_name, layout in fleet.mig_configs[name].items():
            model = catalog.models[model_name]
            entries.append({
                "device-filter": list(model.pci_device_ids),
                "devices": "all",
                "mig-enabled": True,
                "mig-devices": dict(layout),
            })
        configs[name] = entries
    return configs


def render_fleet(fleet: ResolvedFleet) -> Rendered:
    env = environment()
    out = Rendered()
    out.files["mig-parted/config.yaml"] = env.get_template("mig-parted-config.yaml.j2").render(
        environment=fleet.environment, configs=mig_parted_configs(fleet))
    template = env.get_template("device-plugin-config.yaml.j2")
    for name in sorted(fleet.device_plugin_configs):
        cfg = fleet.device_plugin_configs[name]
        out.files[f"device-plugin/{name}.yaml"] = template.render(name=name, cluster=cfg.cluster,
                                                                   content=cfg.content)
    out.files["nvidia-container-toolkit/config.toml"] = env.get_template(
        "nvidia-container-toolkit-config.toml.j2").render(t=toolkit_settings(fleet))
    runtime_template = env.get_template("containerd-nvidia-runtime.toml.j2")
    versions = sorted({n.containerd_version for n in fleet.nodes if n.managed_by == "ansible"})
    for version in versions:
        runtime = containerd_runtime(version)
        out.files[f"containerd/{runtime.filename}"] = runtime_template.render(r=runtime)

    out.files.update(render_monitoring(fleet, load_guardrails()))  # counters CSV, rules per cluster, dashboards
    out.files["fleet.json"] = json.dumps(fleet.as_dict(), indent=2, sort_keys=False) + "\n"
    return out


def write_rendered(rendered: Rendered, out: Path) -> list[Path]:
    """Write everything or nothing: the files go into a directory beside `out` that then takes its place in one
    step, so `out` holds the whole old or the whole new output at every instant. What `gpushare preview --out`
    wrote there (PREVIEW_PARTS) is carried into the new directory, not deleted."""
    complete_swap(out)
    if out.exists() and not out.is_dir():
        raise GpushareError(Problem(f"{out} is a file, not a directory", fix="name a new or gpushare-written "
                                    "directory"), exit_code=2)
    if out.exists() and any(out.iterdir()) and not (out / MARKER).exists():
        raise GpushareError(Problem(f"{out} exists and was not written by `gpushare render`",
                                    fix="choose an empty or new directory"), exit_code=2)

    kept = [out / name for name in PREVIEW_PARTS if (out / PREVIEW_MARKER).is_file() and (out / name).exists()]

    def fill(tmp: Path) -> None:
        for rel, text in rendered.files.items():
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        (tmp / MARKER).write_text("written by gpushare render; the whole directory is replaced on each run, except "
                                  "what `gpushare preview` wrote (manifests/, helm-values/)\n")
        for part in kept:  # hard links: the preview's files come along without being copied
            if part.is_dir():
                shutil.copytree(part, tmp / part.name, symlinks=True, copy_function=_link)
            else:
                _link(part, tmp / part.name)

    replace_dir(fill, out)
    return [out / rel for rel in rendered.files]


def _link(source: str | Path, target: str | Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem (DIR a mount point) or no hard links: copy instead
        shutil.copy2(source, target)


# ---------------------------------------------------------------- parsing back (round trip, verification)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class _SharedResource(_Strict):
    name: str
    replicas: int = Field(ge=2)


class _TimeSlicing(_Strict):
    renameByDefault: bool = False
    failRequestsGreaterThanOne: bool = False
    resources: list[_SharedResource]


class _Mps(_Strict):
    renameByDefault: bool = False
    resources: list[_SharedResource]


class _Sharing(_Strict):
    timeSlicing: _TimeSlicing | None = None
    mps: _Mps | None = None


class _PluginFlags(_Strict):
    deviceListStrategy: list[str] | str | None = None
    deviceIDStrategy: str | None = None


class _Flags(_Strict):
    migStrategy: str
    failOnInitError: bool | None = None
    plugin: _PluginFlags | None = None


class DevicePluginConfigFile(_Strict):
    """The subset of k8s-device-plugin's config v1 that gpushare writes; unknown keys are errors."""

    version: str
    flags: _Flags
    sharing: _Sharing | None = None


def parse_device_plugin(text: str) -> dict[str, Any]:
    data = yaml.safe_load(text)
    DevicePluginConfigFile.model_validate(data)
    assert isinstance(data, dict)
    return data


def parse_mig_parted(text: str) -> dict[str, dict[str, dict[str, int]]]:
    """mig-parted config -> config name -> GPU model (NVML name) -> layout; all-disabled maps to {}."""
    catalog = load_catalog()
    data = yaml.safe_load(text)
    if data.get("version") != "v1":
        raise ValueError("mig-parted config must be version v1")
    out: dict[str, dict[str, dict[str, int]]] = {}
    for name, entries in data["mig-configs"].items():
        per_model: dict[str, dict[str, int]] = {}
        for entry in entries:
            if not entry.get("mig-enabled"):
                continue
            filters = entry["device-filter"]
            models = {catalog.lookup(f).name for f in ([filters] if isinstance(filters, str) else filters)}
            for model in models:
                per_model[model] = dict(entry["mig-devices"])
        out[name] = per_model
    return out


def parse_toolkit(text: str) -> ToolkitSettings:
    data = tomllib.loads(text)
    rt = data["nvidia-container-runtime"]
    return ToolkitSettings(
        accept_envvar_when_unprivileged=data["accept-nvidia-visible-devices-envvar-when-unprivileged"],
        accept_volume_mounts=data["accept-nvidia-visible-devices-as-volume-mounts"],
        mode=rt["mode"],
        driver_capabilities=data["supported-driver-capabilities"],
        ldconfig=data["nvidia-container-cli"]["ldconfig"],
        runtimes=tuple(rt["runtimes"]),
        cdi_annotation_prefixes=tuple(rt["modes"]["cdi"]["annotation-prefixes"]),
        cdi_spec_dirs=tuple(rt["modes"]["cdi"]["spec-dirs"]),
    )


def parse_containerd_runtime(text: str, containerd: str) -> ContainerdRuntime:
    data = tomllib.loads(text)
    (plugin, table), = data["plugins"].items()
    nvidia = table["containerd"]["runtimes"]["nvidia"]
    return ContainerdRuntime(
        containerd=containerd, config_version=data["version"], cri_plugin=plugin,
        default_runtime=table["containerd"].get("default_runtime_name") == "nvidia",
        binary=nvidia["options"]["BinaryName"], systemd_cgroup=nvidia["options"]["SystemdCgroup"],
    )


def settings_dict(settings: ToolkitSettings | ContainerdRuntime) -> dict[str, Any]:
    return asdict(settings)
