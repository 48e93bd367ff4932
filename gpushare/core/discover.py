"""Read the NVIDIA GPUs of this host through NVML and match each to the catalog; read-only, sets nothing."""

from __future__ import annotations

import ctypes
from typing import Any

from gpushare.core.catalog import GpuModel, load_catalog, normalise_pci_id
from gpushare.core.errors import GpushareError, Problem

NVML_DEVICE_MIG_ENABLE = 1  # nvml.h: the value nvmlDeviceGetMigMode reports for "enabled"


_NO_DRIVER_FIX = ("run discover on a GPU host with the NVIDIA driver loaded (`nvidia-smi` answers); CI machines "
                  "without a GPU cannot discover")


def discover() -> dict[str, Any]:
    """One report for the host: driver, CUDA driver version, and per GPU its identity, MIG state and model.

    No driver (NVML library absent or failing to initialise) -> GpushareError with exit code 3.
    """
    try:
        import pynvml
    except ImportError as err:
        raise GpushareError(Problem(
            f"no NVIDIA driver: the NVML bindings cannot be imported ({err})", fix=_NO_DRIVER_FIX), exit_code=3
        ) from err
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError) as err:
        raise GpushareError(Problem(f"no NVIDIA driver: NVML did not initialise ({err})", fix=_NO_DRIVER_FIX),
                            exit_code=3) from err
    try:
        return _read_host(pynvml)
    except pynvml.NVMLError as err:
        raise GpushareError(Problem(f"NVML failed while reading the GPUs: {err}",
                                    fix="check `nvidia-smi` on this host; a GPU that fell off the bus needs a reset"),
                            exit_code=3) from err
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py releases return bytes.
    return value.decode() if isinstance(value, bytes) else value


def cuda_version_text(version: int) -> str:
    """NVML's 12040 -> "12.4"."""
    return f"{version // 1000}.{version % 1000 // 10}"


def match_model(name: str, pci_device_id: str) -> tuple[GpuModel | None, str | None]:
    """The catalog model by NVML name, then by PCI id; None with the reason when neither is known."""
    catalog = load_catalog()
    model = catalog.find(name) or catalog.find(pci_device_id)
    if model is None:
        return None, f"neither the NVML name {name!r} nor the PCI id {pci_device_id} is in gpushare's catalog"
    return model, None


def _read_host(nvml: Any) -> dict[str, Any]:
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    gpus = [_read_gpu(nvml, index) for index in range(nvml.nvmlDeviceGetCount())]
    return {
        "ok": True,
        "driver_version": driver,
        "driver_branch": int(driver.split(".")[0]) if driver.split(".")[0].isdigit() else None,
        "cuda_driver_version": cuda_version_text(nvml.nvmlSystemGetCudaDriverVersion()),
        "gpus": gpus,
    }


def _read_gpu(nvml: Any, index: int) -> dict[str, Any]:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    name = _text(nvml.nvmlDeviceGetName(handle))
    pci_device_id = normalise_pci_id(int(nvml.nvmlDeviceGetPciInfo(handle).pciDeviceId))
    model, reason = match_model(name, pci_device_id)
    mig: dict[str, Any]
    try:
        current, pending = nvml.nvmlDeviceGetMigMode(handle)
        mig = {
            "capable": True,
            "current": "enabled" if current == NVML_DEVICE_MIG_ENABLE else "disabled",
            "pending": "enabled" if pending == NVML_DEVICE_MIG_ENABLE else "disabled",
        }
    except nvml.NVMLError_NotSupported:
        mig = {"capable": False, "current": None, "pending": None}
    instances = _gpu_instances(nvml, handle, model) if mig["current"] == "enabled" else []
    return {
        "index": index,
        "name": name,
        "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
        "pci_device_id": pci_device_id,
        "memory_mib": int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // 2**20,
        "mig": mig,
        "catalog_model": model.name if model else None,
        "catalog_reason": reason,
        "mig_instances": instances,
    }


def _gpu_instances(nvml: Any, handle: Any, model: GpuModel | None) -> list[dict[str, Any]]:
    names = {p.id: p.name for p in model.profiles.values()} if model else {}
    found = []
    for profile_index in range(int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0))):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_index, 1)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
            continue  # this GPU has no profile at that index
        if not info.instanceCount:
            continue
        handles = (nvml.c_nvmlGpuInstance_t * info.instanceCount)()
        count = ctypes.c_uint(0)
        nvml.nvmlDeviceGetGpuInstances(handle, info.id, handles, ctypes.byref(count))
        for i in range(count.value):
            gi = nvml.nvmlGpuInstanceGetInfo(handles[i])
            found.append(
                {
                    "gpu_instance_id": int(gi.id),
                    "profile_id": int(gi.profileId),
                    "profile": names.get(int(gi.profileId), f"profile id {gi.profileId}"),
                    "start": int(gi.placement.start),
                    "size": int(gi.placement.size),
                }
            )
    return sorted(found, key=lambda instance: instance["start"])
