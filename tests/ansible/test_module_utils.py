"""The collection's module_utils that gpushare shares with it (one writer or reader per format, used on hosts without
gpushare and by gpushare itself): the TOML encoder (gpushare's TOML templates and the containerd_runtime module) and
the NVML reader (gpushare discover and the gpu_facts module), against NVML as a real H200 answered and the test
hosts' NVML simulator. Nothing here boots a test host."""

from __future__ import annotations

import ctypes
import importlib.util
import json
import math
import sys
import tomllib
import types
from pathlib import Path
from typing import Any

import pynvml as real_nvml  # nvidia-ml-py: its error classes are the ones NVML's answers raise
import pytest

from gpushare.ansible_collections.gpushare.fleet.plugins.module_utils import nvml as nvml_read
from gpushare.ansible_collections.gpushare.fleet.plugins.module_utils import toml_writer
from gpushare.core.catalog import load_catalog
from tests.ansible import packages
from tests.ansible.test_ansible_modules import FIXTURES, module
from tests.ansible.testbed import ROOT

UTILS = "ansible_collections.gpushare.fleet.plugins.module_utils"

# ---------------------------------------------------------------- TOML

VALUES = [
    "plain", "", 'say "hi"', "C:\\path\\to", "two\nlines\r\n", "tab\there", "\x00\x1b\x7f", "°C — 日本語",
    "emoji 🙂", "'single'", "trailing backslash \\", "\"\"\"", "#not a comment", "[not a table]",
    0, -1, 7, 2**63 - 1, -(2**63),
    True, False,
    1.5, -0.0, 0.1, 1e300, 1e-7, -2.5e-12, 123456789.125, math.inf, -math.inf,
    [], [1, 2, 3], ["a", "b"], [[1, 2], ["x"]], [True, 1, "mixed", 1.5], [{"a": 1}, {"b": [2]}],
    {}, {"key": "value"}, {"nested": {"deeper": {"n": 1, "list": [1, {"x": "y"}]}}},
    {"needs quotes": 1, "a.b": 2, "": 3, "é": 4, 'q"uote': 5, "bare-key_1": 6},
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: repr(v)[:40])
def test_every_value_reads_back_as_written(value: Any) -> None:
    text = f"v = {toml_writer.encode_value(value)}\n"
    assert tomllib.loads(text)["v"] == value, text


def test_nan_and_tuples_and_int_subclasses() -> None:
    import enum

    class Replicas(enum.IntEnum):
        FOUR = 4

    assert math.isnan(tomllib.loads(f"v = {toml_writer.encode_value(math.nan)}")["v"])
    assert tomllib.loads(f"v = {toml_writer.encode_value(('a', 1))}")["v"] == ["a", 1]
    assert toml_writer.encode_value(Replicas.FOUR) == "4"


def test_what_toml_cannot_hold_is_refused() -> None:
    for value in (None, object(), b"bytes", {1: "int key"}):
        with pytest.raises(TypeError):
            toml_writer.encode_value(value)
    with pytest.raises(ValueError, match="surrogate"):
        toml_writer.encode_value("\ud83d")


def test_a_document_with_tables_and_arrays_of_tables_reads_back() -> None:
    data = {
        "version": 2, "imports": ["/etc/containerd/conf.d/*.toml"], "root": "/var/lib/containerd",
        "plugins": {"io.containerd.grpc.v1.cri": {
            "sandbox_image": "registry.k8s.io/pause:3.10",
            "containerd": {"default_runtime_name": "runc", "runtimes": {"nvidia": {
                "runtime_type": "io.containerd.runc.v2", "options": {"BinaryName": "/usr/bin/nvidia-container-runtime",
                                                                     "SystemdCgroup": True}}}},
            "empty": {}}},
        "proxy_plugins": [{"name": "a", "address": "/run/a.sock"}, {"name": "b", "labels": {"k": "v"}}],
        "odd key": {"quote": 'say "hi"', "unicode": "°C", "float": 1.5, "inline": [{"a": "b"}]},
    }
    text = toml_writer.dumps(data)
    assert tomllib.loads(text) == data
    assert '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]' in text
    assert text.count("[[proxy_plugins]]") == 2 and text.endswith("\n") and not text.startswith("\n")


