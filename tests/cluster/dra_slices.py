"""ResourceSlices in the exact shape NVIDIA's DRA driver for GPUs publishes with its DynamicMIG gate (partitionable
devices, KEP 4815) and consumable shares (KEP 5075), for kwok nodes that have no kubelet plugin to publish them.

The driver's source (github.com/kubernetes-sigs/dra-driver-nvidia-gpu at the commit gpushare/data/
dra-driver-nvidia-gpu.yaml names, 95932046, the tree v0.5.0 is cut from), cmd/gpu-kubelet-plugin/, function by function:
- driver.go `publishResources`: with DynamicMIG every device is published through `PartGetDevice`, one pool per node
  named after the node. `shouldUseSplitResourceSlices`: on Kubernetes 1.35 and later (the API server's /version)
  `generateSplitResourceSlices` makes G+1 slices for G GPUs, first one holding every GPU's shared CounterSet, then one
  slice of devices per GPU (sorted by PCI bus ID); before 1.35 `generateCombinedResourceSlices` makes one slice per GPU
  holding both its CounterSet and its devices. Devices in a slice are sorted by name: the scheduler takes the first
  that fits.
- nvlib.go `GetPerGpuAllocatableDevices`, `isDynamicMIGCapable`, `supportsMIGModeToggle`: a MIG-capable Hopper or
  newer GPU is announced as its full device plus every MIG profile at every placement; an Ampere GPU with MIG on
  only as its MIG devices; a GPU without MIG as the full device alone, without counters.
  `inspectMigProfilesAndPlacements`: go-nvlib's `VisitMigProfiles` (one profile per GPU-instance profile whose
  compute slices equal its GPU slices, the REV1 compute profile left out), each of NVML's possible placements; the
  GPU's capacity is the maximum of each dimension over them, its memory-slice count the largest placement size.
- partitions.go `PartGetDevice`, `PartSharedCounterSets`, `PartConsumesCounters`, `capacitiesToCounters`,
  `addCountersForMemSlices`, `memsliceCounterName`, `GetSharedCounterSetName`: one CounterSet per GPU
  (`gpu-<minor>-counter-set`) with one counter per capacity dimension (named by `camelToDNSName`) plus
  `memory-slice-<i>` (capacity 1) per memory slice; the full GPU consumes all of it, a MIG device its own profile's
  capacities and the memory slices of its placement.
- mig.go `MigSpecTuple.ToCanonicalName` (`gpu-<minor>-mig-<profile without dots>-<GI profile id>-<placement start>`),
  `CommonCapacitiesMig` (multiprocessors, copyEngines, decoders, encoders, jpegEngines, ofaEngines, memory in bytes
  from NVML's MiB), `CommonAttributesMig` (no uuid: an abstract MIG device has none until it is made),
  `toRFC1123Compliant`, `camelToDNSName`; go-nvlib v0.12.0 `MigProfileInfo.String` and `getMigMemorySizeGB` for the
  profile's name.
- deviceinfo.go `GpuInfo.Attributes`, `CanonicalName` (`gpu-<minor>`); k8s.io/dynamic-resource-allocation
  deviceattribute `GetPCIBusIDAttribute` (`resource.kubernetes.io/pciBusID`). Left out: the PCIe root and NUMA node
  attributes (read from sysfs, absent where it has none) and the addressing mode (coherent-memory systems only).
- consumable_shares.go `applyConsumableShares`: with `--consumable-shares=N` every device with a memory capacity
  allows multiple allocations, its memory gets a request policy (default 0, 1Mi steps) and a `shares` capacity N
  (default 1, 1 to N).

The MIG geometry is not modelled: each GPU model's profiles, ids, placements, SM and engine counts and memory come
from NVML on a real GPU (tests/data/nvidia/h200-580.159.04/capture/nvml_dump.json: an NVIDIA H200 on driver
580.159.04, every GPU-instance profile index through nvmlDeviceGetGpuInstanceProfileInfo v2 and its possible
placements, copied from shared/data/nvidia/real-gpus/). UUIDs and PCI bus IDs are made up per node and GPU, in the
driver's formats."""

