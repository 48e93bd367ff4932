"""The MIG state of a GPU read through NVML, in one place: the collection's gpu_facts module (on hosts, which have no
gpushare) and gpushare's `discover` (gpushare.core.discover imports it from the collection inside its package). It
imports nothing beyond Python's own library; `nvml` is the NVML bindings module (pynvml: nvidia-ml-py, or bindings
that answer as it does), passed in.

NVML's answers, as a real NVIDIA H200 on driver 580.159.04 gave them (tests/data/nvidia/h200-580.159.04/capture/
nvml_dump.json): a GPU-instance profile index the GPU does not have is NVMLError_NotSupported, an index past the last
one the driver knows is NVMLError_InvalidArgument (the bindings' NVML_GPU_INSTANCE_PROFILE_COUNT can be larger than
the driver's); a GPU without MIG answers its MIG mode with NVMLError_NotSupported, a driver from before MIG with
NVMLError_FunctionNotFound. Those mean "none here" and are read as such; any other NVMLError (a GPU lost from the bus,
an unknown error) is raised to the caller, which says so rather than report a GPU without instances."""

from __future__ import annotations

import ctypes
import re

NVML_DEVICE_MIG_ENABLE = 1  # nvml.h: the value nvmlDeviceGetMigMode reports for "enabled"

_NO_SUCH_PROFILE = ("NVMLError_NotSupported", "NVMLError_InvalidArgument", "NVMLError_NotFound")
_NO_MIG = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound")
_GONE = ("NVMLError_NotFound",)  # an instance destroyed between listing and reading it (mig-parted at work)


def errors(nvml, names):
    """The bindings' error classes of these names; bindings without one never raise it (an empty tuple catches
    nothing)."""
    found = []
    for name in names:
        cls = getattr(nvml, name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    return tuple(found)


def text(value):
    """A name NVML returns: str, or bytes from older bindings."""
    return value.decode() if isinstance(value, bytes) else str(value)


def mig_mode(nvml, handle):
    """{capable, current, pending}: `enabled` or `disabled`, or not capable (None, None)."""
    try:
        current, pending = nvml.nvmlDeviceGetMigMode(handle)
    except errors(nvml, _NO_MIG):
        return {"capable": False, "current": None, "pending": None}
    return {"capable": True, "current": _mode(current), "pending": _mode(pending)}


def _mode(value):
    return "enabled" if value == NVML_DEVICE_MIG_ENABLE else "disabled"


def profile_info(nvml, handle, index):
    """The GPU-instance profile at NVML index `index` (id, instanceCount), in its version 1 form, which every MIG
    driver answers (version 2 needs nvmlDeviceGetGpuInstanceProfileInfoV, which older drivers lack); None where the
    GPU has no profile at that index."""
    try:
        try:
            return nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index, 1)
        except TypeError:  # bindings from before the version argument, whose only form is version 1
            return nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
    except errors(nvml, _NO_SUCH_PROFILE):
        return None


def profile_name(nvml, handle, index):
    """NVML's own name of a profile (`1g.10gb` of `MIG 1g.10gb`, profile info version 2), or None where the bindings
    or the driver do not give it: the name is for people, the profile id identifies the profile."""
    getter = getattr(nvml, "nvmlDeviceGetGpuInstanceProfileInfoV", None)
    if getter is None:
        return None
    try:
        named = getter(handle, index)
    except errors(nvml, ("NVMLError",)):
        return None
    name = text(getattr(named, "name", "") or "")
    return re.sub(r"^MIG\s+", "", name) or None


def gpu_instances(nvml, handle):
    """The GPU instances of a GPU in MIG mode, by start: id, profile_id, profile (NVML's name, or None), start and
    size (memory slices)."""
    found = []
    gone = errors(nvml, _GONE)
    for index in range(int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0))):
        info = profile_info(nvml, handle, index)
        if info is None or not info.instanceCount:
            continue
        handles = (nvml.c_nvmlGpuInstance_t * info.instanceCount)()
        count = ctypes.c_uint(0)
        nvml.nvmlDeviceGetGpuInstances(handle, info.id, handles, ctypes.byref(count))
        name = profile_name(nvml, handle, index) if count.value else None
        for i in range(count.value):
            try:
                gi = nvml.nvmlGpuInstanceGetInfo(handles[i])
            except gone:
                continue
            found.append({"id": int(gi.id), "profile_id": int(gi.profileId), "profile": name,
                          "start": int(gi.placement.start), "size": int(gi.placement.size)})
    return sorted(found, key=lambda item: item["start"])
