#!/usr/bin/env python3
"""Check a real NVIDIA GPU against gpushare's catalog, read-only: run it as root on a machine with a GPU.

It runs `gpushare discover --json`, then asks NVML, for every GPU-instance profile index, for the profile's
info (nvmlDeviceGetGpuInstanceProfileInfo, v1; it answers with MIG off too, which mig-parted's generate-config
relies on) and its possible placements (nvmlDeviceGetGpuInstancePossiblePlacements; may be refused with MIG
off, then the placements stay unconfirmed), and compares ids, slice counts, max counts, memory and placements
with the catalog entry (memory: any value a driver is known to report, memory_gib or memory_gib_other_drivers).
With `--full --env ENV` it also runs NVIDIA's own programs (gpu_check_full.py beside this script: mig-parted's
generate-config and assert, the device plugin with a kubelet stand-in) against ENV's rendered files and plan.
Prints one JSON report; exit 0, 1 when something disagrees, 2 on bad usage, 3 when there is no NVIDIA driver.

It only reads: it never enables MIG, creates or destroys instances, changes clocks or resets anything.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpushare.core.catalog import GpuModel, MigProfile, load_catalog, normalise_pci_id
from gpushare.core.discover import match_model
from gpushare.core.paths import environment_path

# The -lgip GiB column is MiB / 1024 printed with two decimals.
MEMORY_TOLERANCE_GIB = 0.01


def profile_info(nvml: Any, handle: Any, index: int) -> Any | None:
    """The v1 profile info at an NVML_GPU_INSTANCE_PROFILE_* index; None when this GPU has no such profile."""
    try:
        return nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index, 1)
    except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
        return None


def possible_placements(nvml: Any, handle: Any, profile_id: int) -> tuple[list[tuple[int, int]] | None, str]:
    """(start, size) pairs NVML allows, or None and the reason when it will not say (often: MIG mode off)."""
    count = ctypes.c_uint(0)
    try:
        # A NULL array asks for the number of placements first, as NVML documents.
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
        placements = (nvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, placements, ctypes.byref(count))
    except nvml.NVMLError as err:
        return None, f"NVML would not list placements: {err}"
    return [(int(placements[i].start), int(placements[i].size)) for i in range(count.value)], ""


def compare_gpu(nvml: Any, handle: Any, model: GpuModel, driver_branch: int | None) -> dict[str, list[dict]]:
    """Each catalog fact this GPU confirms, contradicts, or cannot tell, per profile and field."""
    confirmed: list[dict] = []
    mismatches: list[dict] = []
    unconfirmed: list[dict] = []
    by_index = {p.nvml_profile_index: p for p in model.profiles.values() if p.nvml_profile_index is not None}
    by_id = {p.id: p for p in model.profiles.values()}

    def compare(profile: MigProfile, field: str, catalog: Any, actual: Any) -> None:
        entry = {"profile": profile.name, "field": field}
        if catalog == actual:
            confirmed.append({**entry, "value": actual})
        else:
            mismatches.append({**entry, "catalog": catalog, "nvml": actual})

    for index in range(int(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT)):
        expected = by_index.get(index)
        info = profile_info(nvml, handle, index)
        if info is None:
            if expected is None:
                continue
            needs = expected.min_driver_branch
            if needs is not None and (driver_branch is None or driver_branch < needs):
                reason = f"NVML has no profile at index {index}; the catalog says it needs driver R{needs}"
                unconfirmed.append({"profile": expected.name, "field": "present", "reason": reason})
            else:
                mismatches.append(
                    {"profile": expected.name, "field": "present", "catalog": True, "nvml": False}
                )
            continue
        if expected is None:
            known = by_id.get(int(info.id))
            mismatches.append(
                {
                    "profile": known.name if known else f"profile id {info.id}",
                    "field": "nvml_profile_index",
                    "catalog": known.nvml_profile_index if known else None,
                    "nvml": index,
                }
            )
            continue
        compare(expected, "id", expected.id, int(info.id))
        compare(expected, "compute_slices", expected.compute_slices, int(info.sliceCount))
        compare(expected, "max_count", expected.max_count, int(info.instanceCount))
        memory = round(int(info.memorySizeMB) / 1024, 3)
        if expected.memory_gib is None:
            unconfirmed.append(
                {
                    "profile": expected.name,
                    "field": "memory_gib",
                    "reason": f"catalog has none; NVML: {memory}",
                }
            )
        elif any(abs(memory - gib) <= MEMORY_TOLERANCE_GIB for gib in expected.memory_gib_values):
            confirmed.append({"profile": expected.name, "field": "memory_gib", "value": memory})
        else:
            mismatches.append(
                {
                    "profile": expected.name,
                    "field": "memory_gib",
                    "catalog": expected.memory_gib,
                    "nvml": memory,
                }
            )
        placements, reason = possible_placements(nvml, handle, int(info.id))
        if placements is None:
            unconfirmed.append({"profile": expected.name, "field": "placements", "reason": reason})
            continue
        compare(expected, "placements", list(expected.placements), sorted(start for start, _ in placements))
        sizes = sorted({size for _, size in placements})
        compare(expected, "memory_slices", [expected.memory_slices], sizes)
    return {"confirmed": confirmed, "mismatches": mismatches, "unconfirmed": unconfirmed}


def discover_report() -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "gpushare", "discover", "--json"], capture_output=True, text=True, check=False
    )
    try:
        report: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        report = {"ok": False, "errors": [done.stderr.strip() or f"exit {done.returncode}, no JSON"]}
    report["exit_code"] = done.returncode
    return report


def check_gpu(nvml: Any, index: int, driver: str) -> dict[str, Any]:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    name = nvml.nvmlDeviceGetName(handle)
    name = name.decode() if isinstance(name, bytes) else name
    pci = normalise_pci_id(int(nvml.nvmlDeviceGetPciInfo(handle).pciDeviceId))
    report: dict[str, Any] = {
        "gpu": {"index": index, "name": name, "pci_device_id": pci, "driver_version": driver},
        "catalog_model": None,
        "confirmed": [],
        "mismatches": [],
        "unconfirmed": [],
    }
    model, reason = match_model(name, pci)
    if model is None:
        report["reason"] = reason
    elif not model.mig_capable:
        report["catalog_model"] = model.name
        report["reason"] = "no MIG on this model: nothing to compare"
    else:
        branch = driver.split(".")[0]
        report["catalog_model"] = model.name
        report.update(compare_gpu(nvml, handle, model, int(branch) if branch.isdigit() else None))
    return report


def full_checks(args: argparse.Namespace, discovered: dict[str, Any], gpus: list[dict[str, Any]],
                driver: str) -> dict[str, Any]:
    """--full: NVIDIA's own programs against the environment's rendered files and plan (gpu_check_full.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gpu_check_full as full

    models = {g["catalog_model"] for g in gpus}
    if len(models) != 1 or None in models:
        return {"ok": False, "error": f"--full needs one known GPU model here, found {sorted(map(str, models))}"}
    tools = full.find_tools(os.environ.get("GPUSHARE_NVIDIA_TOOLS"))
    if isinstance(tools, str):
        return {"ok": False, "error": tools}
    env = Path(args.env) if Path(args.env).is_file() else environment_path(args.env)
    branch = driver.split(".")[0]
    mig_disabled = all((g.get("mig") or {}).get("current") == "disabled" for g in discovered.get("gpus") or [])
    plugin_args = ["--driver-root", args.driver_root, "--dev-root", args.driver_root]
    report = full.full_report(env, load_catalog().models[models.pop()], len(gpus),
                              int(branch) if branch.isdigit() else None, mig_disabled, tools, plugin_args)
    return {"ok": not full.has_mismatches(report), **report}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Compare a real NVIDIA GPU with gpushare's catalog, read-only.")
    parser.add_argument("--full", action="store_true",
                        help="also run NVIDIA's mig-parted and device plugin against --env's rendered files")
    parser.add_argument("--env", help="the environment (name or file) whose rendered files and plan --full checks")
    parser.add_argument("--driver-root", default="/", help="where this host keeps the driver (the plugin's flag)")
    args = parser.parse_args(argv)
    if args.full and not args.env:
        parser.error("--full needs --env: the environment whose rendered files and plan are compared")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as err:  # ImportError, or NVMLError/OSError when the driver is absent
        print(json.dumps({"ok": False, "error": f"no NVIDIA driver: {err}"}))
        return 3
    if os.geteuid() != 0:
        print("gpu_check: not root; NVML may hide some profile information", file=sys.stderr)
    try:
        discovered = discover_report()
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        gpus = [check_gpu(pynvml, index, driver) for index in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()
    report: dict[str, Any] = {"discover": discovered, "gpus": gpus}
    if args.full:
        report["full"] = full_checks(args, discovered, gpus, driver)
    ok = not any(g["mismatches"] for g in gpus) and (report.get("full") or {}).get("ok", True)
    print(json.dumps({"ok": ok, **report}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