from __future__ import annotations

import copy
import json
import math
import re
import uuid
from dataclasses import dataclass
from functools import cache
from typing import Any

from tests.cluster.bins import ROOT

DRIVER = "gpu.nvidia.com"
CAPTURE = ROOT / "tests" / "data" / "nvidia" / "h200-580.159.04" / "capture" / "nvml_dump.json"
CAPTURES = {"NVIDIA H200": CAPTURE}
# What the captures do not hold, per model: NVML's brand and architecture strings (go-nvlib GetBrandAsString,
# GetArchitectureAsString) and the CUDA compute capability (Hopper 9.0, Ada Lovelace 8.9). A GPU without MIG needs
# only its memory: the L40S's 46068 MiB is nvidia-smi's memory.total as gpushare's catalog quotes it
# (gpushare/data/catalog_extra.yaml, NVIDIA L40S source).
MODEL_FACTS: dict[str, dict[str, Any]] = {
    "NVIDIA H200": {"brand": "Nvidia", "architecture": "Hopper", "cuda_compute_capability": "9.0",
                    "mig_mode_toggles": True},
    "NVIDIA L40S": {"brand": "Nvidia", "architecture": "Ada Lovelace", "cuda_compute_capability": "8.9",
                    "mig_mode_toggles": False, "memory_mib": 46068},
}

# go-nvml pkg/nvml const.go: GPU-instance profile index -> its GPU slices and go-nvlib's suffix (mig_profile.go
# NewMigProfile: attributes +me, +me.all, +gfx; negative attribute -me).
GI_PROFILES = {0: (1, ""), 1: (2, ""), 2: (3, ""), 3: (4, ""), 4: (7, ""), 5: (8, ""), 6: (6, ""), 7: (1, "+me"),
               8: (2, "+me"), 9: (1, ""), 10: (1, "+gfx"), 11: (2, "+gfx"), 12: (4, "+gfx"), 13: (1, "-me"),
               14: (2, "-me"), 15: (1, "+me.all"), 16: (2, "+me.all")}
MIB = 1024 * 1024


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile as NVML describes it (nvmlGpuInstanceProfileInfo_v2) and its possible placements."""

    name: str  # go-nvlib's MigProfileInfo.String(): "1g.18gb", "1g.18gb+me"
    id: int  # the GI profile id (nvidia-smi mig -lgip ID), part of the device name
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    memory_mib: int
    placements: tuple[tuple[int, int], ...]  # (start, size) in memory slices

    def capacities(self) -> dict[str, int]:
        """CommonCapacitiesMig: the profile's capacity per dimension (memory in bytes)."""
        return {"multiprocessors": self.multiprocessors, "copyEngines": self.copy_engines,
                "decoders": self.decoders, "encoders": self.encoders, "jpegEngines": self.jpeg_engines,
                "ofaEngines": self.ofa_engines, "memory": self.memory_mib * MIB}


@dataclass(frozen=True)
class GpuModel:
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: str
    memory_mib: int  # nvmlDeviceGetMemoryInfo total
    mig_capable: bool
    mig_mode_toggles: bool  # Hopper and newer: MIG mode changes without a GPU reset
    profiles: tuple[MigProfile, ...]
    driver_version: str
    cuda_driver_version: int  # nvmlSystemGetCudaDriverVersion: 13000 for 13.0

    @property
    def max_capacities(self) -> dict[str, int]:
        """The full GPU's capacity: per dimension the largest any profile at any placement has."""
        out: dict[str, int] = {}
        for p in self.profiles:
            for name, value in p.capacities().items():
                out[name] = max(out.get(name, value), value)
        return out

    @property
    def memory_slices(self) -> int:
        return max((size for p in self.profiles for _, size in p.placements), default=0)