def test_gpushare_templates_and_the_containerd_module_encode_with_it() -> None:
    from gpushare.render.fleet import containerd_runtime
    from gpushare.render.templating import environment

    assert environment().filters["tomlv"] is toml_writer.encode_value
    rendered = environment().get_template("containerd-nvidia-runtime.toml.j2").render(r=containerd_runtime("2.1"))
    tomllib.loads(rendered)
    cr = module("containerd_runtime")
    shipped = sys.modules[f"{UTILS}.toml_writer"]  # as Ansible ships it in the module's payload
    assert Path(shipped.__file__).resolve() == Path(toml_writer.__file__).resolve()
    assert cr.dumps is shipped.dumps and cr.encode_key is shipped.encode_key
    assert not hasattr(cr, "_value") and not hasattr(cr, "_atomic_write")


def test_the_containerd_module_writes_through_module_utils_files() -> None:
    cr = module("containerd_runtime")
    assert cr.write_if_differs is sys.modules[f"{UTILS}.files"].write_if_differs


# ---------------------------------------------------------------- NVML, as a real H200 answered

CAPTURE = json.loads((ROOT / "tests" / "data" / "nvidia" / "h200-580.159.04" / "capture" / "nvml_dump.json")
                     .read_text())
H200 = CAPTURE["gpus"][0]
# NVIDIA's all-balanced for the H200 (1g.18gb x2, 2g.35gb, 3g.71gb) at starts the capture lists as possible placements.
BALANCED = [(14, 0, 2), (19, 2, 1), (19, 3, 1), (9, 4, 4)]  # (profile id, start, size)


def _raise(answer: str) -> None:
    """NVML's error as the capture names it ("NVMLError_NotSupported: Not Supported"), as nvidia-ml-py raises it."""
    raise getattr(real_nvml, answer.split(":")[0])()


def h200_nvml(mig: tuple[int, int] | None = (1, 1), instances: list[tuple[int, int, int]] = BALANCED, *,
              versioned_bindings: bool = True, driver_has_v2: bool = True, lost_at: int | None = None,
              gone: tuple[int, ...] = ()) -> types.SimpleNamespace:
    """NVML answering as the captured H200 did, per profile index and version (errors included), with `instances`
    created. mig None: a GPU without MIG; versioned_bindings False: bindings older than the version argument;
    driver_has_v2 False: a driver without nvmlDeviceGetGpuInstanceProfileInfoV; lost_at: the profile index where the
    GPU falls off the bus; gone: instance handles destroyed between listing and reading."""
    by_index = {p["index"]: p for p in H200["profiles"]}
    handles = {i + 1: gi for i, gi in enumerate(instances)}

    def info(handle: int, index: int, version: int = 2) -> Any:
        if index == lost_at:
            raise real_nvml.NVMLError_GpuIsLost()
        row = by_index.get(index)
        if row is None:
            raise real_nvml.NVMLError_InvalidArgument()
        if version == 2 and not driver_has_v2:
            raise real_nvml.NVMLError_FunctionNotFound()
        key = "v2" if version == 2 else "v1"
        if f"{key}_error" in row:
            _raise(row[f"{key}_error"])
        return types.SimpleNamespace(**row[key])

    def mig_mode(handle: int) -> list[int]:
        if mig is None:
            raise real_nvml.NVMLError_NotSupported()
        return list(mig)

    def gpu_instances(handle: int, profile_id: int, array: Any, count: Any) -> int:
        mine = [h for h, (pid, _, _) in handles.items() if pid == profile_id]
        for i, h in enumerate(mine):
            array[i] = h
        count._obj.value = len(mine)
        return 0

    def instance_info(handle: int) -> Any:
        if handle in gone:
            raise real_nvml.NVMLError_NotFound()
        pid, start, size = handles[handle]
        return types.SimpleNamespace(id=handle, profileId=pid, placement=types.SimpleNamespace(start=start, size=size))

    nvml = types.SimpleNamespace(
        **{name: getattr(real_nvml, name) for name in dir(real_nvml) if name.startswith("NVMLError")},
        NVML_GPU_INSTANCE_PROFILE_COUNT=real_nvml.NVML_GPU_INSTANCE_PROFILE_COUNT,
        c_nvmlGpuInstance_t=ctypes.c_uint64,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: CAPTURE["driver"],
        nvmlSystemGetCudaDriverVersion=lambda: CAPTURE["cuda_driver"],
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda index: 0,
        nvmlDeviceGetName=lambda h: H200["name"],
        nvmlDeviceGetUUID=lambda h: "GPU-00000000-0000-0000-0000-000000000000",
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(pciDeviceId=int(H200["pci_device_id"], 16)),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=H200["memory_total_mib"] * 2**20),
        nvmlDeviceGetMigMode=mig_mode,
        nvmlDeviceGetGpuInstanceProfileInfo=(info if versioned_bindings else lambda h, index: info(h, index, 1)),
        nvmlDeviceGetGpuInstances=gpu_instances,
        nvmlGpuInstanceGetInfo=instance_info,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [],
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: [],
    )
    if versioned_bindings:
        nvml.nvmlDeviceGetGpuInstanceProfileInfoV = info  # nvidia-ml-py's alias: version 2 by default
    return nvml


