#!/usr/bin/python
"""Ansible module: the host's NVIDIA GPUs through NVML (pynvml), read-only."""

from __future__ import annotations

import ctypes
import re

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: gpu_facts
short_description: Report the host's NVIDIA GPUs through NVML
description:
  - Reads every GPU through the NVML Python bindings (C(pynvml)), for model, UUID, PCI device id, memory, driver and
    CUDA driver version, MIG capability, current and pending MIG mode, GPU instances and running processes.
  - Changes nothing. Sets the fact C(gpu_facts).
  - A host without NVML (no bindings, or no driver) reports no GPUs and the reason; the module fails only when
    O(expected_gpus) says the host has GPUs.
options:
  expected_gpus:
    description: GPUs the environment says this host has; 0 when it has none.
    type: int
    default: 0
  wait_for_bindings:
    description: Do not fail for O(expected_gpus) where only the NVML Python bindings are missing (the caller
      installs them and reads again); a host whose bindings load but whose NVML does not still fails.
    type: bool
    default: false
  fail_on_processes:
    description: Fail when any GPU runs a process (compute or graphics), naming their PIDs and names; used after GPU
      clients were stopped, before a MIG change.
    type: bool
    default: false
  supported_platforms:
    description: Fail unless the host's C(ID) or one of its C(ID_LIKE) (/etc/os-release) is in this list; empty
      checks nothing.
    type: list
    elements: str
    default: []
"""

RETURN = r"""
gpu_facts:
  description: >-
    C(nvml) (bool), C(bindings) (pynvml importable), C(reason), C(driver_version), C(driver_branch),
    C(cuda_driver_version), C(gpus), C(platform) (C(id), C(version_id), C(id_like) from /etc/os-release).
  returned: always
  type: dict
"""


NVML_DEVICE_MIG_ENABLE = 1


def _text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def _mode(value):
    return "enabled" if value == NVML_DEVICE_MIG_ENABLE else "disabled"


def _profile_name(nvml, handle, index, info):
    """`1g.10gb` from NVML's `MIG 1g.10gb` where the bindings give names (profile info v2 and later)."""
    getter = getattr(nvml, "nvmlDeviceGetGpuInstanceProfileInfoV", None)
    if getter is None:
        return None
    try:
        named = getter(handle, index)
    except Exception:  # noqa: BLE001 - older drivers lack the versioned call; the id still identifies the profile
        return None
    name = _text(getattr(named, "name", "") or "")
    return re.sub(r"^MIG\s+", "", name) or None


def read_instances(nvml, handle):
    found = []
    for index in range(int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0))):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
        except nvml.NVMLError:
            continue  # no profile at that index on this GPU
        if not info.instanceCount:
            continue
        handles = (nvml.c_nvmlGpuInstance_t * info.instanceCount)()
        count = ctypes.c_uint(0)
        nvml.nvmlDeviceGetGpuInstances(handle, info.id, handles, ctypes.byref(count))
        name = _profile_name(nvml, handle, index, info) if count.value else None
        for i in range(count.value):
            gi = nvml.nvmlGpuInstanceGetInfo(handles[i])
            found.append({"id": int(gi.id), "profile_id": int(gi.profileId), "profile": name,
                          "start": int(gi.placement.start), "size": int(gi.placement.size)})
    return sorted(found, key=lambda item: item["start"])


def _process_name(pid):
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return None


