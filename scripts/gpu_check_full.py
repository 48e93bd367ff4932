"""`gpu_check.py --full`: NVIDIA's own programs on a GPU host, compared with gpushare's catalog and plan, read-only.

- `nvidia-mig-parted generate-config` (reads NVML's profile table): its `all-balanced` against gpushare's
  `balanced`, its per-profile `all-<profile>` configs against the catalog's profiles and max counts;
- every config of the environment's rendered mig-parted file: `assert --valid-config` (parse and select), then a
  plain `assert` (compares with the GPU's current state; with MIG disabled `all-disabled` must hold);
- NVIDIA's device plugin started on each non-MIG, non-MPS device-plugin config rendered for this GPU model, with
  the kubelet stand-in listening in /var/lib/kubelet/device-plugins (where the plugin always puts its sockets);
  what it advertises against what the plan predicts for this machine's GPUs.

Never changes MIG mode, never starts an MPS daemon (MPS configs are skipped), never resets anything, and refuses
to start the device plugin where a kubelet socket already exists (a real node).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpushare.core.catalog import GpuModel
from gpushare.core.resolve import MIG_DISABLED, ResolvedFleet, generic_layout, resolve
from gpushare.render.fleet import render_fleet

PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
VALID = "Selected MIG configuration is valid"
NOT_APPLIED = "selected configuration not currently applied"


@dataclass(frozen=True)
class Tools:
    mig_parted: str
    device_plugin: str
    standin: str | None


@dataclass(frozen=True)
class Done:
    rc: int | None  # None: timed out
    out: str


# A runner takes argv and a timeout; tests pass a fake built from a real capture.
Runner = Callable[[list[str], float], Done]


def run(argv: list[str], timeout: float) -> Done:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Done(None, "")
    return Done(done.returncode, done.stdout + done.stderr)


def find_tools(folder: str | None) -> Tools | str:
    """NVIDIA's programs from `folder` (or its bin/), else PATH; a sentence saying what is missing otherwise."""
    def find(name: str) -> str | None:
        for candidate in ([Path(folder) / name, Path(folder) / "bin" / name] if folder else []):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
        return shutil.which(name)

    mig_parted, device_plugin = find("nvidia-mig-parted"), find("nvidia-device-plugin")
    if not mig_parted or not device_plugin:
        return "nvidia-mig-parted and nvidia-device-plugin are needed on PATH or in $GPUSHARE_NVIDIA_TOOLS"
    standin = Path(folder) / "kubelet-standin" / "standin.py" if folder else None
    return Tools(mig_parted, device_plugin, str(standin) if standin and standin.is_file() else None)


# ---------------------------------------------------------------- pure comparisons