BALANCED_READ = [("2g.35gb", 14, 0, 2), ("1g.18gb", 19, 2, 1), ("1g.18gb", 19, 3, 1), ("3g.71gb", 9, 4, 4)]


def _shape(instances: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(gi["profile"], gi["profile_id"], gi["start"], gi["size"]) for gi in instances]


def test_the_h200_s_instances_are_read_past_the_profiles_it_lacks() -> None:
    # The capture answers NotSupported for indices 5, 6, 8 and 10-16 and InvalidArgument for 17 (the bindings' 18
    # indices, one more than the driver knows): none of them is an error.
    nvml = h200_nvml()
    assert nvml_read.mig_mode(nvml, 0) == {"capable": True, "current": "enabled", "pending": "enabled"}
    assert _shape(nvml_read.gpu_instances(nvml, 0)) == BALANCED_READ
    assert [gi["id"] for gi in nvml_read.gpu_instances(nvml, 0)] == [1, 2, 3, 4]


def test_the_profile_geometry_is_read_in_version_1_which_every_driver_answers() -> None:
    # A driver without the versioned call: the instances are still read, only NVML's names are missing.
    old_driver = nvml_read.gpu_instances(h200_nvml(driver_has_v2=False), 0)
    assert [(gi["profile_id"], gi["start"]) for gi in old_driver] == [(14, 0), (19, 2), (19, 3), (9, 4)]
    assert {gi["profile"] for gi in old_driver} == {None}
    # Bindings from before the version argument (only the version 1 form).
    old_bindings = nvml_read.gpu_instances(h200_nvml(versioned_bindings=False), 0)
    assert [(gi["profile_id"], gi["start"], gi["profile"]) for gi in old_bindings] == [
        (14, 0, None), (19, 2, None), (19, 3, None), (9, 4, None)]


def test_no_mig_an_instance_gone_and_a_lost_gpu() -> None:
    assert nvml_read.mig_mode(h200_nvml(mig=None), 0) == {"capable": False, "current": None, "pending": None}
    disabled = h200_nvml(mig=(0, 1))
    assert nvml_read.mig_mode(disabled, 0) == {"capable": True, "current": "disabled", "pending": "enabled"}
    assert _shape(nvml_read.gpu_instances(h200_nvml(gone=(2,)), 0)) == [BALANCED_READ[0], *BALANCED_READ[2:]]
    with pytest.raises(real_nvml.NVMLError_GpuIsLost):
        nvml_read.gpu_instances(h200_nvml(lost_at=2), 0)
    no_nvml_errors = types.SimpleNamespace()  # bindings without the classes: nothing is caught by mistake
    assert nvml_read.errors(no_nvml_errors, ("NVMLError_NotSupported",)) == ()


