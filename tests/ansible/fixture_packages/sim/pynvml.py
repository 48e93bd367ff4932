"""NVML simulator for gpushare's test hosts: the driver's NVML there, /usr/lib/gpusim/pynvml.py from the driver
fixture package; the bindings package python3-pynvml (pynvml_bindings.py) loads it, as nvidia-ml-py loads
libnvidia-ml.so, and the fixture tools import it from /usr/lib/gpusim directly. It implements the subset of
nvidia-ml-py's API that gpushare's gpu_facts module and the fixture tools (nvidia-mig-parted, nvidia-ctk,
nvidia-smi, dcgmi) call, over simulated GPUs:

- the hardware (model, count, whether a GPU reset is possible) comes from /etc/gpusim/hardware.json, written by
  the test fixture per host;
- the driver (version, CUDA version) from /usr/share/gpusim/driver.json, installed by the driver fixture package:
  without it nvmlInit fails the way it does without libnvidia-ml (NVML_ERROR_LIBRARY_NOT_FOUND);
- the MIG geometry (profile ids, NVML indices, slices, max counts, allowed starts) from
  /usr/share/gpusim/tables.json, generated from gpushare.core.catalog (gpushare/data/mig_profiles.yaml);
- the state (MIG mode current and pending, GPU instances) in /var/lib/gpusim/state.json. MIG mode survives a
  reboot and GPU instances do not, as on real GPUs: a new boot id applies the pending mode and clears instances;
- GPU processes are files in /run/gpusim/procs/<pid>.json (kind "compute" shows in the process list, kind
  "client" only holds the GPU, like a host engine); a file whose PID is gone does not count.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import time
import uuid
from contextlib import contextmanager

HARDWARE = os.environ.get("GPUSIM_HARDWARE", "/etc/gpusim/hardware.json")
DRIVER = os.environ.get("GPUSIM_DRIVER", "/usr/share/gpusim/driver.json")
TABLES = os.environ.get("GPUSIM_TABLES", "/usr/share/gpusim/tables.json")
STATE_DIR = os.environ.get("GPUSIM_STATE_DIR", "/var/lib/gpusim")
PROCS_DIR = os.environ.get("GPUSIM_PROCS_DIR", "/run/gpusim/procs")
BOOT_ID = os.environ.get("GPUSIM_BOOT_ID", "/proc/sys/kernel/random/boot_id")

NVML_SUCCESS = 0
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_GPU_INSTANCE_PROFILE_COUNT = 16

_MESSAGES = {
    1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported", 6: "Not Found",
    12: "NVML Shared Library Not Found", 19: "In use by another client", 23: "Insufficient Resources",
    999: "Unknown Error",
}


class NVMLError(Exception):
    value = 999

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, "Unknown Error")


class NVMLError_Uninitialized(NVMLError):  # noqa: N801 - nvidia-ml-py's names
    value = 1


class NVMLError_InvalidArgument(NVMLError):  # noqa: N801
    value = 2


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    value = 3


class NVMLError_NotFound(NVMLError):  # noqa: N801
    value = 6


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801
    value = 12


class NVMLError_InUse(NVMLError):  # noqa: N801
    value = 19


class NVMLError_InsufficientResources(NVMLError):  # noqa: N801
    value = 23


c_nvmlGpuInstance_t = ctypes.c_uint64  # noqa: N816 - nvidia-ml-py's name


class _Struct:
    def __init__(self, **fields):
        self.__dict__.update(fields)


class _Device:
    def __init__(self, index: int):
        self.index = index


_initialised = 0


def _read_json(path, default=None):
    try:
        with open(path) as handle:
            return json.load(handle)
    except FileNotFoundError:
        return default


def _hardware():
    hw = _read_json(HARDWARE, {"model": None, "count": 0})
    return hw


def _model():
    hw = _hardware()
    if not hw.get("model"):
        return None
    return _read_json(TABLES)["models"][hw["model"]]


def _boot_id() -> str:
    with open(BOOT_ID) as handle:
        return handle.read().strip()


@contextmanager
def _state(write: bool = False):
    """The persistent GPU state under a lock; a new boot applies pending MIG modes and drops instances."""
    os.makedirs(STATE_DIR, exist_ok=True)
    with open(os.path.join(STATE_DIR, ".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = os.path.join(STATE_DIR, "state.json")
        state = _read_json(path)
        count = int(_hardware().get("count", 0))
        boot = _boot_id()
        fresh = state is None or len(state.get("gpus", [])) != count
        if fresh:
            state = {"boot_id": boot, "gpus": [{"mig_current": 0, "mig_pending": 0, "instances": [], "next_gi": 1}
                                               for _ in range(count)], "diag_fail": {}}
        rebooted = state.get("boot_id") != boot
        if rebooted:
            state["boot_id"] = boot
            for gpu in state["gpus"]:
                gpu["mig_current"] = gpu["mig_pending"]
                gpu["instances"] = []
        yield state
        if write or fresh or rebooted:
            tmp = path + ".tmp"
            with open(tmp, "w") as handle:
                json.dump(state, handle, indent=1, sort_keys=True)
            os.replace(tmp, path)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[-1][:1] not in ("Z", "X")
    except OSError:
        return False


def _holders(index: int, kinds=("compute", "client")):
    found = []
    try:
        names = os.listdir(PROCS_DIR)
    except FileNotFoundError:
        return found
    for name in names:
        proc = _read_json(os.path.join(PROCS_DIR, name))
        if not proc or proc.get("kind") not in kinds or not _alive(int(proc["pid"])):
            continue
        gpus = proc.get("gpus", "all")
        if gpus == "all" or index in gpus:
            found.append(proc)
    return found


def _check(handle: _Device) -> int:
    if not _initialised:
        raise NVMLError_Uninitialized()
    if not isinstance(handle, _Device):
        raise NVMLError_InvalidArgument()
    return handle.index


def _uuid(kind: str, *parts) -> str:
    host = _hardware().get("host", "gpusim")
    return f"{kind}-{uuid.uuid5(uuid.NAMESPACE_URL, '/'.join(['gpusim', host, *map(str, parts)]))}"


# ---------------------------------------------------------------- system


def nvmlInit():  # noqa: N802 - nvidia-ml-py's names from here on
    global _initialised
    if _read_json(DRIVER) is None:
        raise NVMLError_LibraryNotFound()
    _initialised += 1


def nvmlShutdown():  # noqa: N802
    global _initialised
    if not _initialised:
        raise NVMLError_Uninitialized()
    _initialised -= 1


def nvmlSystemGetDriverVersion():  # noqa: N802
    if not _initialised:
        raise NVMLError_Uninitialized()
    return _read_json(DRIVER)["version"]


def nvmlSystemGetCudaDriverVersion():  # noqa: N802
    if not _initialised:
        raise NVMLError_Uninitialized()
    return int(_read_json(DRIVER)["cuda"])


def nvmlDeviceGetCount():  # noqa: N802
    if not _initialised:
        raise NVMLError_Uninitialized()
    return int(_hardware().get("count", 0))


def nvmlDeviceGetHandleByIndex(index):  # noqa: N802
    if not 0 <= index < nvmlDeviceGetCount():
        raise NVMLError_InvalidArgument()
    return _Device(index)


# ---------------------------------------------------------------- device identity


def nvmlDeviceGetName(handle):  # noqa: N802
    _check(handle)
    return _hardware()["model"]


def nvmlDeviceGetUUID(handle):  # noqa: N802
    return _uuid("GPU", _check(handle))


def nvmlDeviceGetPciInfo(handle):  # noqa: N802
    index = _check(handle)
    return _Struct(pciDeviceId=int(_model()["pci_device_id"], 16), busId=f"00000000:{0x18 + index:02X}:00.0",
                   domain=0, bus=0x18 + index, device=0)


def nvmlDeviceGetMemoryInfo(handle):  # noqa: N802
    _check(handle)
    total = int(_model()["memory_mib"]) * 2**20
    return _Struct(total=total, free=total, used=0)


def nvmlDeviceGetCudaComputeCapability(handle):  # noqa: N802
    _check(handle)
    return tuple(_model()["compute_capability"])


# ---------------------------------------------------------------- MIG mode


def nvmlDeviceGetMigMode(handle):  # noqa: N802
    index = _check(handle)
    if not _model()["mig_capable"]:
        raise NVMLError_NotSupported()
    with _state() as state:
        gpu = state["gpus"][index]
        return [gpu["mig_current"], gpu["mig_pending"]]


def nvmlDeviceSetMigMode(handle, mode):  # noqa: N802
    """Sets the pending mode; it becomes current at the next GPU reset or boot. Refused while the GPU is held."""
    index = _check(handle)
    if not _model()["mig_capable"]:
        raise NVMLError_NotSupported()
    if mode not in (NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE):
        raise NVMLError_InvalidArgument()
    if _holders(index):
        raise NVMLError_InUse()
    with _state(write=True) as state:
        state["gpus"][index]["mig_pending"] = mode
    return NVML_SUCCESS


def gpusim_reset(handle):
    """A GPU reset (nvidia-smi -r): applies the pending MIG mode. Not an NVML call; the fixture tools use it."""
    index = _check(handle)
    if not _hardware().get("reset", True):
        raise NVMLError_NotSupported()
    if _holders(index):
        raise NVMLError_InUse()
    with _state(write=True) as state:
        gpu = state["gpus"][index]
        gpu["mig_current"] = gpu["mig_pending"]
        gpu["instances"] = []


# ---------------------------------------------------------------- GPU instances


def _profile_by_index(index):
    for profile in _model()["profiles"]:
        if profile["nvml_profile_index"] == index:
            return profile
    raise NVMLError_NotSupported()


def _profile_by_id(profile_id):
    for profile in _model()["profiles"]:
        if profile["id"] == profile_id:
            return profile
    raise NVMLError_InvalidArgument()


def _profile_info(profile, named: bool):
    fields = dict(id=profile["id"], isP2pSupported=0, sliceCount=profile["compute_slices"],
                  instanceCount=profile["max_count"], multiprocessorCount=profile["compute_slices"] * 16,
                  copyEngineCount=profile["compute_slices"], decoderCount=0, encoderCount=0, jpegCount=0,
                  ofaCount=0, memorySizeMB=profile["memory_mib"])
    if named:
        fields["name"] = f"MIG {profile['name']}"
    return _Struct(**fields)


def nvmlDeviceGetGpuInstanceProfileInfo(handle, profile, version=None):  # noqa: N802
    _check(handle)
    if not _model()["mig_capable"]:
        raise NVMLError_NotSupported()
    return _profile_info(_profile_by_index(profile), named=False)


def nvmlDeviceGetGpuInstanceProfileInfoV(handle, profile, version=None):  # noqa: N802
    _check(handle)
    if not _model()["mig_capable"]:
        raise NVMLError_NotSupported()
    return _profile_info(_profile_by_index(profile), named=True)


def _gi_handle(gpu: int, gi: int) -> int:
    return gpu * 1000 + gi


def nvmlDeviceGetGpuInstances(handle, profileId, gpuInstancesRef, countRef):  # noqa: N802, N803
    index = _check(handle)
    _profile_by_id(profileId)
    with _state() as state:
        found = [gi for gi in state["gpus"][index]["instances"] if gi["profile_id"] == profileId]
    for i, gi in enumerate(found):
        gpuInstancesRef[i] = _gi_handle(index, gi["id"])
    target = getattr(countRef, "_obj", countRef)
    target.value = len(found)


def nvmlGpuInstanceGetInfo(gpuInstance):  # noqa: N802, N803
    gpu, gi_id = divmod(int(gpuInstance), 1000)
    with _state() as state:
        for gi in state["gpus"][gpu]["instances"]:
            if gi["id"] == gi_id:
                return _Struct(device=_Device(gpu), id=gi["id"], profileId=gi["profile_id"],
                               placement=_Struct(start=gi["start"], size=gi["size"]))
    raise NVMLError_NotFound()


def nvmlDeviceCreateGpuInstance(handle, profileId):  # noqa: N802, N803
    """Places the instance at the lowest free allowed start, as the driver chooses for the caller."""
    index = _check(handle)
    profile = _profile_by_id(profileId)
    with _state(write=True) as state:
        gpu = state["gpus"][index]
        if gpu["mig_current"] != NVML_DEVICE_MIG_ENABLE:
            raise NVMLError_NotSupported()
        same = [gi for gi in gpu["instances"] if gi["profile_id"] == profileId]
        if len(same) >= profile["max_count"]:
            raise NVMLError_InsufficientResources()
        used = set()
        for gi in gpu["instances"]:
            used.update(range(gi["start"], gi["start"] + gi["size"]))
        for start in sorted(profile["placements"]):
            span = set(range(start, start + profile["memory_slices"]))
            if not span & used:
                gi = {"id": gpu["next_gi"], "profile_id": profileId, "start": start, "size": profile["memory_slices"]}
                gpu["next_gi"] += 1
                gpu["instances"].append(gi)
                return _gi_handle(index, gi["id"])
        raise NVMLError_InsufficientResources()


def nvmlGpuInstanceDestroy(gpuInstance):  # noqa: N802, N803
    gpu, gi_id = divmod(int(gpuInstance), 1000)
    if _holders(gpu):
        raise NVMLError_InUse()
    with _state(write=True) as state:
        before = state["gpus"][gpu]["instances"]
        after = [gi for gi in before if gi["id"] != gi_id]
        if len(after) == len(before):
            raise NVMLError_NotFound()
        state["gpus"][gpu]["instances"] = after


# ---------------------------------------------------------------- processes


NVML_VALUE_NOT_AVAILABLE_uint = 0xFFFFFFFF  # noqa: N816 - nvidia-ml-py's name


class c_nvmlProcessUtilizationSample_t(ctypes.Structure):  # noqa: N801 - nvidia-ml-py's name and fields
    _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong), ("smUtil", ctypes.c_uint),
                ("memUtil", ctypes.c_uint), ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint)]


def _process(p: dict) -> _Struct:
    """A process file as nvidia-ml-py's v3 process info: memory in bytes (`used_memory`, else `used_mib`), the MIG
    GPU instance it runs in (`gi`; NVML_VALUE_NOT_AVAILABLE outside MIG)."""
    memory = int(p["used_memory"]) if p.get("used_memory") is not None else int(p.get("used_mib", 1024)) * 2**20
    gi = p.get("gi")
    return _Struct(pid=int(p["pid"]), usedGpuMemory=memory,
                   gpuInstanceId=NVML_VALUE_NOT_AVAILABLE_uint if gi is None else int(gi),
                   computeInstanceId=NVML_VALUE_NOT_AVAILABLE_uint if gi is None else 0)


def nvmlDeviceGetComputeRunningProcesses(handle):  # noqa: N802
    index = _check(handle)
    return [_process(p) for p in sorted(_holders(index, kinds=("compute",)), key=lambda p: p["pid"])]


def nvmlDeviceGetMPSComputeRunningProcesses(handle):  # noqa: N802
    """MPS clients (process files of kind "client") on the GPU."""
    index = _check(handle)
    return [_process(p) for p in sorted(_holders(index, kinds=("client",)), key=lambda p: p["pid"])]


def nvmlDeviceGetProcessUtilization(handle, timeStamp):  # noqa: N802, N803 - nvidia-ml-py's signature
    """Per-process samples newer than timeStamp (microseconds), one per process file that carries `sm_util` or
    `mem_util` (percent), stamped now. As the driver: NVML_ERROR_NOT_FOUND when no sample is newer, and
    NVML_ERROR_NOT_SUPPORTED on a GPU in MIG mode (per-process utilization is not sampled there)."""
    index = _check(handle)
    state = _read_json(os.path.join(STATE_DIR, "state.json")) or {}  # read without the lock: any user may call
    gpus = state.get("gpus", [])
    if index < len(gpus) and gpus[index].get("mig_current") == NVML_DEVICE_MIG_ENABLE:
        raise NVMLError_NotSupported()
    now = int(time.time() * 1e6)
    samples = [c_nvmlProcessUtilizationSample_t(int(p["pid"]), now, int(p.get("sm_util") or 0),
                                                int(p.get("mem_util") or 0), 0, 0)
               for p in sorted(_holders(index), key=lambda p: p["pid"])
               if p.get("sm_util") is not None or p.get("mem_util") is not None]
    samples = [x for x in samples if x.timeStamp > int(timeStamp)]
    if not samples:
        raise NVMLError_NotFound()
    return samples


def nvmlDeviceGetGraphicsRunningProcesses(handle):  # noqa: N802
    _check(handle)
    return []


# ---------------------------------------------------------------- fixture-only helpers


def gpusim_register(pid: int, kind: str, gpus="all", used_mib: int = 1024, used_memory: int | None = None,
                    sm_util: int | None = None, mem_util: int | None = None, gi: int | None = None) -> str:
    """A process file: a compute process or an MPS client ("client") on the GPUs; used_memory (bytes) over used_mib,
    sm_util/mem_util percent for nvmlDeviceGetProcessUtilization, gi the MIG GPU instance it runs in."""
    os.makedirs(PROCS_DIR, exist_ok=True)
    path = os.path.join(PROCS_DIR, f"{pid}.json")
    extra = {k: v for k, v in (("used_memory", used_memory), ("sm_util", sm_util), ("mem_util", mem_util),
                               ("gi", gi)) if v is not None}
    with open(path, "w") as handle:
        json.dump({"pid": pid, "kind": kind, "gpus": gpus, "used_mib": used_mib, "since": time.time(), **extra},
                  handle)
    return path


def gpusim_unregister(pid: int) -> None:
    try:
        os.unlink(os.path.join(PROCS_DIR, f"{pid}.json"))
    except FileNotFoundError:
        pass


def gpusim_profile_name(profile_id: int) -> str:
    return _profile_by_id(profile_id)["name"]


def gpusim_state() -> dict:
    with _state() as state:
        return json.loads(json.dumps(state))


def gpusim_set_diag_failure(gpu: int | None, message: str = "") -> None:
    with _state(write=True) as state:
        state["diag_fail"] = {} if gpu is None else {str(gpu): message}