def mig_memory_gb(total_bytes: int, mig_mib: int) -> int:
    """go-nvlib getMigMemorySizeGB: the 'gb' of a profile's name."""
    fraction = math.ceil(mig_mib * MIB / total_bytes * 8) / 8
    total_gb = (total_bytes + 1024**3 - 1) // 1024**3
    return math.floor(fraction * total_gb + 0.5)  # Go's math.Round: halves away from zero


@cache
def gpu_model(product_name: str) -> GpuModel:
    """A GPU model from its NVML capture (the only source of MIG geometry here), or a GPU without MIG from its
    memory; the node's driver is the capture's (580.159.04, CUDA 13.0)."""
    facts = MODEL_FACTS.get(product_name)
    if facts is None or (product_name not in CAPTURES and "memory_mib" not in facts):
        raise KeyError(f"no NVML capture of {product_name}: the slices are built from real GPUs only "
                       f"({', '.join(MODEL_FACTS)})")
    dump = json.loads(CAPTURES.get(product_name, CAPTURE).read_text())
    gpu: dict[str, Any] = next((g for g in dump["gpus"] if g["name"] == product_name),
                               {"memory_total_mib": facts.get("memory_mib"), "profiles": []})
    total = int(gpu["memory_total_mib"]) * MIB
    profiles = []
    for entry in gpu["profiles"]:
        info = entry.get("v2")
        if info is None:  # NOT_SUPPORTED / INVALID_ARGUMENT: VisitMigProfiles skips the index
            continue
        slices, suffix = GI_PROFILES[entry["index"]]
        name = f"{slices}g.{mig_memory_gb(total, info['memorySizeMB'])}gb{suffix}"
        assert info["name"] == f"MIG {name}", (info["name"], name)  # NVML's own name agrees with go-nvlib's
        profiles.append(MigProfile(
            name=name, id=info["id"], multiprocessors=info["multiprocessorCount"],
            copy_engines=info["copyEngineCount"], decoders=info["decoderCount"], encoders=info["encoderCount"],
            jpeg_engines=info["jpegCount"], ofa_engines=info["ofaCount"], memory_mib=info["memorySizeMB"],
            placements=tuple((start, size) for start, size in entry["placements"])))
    return GpuModel(product_name=product_name, brand=str(facts["brand"]), architecture=str(facts["architecture"]),
                    cuda_compute_capability=str(facts["cuda_compute_capability"]),
                    memory_mib=gpu["memory_total_mib"], mig_capable=bool(profiles),
                    mig_mode_toggles=bool(facts["mig_mode_toggles"]), profiles=tuple(profiles),
                    driver_version=dump["driver"], cuda_driver_version=int(dump["cuda_driver"]))


# ---------------------------------------------------------------- the driver's names and quantities


def to_rfc1123(name: str) -> str:
    """mig.go toRFC1123Compliant."""
    name = re.sub(r"[^a-z0-9-.]", "-", name.lower()).strip("-").removesuffix(".")
    return name[:253]


def camel_to_dns_name(s: str) -> str:
    """mig.go camelToDNSName: copyEngines -> copy-engines."""
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", s)
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1-\2", s)
    return to_rfc1123(s)


def memslice_counter(i: int) -> str:
    return f"memory-slice-{i}"


def counter_set_name(minor: int) -> str:
    return to_rfc1123(f"gpu-{minor}-counter-set")


def mig_device_name(minor: int, profile: MigProfile, start: int) -> str:
    return f"gpu-{minor}-mig-{to_rfc1123(profile.name.replace('.', ''))}-{profile.id}-{start}"


def semver(version: str) -> str:
    """Masterminds semver MustParse(...).String(): missing parts are 0, leading zeros dropped."""
    parts = [int(p) for p in version.split(".")]
    return ".".join(str(p) for p in (parts + [0, 0])[:3])