def generated_layouts(generated: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """generate-config's configs by name -> mig-devices (it writes one entry per config for a single GPU model)."""
    return {name: dict(entries[0].get("mig-devices") or {}) for name, entries in generated["mig-configs"].items()}


def compare_generated(generated: Mapping[str, Any], model: GpuModel, driver_branch: int | None) -> dict[str, list]:
    layouts = generated_layouts(generated)
    confirmed: list[dict] = []
    mismatches: list[dict] = []

    def compare(what: str, gpushare: Any, nvidia: Any) -> None:
        if gpushare == nvidia:
            confirmed.append({"field": what, "value": nvidia})
        else:
            mismatches.append({"field": what, "gpushare": gpushare, "nvidia": nvidia})

    compare("all-balanced", generic_layout(model, "balanced"), layouts.get("all-balanced"))
    single = {p: n for name, layout in layouts.items() if name.startswith("all-") and len(layout) == 1
              for p, n in layout.items()}
    usable = {p.name: p.max_count for p in model.profiles.values()
              if p.min_driver_branch is None or (driver_branch or 0) >= p.min_driver_branch}
    compare("profiles", sorted(usable), sorted(single))
    for name in sorted(set(usable) & set(single)):
        compare(f"all-{name} count", usable[name], single[name])
    return {"confirmed": confirmed, "mismatches": mismatches}


def plugin_targets(fleet: ResolvedFleet, model: GpuModel) -> dict[str, dict[str, int]]:
    """Non-MIG, non-MPS device-plugin configs rendered for this model -> what the plan says one GPU advertises."""
    targets: dict[str, dict[str, int]] = {}
    for node in fleet.nodes:
        if node.gpu_model.name != model.name or node.mig_layout is not None or node.device_plugin_config is None:
            continue
        if node.sharing == "mps":
            continue
        per_gpu = {resource: count // node.gpus_per_node for resource, count in node.advertised.items()}
        targets.setdefault(node.device_plugin_config, per_gpu)
    return targets


def advertised_counts(standin: Mapping[str, Any]) -> dict[str, int]:
    return {name: len(entry.get("devices") or []) for name, entry in (standin.get("resources") or {}).items()}


# ---------------------------------------------------------------- NVIDIA's programs


def check_generated(tools: Tools, model: GpuModel, driver_branch: int | None, runner: Runner) -> dict[str, Any]:
    done = runner([tools.mig_parted, "generate-config"], 60)
    try:
        generated = yaml.safe_load(done.out) if done.rc == 0 else None
    except yaml.YAMLError:
        generated = None
    if not isinstance(generated, dict):
        return {"confirmed": [], "mismatches": [{"field": "generate-config", "error": done.out[-2000:]}]}
    return compare_generated(generated, model, driver_branch)


def check_configs(tools: Tools, config: Path, mig_disabled: bool, runner: Runner) -> dict[str, Any]:
    names = list(yaml.safe_load(config.read_text())["mig-configs"])
    results, mismatches = [], []
    for name in names:
        valid = runner([tools.mig_parted, "assert", "--valid-config", "-f", str(config), "-c", name], 30)
        applied = runner([tools.mig_parted, "assert", "-f", str(config), "-c", name], 30)
        entry = {"config": name, "valid": valid.rc == 0 and VALID in valid.out, "applied": applied.rc == 0}
        results.append(entry)
        if not entry["valid"]:
            mismatches.append({**entry, "output": valid.out[-1000:]})
        elif applied.rc != 0 and NOT_APPLIED not in applied.out:
            mismatches.append({**entry, "output": applied.out[-1000:]})
        elif name == MIG_DISABLED and mig_disabled and not entry["applied"]:
            mismatches.append({**entry, "reason": "MIG is disabled, so all-disabled must hold"})
    return {"configs": results, "mismatches": mismatches}


def advertise(tools: Tools, config: Path, extra: list[str]) -> dict[str, Any]:
    """Start the stand-in, then the plugin on `config`; what the plugin advertised, as the stand-in saw it."""
    assert tools.standin is not None
    PLUGIN_DIR.mkdir(parents=True, exist_ok=True)
    standin = subprocess.Popen([sys.executable, tools.standin, "--dir", str(PLUGIN_DIR), "--seconds", "30",
                                "--expect", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)  # the stand-in's socket must exist before the plugin registers
    plugin = subprocess.Popen([tools.device_plugin, "--config-file", str(config), "--kubelet-socket",
                               str(PLUGIN_DIR / "kubelet.sock"), *extra],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = standin.communicate(timeout=40)
    finally:
        plugin.terminate()
        log, _ = plugin.communicate(timeout=15)
    try:
        report: dict[str, Any] = json.loads(out)
    except json.JSONDecodeError:
        report = {}
    report["plugin_log"] = log[-3000:]
    return report


def check_plugin(tools: Tools, fleet: ResolvedFleet, files: Mapping[str, str], model: GpuModel, gpus: int,
                 extra: list[str], start: Callable[[Tools, Path, list[str]], dict[str, Any]]) -> dict[str, Any]:
    targets = plugin_targets(fleet, model)
    if tools.standin is None:
        return {"skipped": "no kubelet stand-in (kubelet-standin/standin.py under $GPUSHARE_NVIDIA_TOOLS)",
                "mismatches": []}
    if (PLUGIN_DIR / "kubelet.sock").exists():
        return {"skipped": f"a kubelet socket exists in {PLUGIN_DIR}: this is a live node; the plugin is not "
                           "started here", "mismatches": []}
    results, mismatches = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name, per_gpu in sorted(targets.items()):
            config = Path(tmp) / f"{name}.yaml"
            config.write_text(files[f"device-plugin/{name}.yaml"])
            seen = advertised_counts(start(tools, config, extra))
            expected = {resource: count * gpus for resource, count in per_gpu.items()}
            results.append({"config": name, "plan": expected, "advertised": seen})
            if seen != expected:
                mismatches.append(results[-1])
    return {"configs": results, "mismatches": mismatches}


def full_report(env_file: Path, model: GpuModel, gpus: int, driver_branch: int | None, mig_disabled: bool,
                tools: Tools, plugin_args: list[str], runner: Runner = run,
                start: Callable[[Tools, Path, list[str]], dict[str, Any]] = advertise) -> dict[str, Any]:
    fleet = resolve(env_file)
    files = render_fleet(fleet).files
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "mig-parted.yaml"
        config.write_text(files["mig-parted/config.yaml"])
        configs = check_configs(tools, config, mig_disabled, runner)
    return {
        "environment": str(env_file),
        "generate_config": check_generated(tools, model, driver_branch, runner),
        "mig_parted_assert": configs,
        "device_plugin": check_plugin(tools, fleet, files, model, gpus, plugin_args, start),
    }


def has_mismatches(report: Mapping[str, Any]) -> bool:
    return any(part.get("mismatches") for part in report.values() if isinstance(part, dict))