def read_processes(nvml, handle):
    seen = {}
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            procs = getattr(nvml, getter)(handle)
        except nvml.NVMLError:
            continue
        for proc in procs:
            used = getattr(proc, "usedGpuMemory", None)
            seen[int(proc.pid)] = {"pid": int(proc.pid), "name": _process_name(int(proc.pid)),
                                   "used_memory_mib": int(used) // 2**20 if isinstance(used, int) else None}
    return [seen[pid] for pid in sorted(seen)]


def read_gpu(nvml, index):
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    try:
        current, pending = nvml.nvmlDeviceGetMigMode(handle)
        mig = {"capable": True, "current": _mode(current), "pending": _mode(pending)}
    except nvml.NVMLError_NotSupported:
        mig = {"capable": False, "current": None, "pending": None}
    pci = int(nvml.nvmlDeviceGetPciInfo(handle).pciDeviceId)
    return {
        "index": index,
        "name": _text(nvml.nvmlDeviceGetName(handle)),
        "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
        "pci_device_id": f"0x{pci:08X}",
        "memory_mib": int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // 2**20,
        "mig": mig,
        "gpu_instances": read_instances(nvml, handle) if mig["current"] == "enabled" else [],
        "processes": read_processes(nvml, handle),
    }


def read_host(nvml):
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
    major = driver.split(".")[0]
    return {
        "nvml": True,
        "reason": None,
        "driver_version": driver,
        "driver_branch": int(major) if major.isdigit() else None,
        "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}",
        "gpus": [read_gpu(nvml, i) for i in range(nvml.nvmlDeviceGetCount())],
    }


def no_gpus(reason, bindings):
    return {"nvml": False, "bindings": bindings, "reason": reason, "driver_version": None, "driver_branch": None,
            "cuda_driver_version": None, "gpus": []}


def read_platform(path="/etc/os-release"):
    """ID, VERSION_ID and ID_LIKE of the host, so callers need no separate fact gathering."""
    found = {}
    try:
        with open(path) as handle:
            for line in handle:
                key, sep, value = line.strip().partition("=")
                if sep:
                    found[key] = value.strip().strip('"')
    except OSError:
        pass
    return {"id": found.get("ID", ""), "version_id": found.get("VERSION_ID", ""),
            "id_like": found.get("ID_LIKE", "").split()}


def gather():
    try:
        import pynvml
    except ImportError as err:
        return no_gpus(f"the NVML Python bindings (pynvml) cannot be imported: {err}", bindings=False)
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError) as err:
        return no_gpus(f"NVML did not initialise (no NVIDIA driver loaded?): {err}", bindings=True)
    try:
        return dict(read_host(pynvml), bindings=True)
    finally:
        pynvml.nvmlShutdown()


def main():
    module = AnsibleModule(argument_spec={"expected_gpus": {"type": "int", "default": 0},
                                          "wait_for_bindings": {"type": "bool", "default": False},
                                          "fail_on_processes": {"type": "bool", "default": False},
                                          "supported_platforms": {"type": "list", "elements": "str", "default": []}},
                           supports_check_mode=True)
    facts = dict(gather(), platform=read_platform())
    supported = module.params["supported_platforms"]
    platform = facts["platform"]
    if supported and not ({platform["id"], *platform["id_like"]} & set(supported)):
        module.fail_json(msg=f"gpushare's roles support {' and '.join(supported)}-like hosts (this is "
                         f"{platform['id'] or 'unknown'} {platform['version_id']})".rstrip(), gpu_facts=facts)
    expected = module.params["expected_gpus"]
    waiting = module.params["wait_for_bindings"] and not facts["bindings"]
    if expected > 0 and not facts["nvml"] and not waiting:
        module.fail_json(msg=f"the environment says this host has {expected} GPUs, but NVML reports none: "
                         f"{facts['reason']}", gpu_facts=facts)
    running = [proc for gpu in facts["gpus"] for proc in gpu["processes"]]
    if module.params["fail_on_processes"] and running:
        pids = ", ".join(str(pid) for pid in sorted({proc["pid"] for proc in running}))
        names = ", ".join(sorted({proc["name"] or "?" for proc in running}))
        module.fail_json(msg=f"GPU processes still run: PIDs {pids} ({names}); nothing on the GPUs was changed",
                         gpu_facts=facts)
    module.exit_json(changed=False, ansible_facts={"gpu_facts": facts}, gpu_facts=facts)


if __name__ == "__main__":
    main()
