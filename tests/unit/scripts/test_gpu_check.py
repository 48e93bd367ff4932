"""scripts/gpu_check.py's comparison of what NVML reports with the catalog, against a fake NVML."""

from __future__ import annotations

import ctypes
import importlib.util
import json
import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.catalog import GpuModel, load_catalog
from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "gpu_check.py"
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


# ---------------------------------------------------------------- the real H200 capture, and --full against fakes

CAPTURE = ROOT / "tests" / "data" / "nvidia" / "h200-580.159.04"
FULL = ROOT / "scripts" / "gpu_check_full.py"
_full_spec = importlib.util.spec_from_file_location("gpu_check_full", FULL)
assert _full_spec is not None and _full_spec.loader is not None
gpu_check_full = importlib.util.module_from_spec(_full_spec)
sys.modules["gpu_check_full"] = gpu_check_full  # dataclasses look their module up there
_full_spec.loader.exec_module(gpu_check_full)


def captured(name: str) -> Any:
    text = (CAPTURE / "capture" / name).read_text()
    return json.loads(text) if name.endswith(".json") else yaml.safe_load(text)


def test_the_real_h200_on_driver_580_confirms_the_catalog() -> None:
    """NVML's answers on the real GPU (nvml_dump.json), memory included: the 580 values are accepted."""
    gpu = model("NVIDIA H200")
    rows = {p["v1"]["id"]: p for p in captured("nvml_dump.json")["gpus"][0]["profiles"] if p.get("v1")}
    assert sorted(rows) == sorted(p.id for p in gpu.profiles.values())
    overrides = {p.name: {"index": rows[p.id]["index"], "sliceCount": rows[p.id]["v1"]["sliceCount"],
                          "memorySizeMB": rows[p.id]["v1"]["memorySizeMB"],
                          "instanceCount": rows[p.id]["v1"]["instanceCount"],
                          "placements": [tuple(x) for x in rows[p.id]["placements"]]}
                 for p in gpu.profiles.values()}
    report = gpu_check.compare_gpu(fake_nvml(gpu, overrides), 0, gpu, 580)
    assert report["mismatches"] == [] and report["unconfirmed"] == []
    memory = {c["profile"]: c["value"] for c in report["confirmed"] if c["field"] == "memory_gib"}
    assert memory == {p.name: p.memory_gib_on(580) for p in gpu.profiles.values()}


def test_nvidias_generated_configs_equal_the_catalog() -> None:
    gpu = model("NVIDIA H200")
    report = gpu_check_full.compare_generated(captured("mig-parted-generate-config.yaml"), gpu, 580)
    assert report["mismatches"] == []
    assert {"field": "all-balanced", "value": {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}} in report["confirmed"]
    assert len(report["confirmed"]) == 2 + len(gpu.profiles)


def test_a_generated_config_that_differs_is_a_mismatch() -> None:
    generated = captured("mig-parted-generate-config.yaml")
    generated["mig-configs"]["all-balanced"][0]["mig-devices"] = {"1g.18gb": 3, "2g.35gb": 2}
    generated["mig-configs"]["all-2g.35gb"][0]["mig-devices"] = {"2g.35gb": 2}
    del generated["mig-configs"]["all-1g.18gb.me"]
    report = gpu_check_full.compare_generated(generated, model("NVIDIA H200"), 580)
    assert {m["field"] for m in report["mismatches"]} == {"all-balanced", "profiles", "all-2g.35gb count"}


def captured_runner(argv: list[str], timeout: float) -> Any:
    """mig-parted as it answered on the real H200 (MIG disabled)."""
    done = gpu_check_full.Done
    if argv[1] == "generate-config":
        return done(0, (CAPTURE / "capture" / "mig-parted-generate-config.yaml").read_text())
    name = argv[argv.index("-c") + 1]
    if "--valid-config" in argv:
        return done(0, "Selected MIG configuration is valid\n")
    answer = next(a for a in captured("mig-parted-assert.json") if a["cmd"].endswith(f"-c {name}"))
    return done(answer["rc"], "\n".join(answer["log_tail"]))


def captured_plugin(advertised: dict[str, Any]) -> Any:
    """The device plugin as the stand-in saw it on the real H200, keyed by the rendered config's name."""
    def start(tools: Any, config: Path, extra: list[str]) -> dict[str, Any]:
        seen = advertised[config.stem]["advertised"]
        return {"resources": {name: {"devices": [{"id": i} for i in ids]} for name, ids in seen.items()}}
    return start


def full_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, advertised: dict[str, Any]) -> dict[str, Any]:
    monkeypatch.setattr(gpu_check_full, "PLUGIN_DIR", tmp_path)
    monkeypatch.setenv("GPUSHARE_ROOT", str(ROOT))
    tools = gpu_check_full.Tools("nvidia-mig-parted", "nvidia-device-plugin", "standin.py")
    return gpu_check_full.full_report(CAPTURE / "environments" / "h200.yaml", model("NVIDIA H200"), 1, 580, True,
                                      tools, [], captured_runner, captured_plugin(advertised))


def test_full_check_on_the_captured_h200_agrees_with_the_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = full_report(tmp_path, monkeypatch, captured("device-plugin-advertised.json"))
    assert not gpu_check_full.has_mismatches(report), report
    plugin = {c["config"]: c["plan"] for c in report["device_plugin"]["configs"]}
    # The three configs the real plugin was fed; MPS and MIG configs are not started.
    assert plugin == {"exclusive-6d445569": {"nvidia.com/gpu": 1},
                      "inference-ts2-b6e93724": {"nvidia.com/gpu.shared": 2},
                      "notebooks-ts4-538eaa36": {"nvidia.com/gpu.shared": 4}}
    asserted = {c["config"]: (c["valid"], c["applied"]) for c in report["mig_parted_assert"]["configs"]}
    assert asserted["all-disabled"] == (True, True) and len(asserted) == 3
    assert not any(applied for name, (_, applied) in asserted.items() if name != "all-disabled")


def test_full_check_reports_a_plugin_that_advertises_otherwise(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    advertised = captured("device-plugin-advertised.json")
    shared = advertised["notebooks-ts4-538eaa36"]["advertised"]["nvidia.com/gpu.shared"]
    shared.pop()
    report = full_report(tmp_path, monkeypatch, advertised)
    assert report["device_plugin"]["mismatches"] == [{"config": "notebooks-ts4-538eaa36", "plan": {
        "nvidia.com/gpu.shared": 4}, "advertised": {"nvidia.com/gpu.shared": 3}}]


def test_full_check_never_starts_the_plugin_beside_a_kubelet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kubelet.sock").write_text("")
    report = full_report(tmp_path, monkeypatch, {})
    assert "live node" in report["device_plugin"]["skipped"] and report["device_plugin"]["mismatches"] == []


def test_full_needs_an_environment() -> None:
    with pytest.raises(SystemExit) as exit_:
        gpu_check.parse_args(["--full"])
    assert exit_.value.code == 2


def test_the_files_the_real_gpu_was_given_are_what_gpushare_renders_today(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpushare.core.resolve import resolve
    from gpushare.render.fleet import render_fleet

    monkeypatch.setenv("GPUSHARE_ROOT", str(ROOT))
    files = render_fleet(resolve(CAPTURE / "environments" / "h200.yaml")).files
    given = {p.relative_to(CAPTURE / "capture" / "rendered").as_posix(): p.read_text()
             for p in (CAPTURE / "capture" / "rendered").rglob("*.yaml")}
    assert given.pop("mig-parted-config.yaml") == files["mig-parted/config.yaml"]
    assert len(given) == 3 and all(files[rel] == text for rel, text in given.items())
