"""Read the NVIDIA GPUs of this host through NVML and match each to the catalog; read-only, sets nothing.

MIG mode and GPU instances are read by the Ansible collection's NVML reader (plugins/module_utils/nvml.py, which its
gpu_facts module runs on hosts without gpushare): one reading of NVML's answers and errors for both."""

from __future__ import annotations

from typing import Any

from gpushare.ansible_collections.gpushare.fleet.plugins.module_utils import nvml as nvml_read
from gpushare.core.catalog import GpuModel, load_catalog, normalise_pci_id
from gpushare.core.errors import GpushareError, Problem

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
    mig: dict[str, Any] = nvml_read.mig_mode(nvml, handle)
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
    """The GPU instances by start, each profile named as the catalog names it (else as NVML does)."""
    names = {p.id: p.name for p in model.profiles.values()} if model else {}
    return [
        {
            "gpu_instance_id": gi["id"],
            "profile_id": gi["profile_id"],
            "profile": names.get(gi["profile_id"]) or gi["profile"] or f"profile id {gi['profile_id']}",
            "start": gi["start"],
            "size": gi["size"],
        }
        for gi in nvml_read.gpu_instances(nvml, handle)
    ]