def quantity(value: int) -> str:
    """resource.NewQuantity(value, BinarySI) as the API server writes it back."""
    for exp, suffix in ((6, "Ei"), (5, "Pi"), (4, "Ti"), (3, "Gi"), (2, "Mi"), (1, "Ki")):
        if value and value % 1024**exp == 0:
            return f"{value // 1024**exp}{suffix}"
    return str(value)


_SUFFIXES = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "Pi": 1024**5, "Ei": 1024**6,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


def parse_quantity(text: str) -> int:
    """A whole-number quantity as the API server writes it ("16Gi", "4", "1k")."""
    for suffix, factor in _SUFFIXES.items():
        if text.endswith(suffix):
            return int(text.removesuffix(suffix)) * factor
    return int(text)


# ---------------------------------------------------------------- devices


@dataclass(frozen=True)
class Gpu:
    """One physical GPU of a node."""

    node: str
    minor: int
    model: GpuModel

    @property
    def uuid(self) -> str:
        return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{self.node}.gpu{self.minor}.gpushare.test"))

    @property
    def pci_bus_id(self) -> str:
        return f"0000:{0x18 + 0x10 * self.minor:02x}:00.0"

    @property
    def dynamic_mig(self) -> bool:
        """nvlib.go isDynamicMIGCapable (with MIG mode off, as after the driver started)."""
        return self.model.mig_capable and self.model.mig_mode_toggles

    def common_attributes(self) -> dict[str, Any]:
        m = self.model
        return {"productName": {"string": m.product_name}, "brand": {"string": m.brand},
                "architecture": {"string": m.architecture},
                "cudaComputeCapability": {"version": semver(m.cuda_compute_capability)},
                "driverVersion": {"version": semver(m.driver_version)},
                "cudaDriverVersion": {"version": semver(
                    f"{m.cuda_driver_version // 1000}.{(m.cuda_driver_version % 1000) // 10}")},
                "resource.kubernetes.io/pciBusID": {"string": self.pci_bus_id}}

    def counters(self) -> dict[str, int]:
        """The GPU's counter set: capacitiesToCounters(maxCapacities) plus every memory slice."""
        out = {camel_to_dns_name(k): v for k, v in self.model.max_capacities.items()}
        out.update({memslice_counter(i): 1 for i in range(self.model.memory_slices)})
        return out

    def full_device(self) -> dict[str, Any]:
        """PartGetDevice of the full GPU."""
        capacity = self.model.max_capacities if self.dynamic_mig else {"memory": self.model.memory_mib * MIB}
        attributes: dict[str, Any] = {"type": {"string": "gpu"}, "uuid": {"string": self.uuid},
                                      **self.common_attributes()}
        device: dict[str, Any] = {
            "name": f"gpu-{self.minor}", "attributes": attributes,
            "capacity": {k: {"value": quantity(v)} for k, v in capacity.items()}}
        if self.dynamic_mig:
            device["consumesCounters"] = [{"counterSet": counter_set_name(self.minor), "counters": {
                k: {"value": quantity(v)} for k, v in self.counters().items()}}]
        return device

    def mig_devices(self) -> list[dict[str, Any]]:
        """PartGetDevice of every abstract MIG device: each profile at each placement."""
        out = []
        for profile in self.model.profiles if self.dynamic_mig else ():
            for start, size in profile.placements:
                counters = {camel_to_dns_name(k): v for k, v in profile.capacities().items()}
                counters.update({memslice_counter(i): 1 for i in range(start, start + size)})
                attributes: dict[str, Any] = {"type": {"string": "mig"}, "parentUUID": {"string": self.uuid},
                                              "profile": {"string": profile.name}, **self.common_attributes()}
                out.append({
                    "name": mig_device_name(self.minor, profile, start), "attributes": attributes,
                    "capacity": {k: {"value": quantity(v)} for k, v in profile.capacities().items()},
                    "consumesCounters": [{"counterSet": counter_set_name(self.minor), "counters": {
                        k: {"value": quantity(v)} for k, v in counters.items()}}]})
        return out

    def devices(self, shares: int | None) -> list[dict[str, Any]]:
        devices = [self.full_device(), *self.mig_devices()]
        for device in devices:
            apply_consumable_shares(device, shares)
        return sorted(devices, key=lambda d: str(d["name"]))

    def counter_set(self) -> dict[str, Any]:
        return {"name": counter_set_name(self.minor),
                "counters": {k: {"value": quantity(v)} for k, v in self.counters().items()}}


