"""Helpers shared by the fixture tools on gpushare's test hosts, and the `gpusim` command the tests drive.

Everything here reads and changes the simulated GPUs only through the `pynvml` simulator's NVML calls (plus its
fixture-only helpers for GPU resets, process registration and injected diagnostic failures).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import time
from collections import Counter

import pynvml

EVENTS = os.environ.get("GPUSIM_EVENTS", "/var/log/gpusim/events.jsonl")


def event(name: str, **detail) -> None:
    """One line per fixture action, in order, so tests can check what happened when."""
    os.makedirs(os.path.dirname(EVENTS), exist_ok=True)
    with open(EVENTS, "a") as handle:
        handle.write(json.dumps({"t": time.time(), "event": name, **detail}) + "\n")


def devices():
    return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]


def profiles(handle) -> dict[str, tuple[int, int]]:
    """MIG profile name -> (NVML profile index, profile id), as NVML names them."""
    out = {}
    for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfoV(handle, index)
        except pynvml.NVMLError:
            continue
        out[info.name.removeprefix("MIG ")] = (index, info.id)
    return out


def instances(handle) -> list[dict]:
    found = []
    for name, (index, profile_id) in profiles(handle).items():
        info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
        refs = (pynvml.c_nvmlGpuInstance_t * max(info.instanceCount, 1))()
        count = ctypes.c_uint(0)
        pynvml.nvmlDeviceGetGpuInstances(handle, profile_id, refs, ctypes.byref(count))
        for i in range(count.value):
            gi = pynvml.nvmlGpuInstanceGetInfo(refs[i])
            found.append({"handle": refs[i], "id": gi.id, "profile": name, "profile_id": profile_id,
                          "start": gi.placement.start, "size": gi.placement.size})
    return sorted(found, key=lambda gi: gi["start"])


def layout(handle) -> Counter:
    return Counter(gi["profile"] for gi in instances(handle))


def pci_id(handle) -> str:
    return f"0x{pynvml.nvmlDeviceGetPciInfo(handle).pciDeviceId:08X}"


def mig_device_uuid(gpu_uuid: str, gi: dict) -> str:
    import uuid

    name = "/".join([gpu_uuid, str(gi["id"]), gi["profile"]])
    return f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, name)}"


# ---------------------------------------------------------------- the `gpusim` command


def _show(_args) -> int:
    pynvml.nvmlInit()
    out = {"driver": pynvml.nvmlSystemGetDriverVersion(), "gpus": []}
    for i, handle in enumerate(devices()):
        try:
            current, pending = pynvml.nvmlDeviceGetMigMode(handle)
        except pynvml.NVMLError_NotSupported:
            current = pending = None
        out["gpus"].append({
            "index": i, "name": pynvml.nvmlDeviceGetName(handle), "uuid": pynvml.nvmlDeviceGetUUID(handle),
            "mig_current": current, "mig_pending": pending,
            "layout": dict(sorted(layout(handle).items())) if current == 1 else {},
            "instances": [{k: v for k, v in gi.items() if k != "handle"} for gi in instances(handle)]
            if current == 1 else [],
            "processes": [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)],
        })
    print(json.dumps(out, indent=1))
    return 0


def _job(args) -> int:
    """A GPU job: registers itself as a compute process on the GPUs and runs until it is killed."""
    gpus = "all" if args.gpus == "all" else [int(g) for g in args.gpus.split(",")]
    pynvml.gpusim_register(os.getpid(), args.kind, gpus, used_mib=args.used_mib, sm_util=args.sm_util,
                           mem_util=args.mem_util, gi=args.gi)
    event("job-start", pid=os.getpid(), role=args.kind, gpus=gpus, job=args.name)

    def stop(*_):
        pynvml.gpusim_unregister(os.getpid())
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        time.sleep(3600)


def _event(args) -> int:
    event(args.kind, unit=args.unit)
    return 0


def _diag(args) -> int:
    pynvml.gpusim_set_diag_failure(None if args.clear else args.gpu, args.message)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="gpusim", description="Drive the simulated GPUs of a gpushare test host.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("show", help="print the GPUs, their MIG state, instances and processes as JSON")
    job = sub.add_parser("job", help="run as a GPU process until killed")
    job.add_argument("--gpus", default="all", help="comma-separated indices or 'all'")
    job.add_argument("--kind", default="compute", choices=["compute", "client"])
    job.add_argument("--name", default="job")
    job.add_argument("--used-mib", type=int, default=1024, help="GPU memory the process holds")
    job.add_argument("--sm-util", type=int, help="SM utilization percent its samples report")
    job.add_argument("--mem-util", type=int, help="memory-controller utilization percent its samples report")
    job.add_argument("--gi", type=int, help="MIG GPU instance id it runs in")
    ev = sub.add_parser("event", help="append an event (used by the fixture units)")
    ev.add_argument("kind")
    ev.add_argument("unit")
    diag = sub.add_parser("diag", help="make dcgmi diag fail on a GPU, or clear that")
    diag.add_argument("--gpu", type=int)
    diag.add_argument("--message", default="simulated XID 79: GPU has fallen off the bus")
    diag.add_argument("--clear", action="store_true")
    args = parser.parse_args(argv)
    return {"show": _show, "job": _job, "event": _event, "diag": _diag}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