def test_discover_and_gpu_facts_read_the_h200_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpushare.core.discover import discover

    monkeypatch.setitem(sys.modules, "pynvml", h200_nvml(driver_has_v2=False))
    report = discover()
    facts = module("gpu_facts").gather()
    gpu = report["gpus"][0]
    assert gpu["catalog_model"] == "NVIDIA H200" and gpu["mig"] == facts["gpus"][0]["mig"]
    # discover names each profile from the catalog; gpu_facts as NVML does (none from this driver).
    assert [(i["profile"], i["profile_id"], i["start"], i["size"]) for i in gpu["mig_instances"]] == BALANCED_READ
    assert [(i["profile_id"], i["start"], i["size"]) for i in facts["gpus"][0]["gpu_instances"]] == [
        row[1:] for row in BALANCED_READ]


def test_a_lost_gpu_fails_discover_and_gpu_facts_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpushare.core.discover import discover
    from gpushare.core.errors import GpushareError

    monkeypatch.setitem(sys.modules, "pynvml", h200_nvml(lost_at=1))
    with pytest.raises(GpushareError) as err:
        discover()
    assert err.value.exit_code == 3 and "NVML failed while reading the GPUs" in str(err.value.problems[0].message)
    facts = module("gpu_facts")
    with pytest.raises(facts.NvmlReadError, match="NVMLError_GpuIsLost"):
        facts.gather()


def test_both_callers_use_the_one_reader() -> None:
    from gpushare.core import discover

    assert discover.nvml_read is nvml_read
    gf = module("gpu_facts")
    shipped = sys.modules[f"{UTILS}.nvml"]
    assert Path(shipped.__file__).resolve() == Path(nvml_read.__file__).resolve()
    assert gf.gpu_instances is shipped.gpu_instances and gf.mig_mode is shipped.mig_mode
    assert not hasattr(gf, "read_instances")


# ---------------------------------------------------------------- NVML, the test hosts' simulator


def test_discover_and_gpu_facts_agree_on_the_simulated_h200(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tables.json").write_text(json.dumps(packages.simulator_tables()))
    (tmp_path / "driver.json").write_text(json.dumps({"version": packages.DRIVER_VERSION,
                                                      "cuda": packages.DRIVER_CUDA}))
    (tmp_path / "hardware.json").write_text(json.dumps({"host": "h", "model": "NVIDIA H200", "count": 1}))
    (tmp_path / "boot_id").write_text("boot-1\n")
    for name, file in (("HARDWARE", "hardware.json"), ("DRIVER", "driver.json"), ("TABLES", "tables.json"),
                       ("STATE_DIR", "state"), ("PROCS_DIR", "procs"), ("BOOT_ID", "boot_id")):
        monkeypatch.setenv(f"GPUSIM_{name}", str(tmp_path / file))
    spec = importlib.util.spec_from_file_location("gpushare_test_gpusim_nvml", FIXTURES / "sim" / "pynvml.py")
    assert spec and spec.loader
    sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sim)
    profiles = load_catalog().models["NVIDIA H200"].profiles
    sim.nvmlInit()
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    sim.nvmlDeviceSetMigMode(handle, 1)
    sim.gpusim_reset(handle)
    for name in ("1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"):  # greedy placement: the small ones first
        sim.nvmlDeviceCreateGpuInstance(handle, profiles[name].id)
    sim.nvmlShutdown()

    from gpushare.core.discover import discover

    monkeypatch.setitem(sys.modules, "pynvml", sim)
    found = discover()["gpus"][0]["mig_instances"]
    facts = module("gpu_facts").gather()["gpus"][0]["gpu_instances"]
    assert sorted(i["profile"] for i in found) == ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"]
    assert [(i["profile"], i["profile_id"], i["start"], i["size"]) for i in found] == [
        (i["profile"], i["profile_id"], i["start"], i["size"]) for i in facts]