def apply_consumable_shares(device: dict[str, Any], shares: int | None) -> None:
    """consumable_shares.go applyConsumableShares with --consumable-shares=N (None: disabled)."""
    if shares is None:
        return
    device["allowMultipleAllocations"] = True
    memory = device["capacity"].get("memory")
    if memory is None:
        return
    step = MIB
    top = quantity(parse_quantity(memory["value"]) // step * step)
    memory["value"] = top
    memory["requestPolicy"] = {"default": "0", "validRange": {"min": "0", "max": top, "step": "1Mi"}}
    device["capacity"]["shares"] = {"value": str(shares), "requestPolicy": {
        "default": "1", "validRange": {"min": "1", "max": str(shares), "step": "1"}}}


# ---------------------------------------------------------------- slices


def node_gpus(node: str, product_name: str, count: int) -> list[Gpu]:
    return [Gpu(node, minor, gpu_model(product_name)) for minor in range(count)]


def node_slices(node: str, gpus: list[Gpu], shares: int | None, split: bool, generation: int = 1,
                taints: dict[str, list[dict[str, Any]]] | None = None) -> list[dict[str, Any]]:
    """The ResourceSlices of one node's pool: split (Kubernetes 1.35+: the counter sets in a slice of their own,
    then one slice of devices per GPU) or combined (1.34: one slice per GPU with its counter set and devices).
    `taints`: device name -> taints the driver publishes on it (deviceHealthEvents / DRADeviceTaints)."""
    specs: list[dict[str, Any]] = []
    by_bus = sorted(gpus, key=lambda g: g.pci_bus_id)
    counter_sets = [g.counter_set() for g in by_bus if g.dynamic_mig]
    if split and counter_sets:
        specs.append({"sharedCounters": counter_sets})
    for gpu in by_bus:
        devices = gpu.devices(shares)
        for device in devices:
            if taints and device["name"] in taints:
                device["taints"] = copy.deepcopy(taints[device["name"]])
        spec: dict[str, Any] = {"devices": devices}
        if not split and gpu.dynamic_mig:
            spec = {"sharedCounters": [gpu.counter_set()], **spec}
        specs.append(spec)
    return [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
             "metadata": {"name": f"{node}-{DRIVER}-{i}", "labels": {"gpushare.io/test-slices": node}},
             "spec": {"driver": DRIVER, "nodeName": node,
                      "pool": {"name": node, "generation": generation, "resourceSliceCount": len(specs)}, **spec}}
            for i, spec in enumerate(specs)]


def split_slices(server_version: tuple[int, int]) -> bool:
    """driver.go shouldUseSplitResourceSlices: separate counter slices from Kubernetes 1.35."""
    return server_version >= (1, 35)


def device_index(slices: list[dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, int]]]:
    """(device name -> device, counter set name -> counters as integers) of one pool's slices."""
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}
    sets = {c["name"]: {k: parse_quantity(v["value"]) for k, v in c["counters"].items()}
            for s in slices for c in s["spec"].get("sharedCounters") or []}
    return devices, sets


def consumed(device: dict[str, Any]) -> dict[tuple[str, str], int]:
    """(counter set, counter) -> what allocating the device takes."""
    return {(c["counterSet"], k): parse_quantity(v["value"]) for c in device.get("consumesCounters") or []
            for k, v in c["counters"].items()}
