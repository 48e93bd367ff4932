"""scripts/gpu_check.py's comparison of what NVML reports with the catalog, against a fake NVML."""

from __future__ import annotations

import ctypes
import importlib.util
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpushare.core.catalog import GpuModel, load_catalog

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"
_spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
assert _spec is not None and _spec.loader is not None
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)


class NVMLError(Exception):
    pass


class NVMLErrorNotSupported(NVMLError):
    pass


class NVMLErrorInvalidArgument(NVMLError):
    pass


class Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


def fake_nvml(
    model: GpuModel, overrides: Mapping[str, Mapping[str, Any]] | None = None, mig_on: bool = True
) -> types.SimpleNamespace:
    """NVML answering with the catalog's own geometry; `overrides` change a profile's answers by name."""
    rows: dict[int, dict[str, Any]] = {}
    for p in model.profiles.values():
        assert p.nvml_profile_index is not None
        row: dict[str, Any] = {
            "id": p.id,
            "sliceCount": p.compute_slices,
            "instanceCount": p.max_count,
            "memorySizeMB": round((p.memory_gib or 0) * 1024),
            "placements": [(s, p.memory_slices) for s in p.placements],
            "index": p.nvml_profile_index,
        }
        row.update((overrides or {}).get(p.name, {}))
        rows[row["index"]] = row
    by_id = {row["id"]: row for row in rows.values()}
    calls: list[str] = []

    def profile_info(handle: Any, index: int, version: int) -> Any:
        calls.append(f"info v{version}")
        if index >= 0x12:
            raise NVMLErrorInvalidArgument("Invalid Argument")
        if index not in rows:
            raise NVMLErrorNotSupported("Not Supported")
        return types.SimpleNamespace(
            **{k: v for k, v in rows[index].items() if k not in ("placements", "index")}
        )

    def possible_placements(handle: Any, profile_id: int, array: Any, count: Any) -> None:
        calls.append("placements")
        if not mig_on:
            raise NVMLErrorNotSupported("Not Supported")
        found = by_id[profile_id]["placements"]
        count._obj.value = len(found)
        if array is not None:
            for i, (start, size) in enumerate(found):
                array[i].start, array[i].size = start, size

    return types.SimpleNamespace(
        NVMLError=NVMLError,
        NVMLError_NotSupported=NVMLErrorNotSupported,
        NVMLError_InvalidArgument=NVMLErrorInvalidArgument,
        NVML_GPU_INSTANCE_PROFILE_COUNT=0x12,
        c_nvmlGpuInstancePlacement_t=Placement,
        nvmlDeviceGetGpuInstanceProfileInfo=profile_info,
        nvmlDeviceGetGpuInstancePossiblePlacements=possible_placements,
        calls=calls,
    )


def model(name: str) -> GpuModel:
    return load_catalog().models[name]


@pytest.mark.parametrize(
    "name", ["NVIDIA H100 80GB HBM3", "NVIDIA A30", "NVIDIA RTX PRO 6000 Blackwell Server Edition"]
)
def test_a_gpu_that_matches_the_catalog_confirms_every_field(name: str) -> None:
    gpu = model(name)
    nvml = fake_nvml(gpu)
    report = gpu_check.compare_gpu(nvml, handle=0, model=gpu, driver_branch=580)
    assert report["mismatches"] == [] and report["unconfirmed"] == []
    fields = {(c["profile"], c["field"]) for c in report["confirmed"]}
    for p in gpu.profiles.values():
        for field in ("id", "compute_slices", "max_count", "memory_gib", "placements", "memory_slices"):
            assert (p.name, field) in fields
    assert set(nvml.calls) == {"info v1", "placements"}


def test_with_mig_off_placements_stay_unconfirmed() -> None:
    gpu = model("NVIDIA H100 80GB HBM3")
    report = gpu_check.compare_gpu(fake_nvml(gpu, mig_on=False), 0, gpu, 580)
    assert report["mismatches"] == []
    assert {u["field"] for u in report["unconfirmed"]} == {"placements"}
    assert len(report["unconfirmed"]) == len(gpu.profiles)
    assert "Not Supported" in report["unconfirmed"][0]["reason"]


def test_disagreements_are_mismatches() -> None:
    gpu = model("NVIDIA H100 80GB HBM3")
    nvml = fake_nvml(
        gpu,
        {
            "1g.10gb+me": {"instanceCount": 2},
            "3g.40gb": {"placements": [(0, 4), (2, 4), (4, 4)]},
            "7g.80gb": {"memorySizeMB": 80 * 1024},
        },
    )
    report = gpu_check.compare_gpu(nvml, 0, gpu, 580)
    found = {(m["profile"], m["field"]): (m["catalog"], m["nvml"]) for m in report["mismatches"]}
    assert found == {
        ("1g.10gb+me", "max_count"): (1, 2),
        ("3g.40gb", "placements"): ([0, 4], [0, 2, 4]),
        ("7g.80gb", "memory_gib"): (79.25, 80.0),
    }


def test_memory_of_another_driver_listed_in_the_data_file_is_accepted() -> None:
    gpu = model("NVIDIA H200")
    report = gpu_check.compare_gpu(
        fake_nvml(gpu, {"2g.35gb": {"memorySizeMB": round(32.5 * 1024)}}), 0, gpu, 580
    )
    assert report["mismatches"] == []
    assert {"profile": "2g.35gb", "field": "memory_gib", "value": 32.5} in report["confirmed"]


def test_missing_and_unexpected_profiles() -> None:
    gpu = model("NVIDIA A100-SXM4-40GB")
    # 1g.10gb absent: expected with an old driver (it needs R525), a contradiction with a new one.
    absent = fake_nvml(gpu, {"1g.10gb": {"index": 99}})
    old = gpu_check.compare_gpu(absent, 0, gpu, 470)
    assert [u["profile"] for u in old["unconfirmed"]] == ["1g.10gb"] and "R525" in old["unconfirmed"][0][
        "reason"
    ]
    new = gpu_check.compare_gpu(fake_nvml(gpu, {"1g.10gb": {"index": 99}}), 0, gpu, 535)
    assert {"profile": "1g.10gb", "field": "present", "catalog": True, "nvml": False} in new["mismatches"]
    moved = gpu_check.compare_gpu(fake_nvml(gpu, {"2g.10gb": {"index": 6}}), 0, gpu, 535)
    assert {"profile": "2g.10gb", "field": "nvml_profile_index", "catalog": 1, "nvml": 6} in moved[
        "mismatches"
    ]
