#!/usr/bin/python
"""Ansible module: the host's NVIDIA GPUs through NVML (pynvml), read-only."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpushare.fleet.plugins.module_utils.nvml import gpu_instances, mig_mode, text
from ansible_collections.gpushare.fleet.plugins.module_utils.state import this_host

DOCUMENTATION = r"""
module: gpu_facts
author: gpushare maintainers (@gpushare)
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

EXAMPLES = r"""
- name: Read the GPUs, failing where the environment says this host has 8 and NVML reports none
  gpushare.fleet.gpu_facts:
    expected_gpus: 8
    supported_platforms: [debian]

- name: Every GPU in MIG mode, as the fact gpu_facts tells it
  ansible.builtin.debug:
    msg: "{{ gpu_facts.gpus | map(attribute='mig.current') | list }}"

- name: Before a MIG change, after the GPU clients were stopped, fail while any GPU still runs a process
  gpushare.fleet.gpu_facts:
    expected_gpus: 8
    fail_on_processes: true

- name: A host whose NVML bindings may be missing yet (the role installs them and reads again)
  gpushare.fleet.gpu_facts:
    expected_gpus: 4
    wait_for_bindings: true
  register: first_read
"""

RETURN = r"""
gpu_facts:
  description: >-
    C(nvml) (bool), C(bindings) (pynvml importable), C(reason), C(driver_version), C(driver_branch),
    C(cuda_driver_version), C(gpus), C(platform) (C(id), C(version_id), C(id_like) from /etc/os-release).
  returned: always
  type: dict
"""

ARGUMENT_SPEC = {
    "expected_gpus": {"type": "int", "default": 0},
    "wait_for_bindings": {"type": "bool", "default": False},
    "fail_on_processes": {"type": "bool", "default": False},
    "supported_platforms": {"type": "list", "elements": "str", "default": []},
}

# MIG mode and GPU instances come from module_utils.nvml, the reader gpushare's `discover` uses too.


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
    mig = mig_mode(nvml, handle)
    pci = int(nvml.nvmlDeviceGetPciInfo(handle).pciDeviceId)
    return {
        "index": index,
        "name": text(nvml.nvmlDeviceGetName(handle)),
        "uuid": text(nvml.nvmlDeviceGetUUID(handle)),
        "pci_device_id": f"0x{pci:08X}",
        "memory_mib": int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // 2**20,
        "mig": mig,
        "gpu_instances": gpu_instances(nvml, handle) if mig["current"] == "enabled" else [],
        "processes": read_processes(nvml, handle),
    }


def read_host(nvml):
    driver = text(nvml.nvmlSystemGetDriverVersion())
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


class NvmlReadError(Exception):
    """NVML initialised but failed while the GPUs were read (a GPU lost from the bus, an unknown error)."""


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
    except pynvml.NVMLError as err:
        raise NvmlReadError(f"{type(err).__name__}: {err}") from None
    finally:
        pynvml.nvmlShutdown()


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        facts = dict(gather(), platform=read_platform())
    except NvmlReadError as err:
        module.fail_json(msg=f"host {this_host()}: NVML failed while reading the GPUs: {err}; nothing was changed "
                         "(fix: run nvidia-smi on the host; a GPU that fell off the bus needs a reset or a reboot)")
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
