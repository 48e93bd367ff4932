"""`mig validate`, `mig profiles` and `discover` through Typer, registered the way gpushare/cli.py does."""

from __future__ import annotations

import ctypes
import json
import sys
import types
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from gpushare.cli.gpu import discover_command, mig_app
from gpushare.core.catalog import load_catalog

app = typer.Typer()
app.add_typer(mig_app, name="mig")
app.command("discover")(discover_command)
runner = CliRunner()
CHECK_KEYS = {"ok", "gpu", "errors", "warnings", "placements"}


def run(*args: str) -> Any:
    return runner.invoke(app, list(args))


def test_valid_layout_exits_0_and_draws_the_slice_map() -> None:
    result = run(
        "mig", "validate", "--gpu", "NVIDIA H100 80GB HBM3", "--layout", "1g.10gb=2,2g.20gb=1,3g.40gb=1"
    )
    assert result.exit_code == 0, result.output
    assert "is valid" in result.stdout
    assert "|0 1g.10gb|1 1g.10gb|2-3 2g.20gb|4-7 3g.40gb|" in result.stdout


def test_free_slices_show_in_the_map() -> None:
    result = run("mig", "validate", "--gpu", "h200", "--layout", "1g.18gb=6")
    assert result.exit_code == 0
    assert "|5 1g.18gb|6-7 free|" in result.stdout
    assert "inferred" not in result.stdout  # H200 placements are exact since the real-GPU capture


def test_valid_layout_json_has_exactly_the_agreed_keys() -> None:
    result = run("mig", "validate", "--gpu", "0x2330", "--layout", "4g.40gb,3g.40gb", "--json")
    assert result.exit_code == 0
    document = json.loads(result.stdout)
    assert set(document) == CHECK_KEYS
    assert document["ok"] is True and document["gpu"] == "NVIDIA H100 80GB HBM3"
    assert document["placements"] == [{"profile": "4g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]
    assert document["errors"] == [] and document["warnings"] == []


def test_invalid_layout_exits_1() -> None:
    result = run("mig", "validate", "--gpu", "H100-SXM5-80GB", "--layout", "4g.40gb@0,3g.40gb@0", "--json")
    assert result.exit_code == 1
    document = json.loads(result.stdout)
    assert set(document) == CHECK_KEYS | {"fix"}
    assert document["ok"] is False and document["placements"] == []
    assert "gpushare mig profiles --gpu 'NVIDIA H100 80GB HBM3'" in document["fix"]
    assert document["errors"] == ["4g.40gb@0 overlaps 3g.40gb@0 (memory slices 0-3) on NVIDIA H100 80GB HBM3"]
    human = run("mig", "validate", "--gpu", "H100-SXM5-80GB", "--layout", "4g.40gb@0,3g.40gb@0")
    assert human.exit_code == 1
    assert "is invalid" in human.stdout and "error: 4g.40gb@0 overlaps 3g.40gb@0" in human.stdout


def test_driver_branch_option() -> None:
    args = ("mig", "validate", "--gpu", "A100-SXM4-40GB", "--layout", "1g.10gb=4")
    old = run(*args, "--driver-branch", "470", "--json")
    assert old.exit_code == 1
    assert json.loads(old.stdout)["errors"] == [
        "1g.10gb needs driver R525 or newer on NVIDIA A100-SXM4-40GB; the host runs R470"
    ]
    assert run(*args, "--driver-branch", "535").exit_code == 0


@pytest.mark.parametrize(
    ("gpu", "layout", "said"),
    [
        ("NVIDIA H100 80GB HBM", "1g.10gb", "NVIDIA H100 80GB HBM3"),
        ("H100-SXM5-80GB", "1g.10gb=x", "1g.10gb=x"),
    ],
)
def test_unusable_input_exits_2_with_one_json_object(gpu: str, layout: str, said: str) -> None:
    result = run("mig", "validate", "--gpu", gpu, "--layout", layout, "--json")
    assert result.exit_code == 2
    document = json.loads(result.stdout)
    assert set(document) == CHECK_KEYS
    assert document["ok"] is False and document["gpu"] == gpu
    assert said in document["errors"][0]


def test_unusable_input_without_json_is_a_plain_message() -> None:
    result = run("mig", "validate", "--gpu", "no-such-gpu", "--layout", "1g.10gb")
    assert result.exit_code == 2
    assert "unknown GPU 'no-such-gpu'" in result.stderr
    assert "Traceback" not in result.output


def test_profiles_table() -> None:
    result = run("mig", "profiles", "--gpu", "A100-SXM4-40GB")
    assert result.exit_code == 0
    for text in ("NVIDIA A100-SXM4-40GB", "confidence exact", "1g.5gb+me", "R470", "R525", "0, 2, 4, 6"):
        assert text in result.stdout
    assert "4g.20gb together with 3g.20gb needs driver R510 or newer" in result.stdout


def test_profiles_json() -> None:
    result = run("mig", "profiles", "--gpu", "NVIDIA H100 NVL", "--json")
    assert result.exit_code == 0
    document = json.loads(result.stdout)
    model = load_catalog().models["NVIDIA H100 NVL"]
    assert [p["name"] for p in document["profiles"]] == list(model.profiles)
    first = document["profiles"][1]
    assert first == {
        "name": "1g.12gb+me",
        "id": 20,
        "compute_slices": 1,
        "memory_slices": 1,
        "memory_gib": 10.75,
        "max_count": 1,
        "placements": [0, 1, 2, 3, 4, 5, 6],
        "min_driver_branch": None,
        "resource": "nvidia.com/mig-1g.12gb.me",
    }
    assert document["confidence"] == "exact" and document["placement_units_total"] == 8


def test_profiles_of_a_gpu_without_mig_is_a_valid_question() -> None:
    result = run("mig", "profiles", "--gpu", "L4")
    assert result.exit_code == 0
    assert "NVIDIA L4 has no MIG" in result.stdout
    document = json.loads(run("mig", "profiles", "--gpu", "L4", "--json").stdout)
    assert document["mig_capable"] is False and document["profiles"] == []
    assert run("mig", "profiles", "--gpu", "nope").exit_code == 2


# --- discover ---------------------------------------------------------------------------------------------


class NVMLError(Exception):
    pass


class NVMLErrorNotSupported(NVMLError):
    pass


class NVMLErrorInvalidArgument(NVMLError):
    pass


def fake_nvml(init_error: str | None = None) -> types.SimpleNamespace:
    """An H100 in MIG mode with 3g.40gb at 4 and 1g.10gb at 0, an L4 (no MIG), and a GPU the catalog lacks."""
    h100 = load_catalog().models["NVIDIA H100 80GB HBM3"]
    by_index = {p.nvml_profile_index: p for p in h100.profiles.values()}
    instances = {1: (9, 4, 4), 2: (19, 0, 1)}  # handle -> (profile id, start, size)
    gpus: list[dict[str, Any]] = [
        {"name": "NVIDIA H100 80GB HBM3", "pci": 0x233010DE, "mig": [1, 1], "mem": 81559 * 2**20},
        {"name": "NVIDIA L4", "pci": 0x27B810DE, "mig": None, "mem": 23034 * 2**20},
        {"name": "NVIDIA GeForce RTX 4090", "pci": 0x268410DE, "mig": None, "mem": 24564 * 2**20},
    ]

    def init() -> None:
        if init_error:
            raise NVMLError(init_error)

    def mig_mode(handle: int) -> list[int]:
        if gpus[handle]["mig"] is None:
            raise NVMLErrorNotSupported("Not Supported")
        return gpus[handle]["mig"]

    def profile_info(handle: int, index: int, version: int) -> Any:
        profile = by_index.get(index)
        if profile is None:
            raise NVMLErrorNotSupported("Not Supported")
        return types.SimpleNamespace(id=profile.id, instanceCount=profile.max_count)

    def gpu_instances(handle: int, profile_id: int, array: Any, count: Any) -> None:
        mine = [key for key, (pid, _, _) in instances.items() if pid == profile_id]
        for i, key in enumerate(mine):
            array[i] = key
        count._obj.value = len(mine)

    def instance_info(key: int) -> Any:
        pid, start, size = instances[key]
        return types.SimpleNamespace(
            id=key, profileId=pid, placement=types.SimpleNamespace(start=start, size=size)
        )

    return types.SimpleNamespace(
        NVMLError=NVMLError,
        NVMLError_NotSupported=NVMLErrorNotSupported,
        NVMLError_InvalidArgument=NVMLErrorInvalidArgument,
        NVML_GPU_INSTANCE_PROFILE_COUNT=0x12,
        c_nvmlGpuInstance_t=ctypes.c_void_p,
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: "550.54.15",
        nvmlSystemGetCudaDriverVersion=lambda: 12040,
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetName=lambda h: gpus[h]["name"].encode(),
        nvmlDeviceGetUUID=lambda h: f"GPU-{h:08d}",
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(pciDeviceId=gpus[h]["pci"]),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=gpus[h]["mem"]),
        nvmlDeviceGetMigMode=mig_mode,
        nvmlDeviceGetGpuInstanceProfileInfo=profile_info,
        nvmlDeviceGetGpuInstances=gpu_instances,
        nvmlGpuInstanceGetInfo=instance_info,
    )


def test_discover_without_the_nvml_bindings_exits_3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    result = run("discover")
    assert result.exit_code == 3
    assert result.stderr.startswith("gpushare: no NVIDIA driver:")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_discover_when_nvml_fails_to_initialise_exits_3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(init_error="NVML Shared Library Not Found"))
    result = run("discover")
    assert result.exit_code == 3
    assert "no NVIDIA driver" in result.stderr and "NVML Shared Library Not Found" in result.stderr
    assert "Traceback" not in result.output
    as_json = run("discover", "--json")
    assert as_json.exit_code == 3
    document = json.loads(as_json.stdout)
    assert document["ok"] is False and "no NVIDIA driver" in document["errors"][0]


def test_discover_reads_gpus_and_matches_the_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    result = run("discover", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["driver_version"] == "550.54.15" and report["driver_branch"] == 550
    assert report["cuda_driver_version"] == "12.4"
    h100, l4, unknown = report["gpus"]
    assert h100["catalog_model"] == "NVIDIA H100 80GB HBM3" and h100["pci_device_id"] == "0x233010DE"
    assert h100["mig"] == {"capable": True, "current": "enabled", "pending": "enabled"}
    assert h100["memory_mib"] == 81559
    assert [(i["profile"], i["start"], i["size"]) for i in h100["mig_instances"]] == [
        ("1g.10gb", 0, 1),
        ("3g.40gb", 4, 4),
    ]
    assert l4["name"] == "NVIDIA L4" and l4["catalog_model"] == "NVIDIA L4"
    assert l4["mig"] == {"capable": False, "current": None, "pending": None} and l4["mig_instances"] == []
    assert unknown["catalog_model"] is None
    assert (
        "NVIDIA GeForce RTX 4090" in unknown["catalog_reason"] and "0x268410DE" in unknown["catalog_reason"]
    )
    human = run("discover")
    assert human.exit_code == 0
    assert "GPU 0: NVIDIA H100 80GB HBM3" in human.stdout and "1g.10gb@0" in human.stdout


def test_gpus_lists_the_whole_catalog_by_every_name_lookup_takes() -> None:
    from gpushare.cli import app as gpushare

    catalog = load_catalog()
    result = runner.invoke(gpushare, ["gpus", "--json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)["gpus"]
    assert sorted(g["name"] for g in listed) == sorted(catalog.models)
    for gpu in listed:
        for name in (gpu["name"], gpu["slug"], *gpu["aliases"], *gpu["pci_device_ids"]):
            assert catalog.lookup(name).name == gpu["name"], name
        assert bool(gpu["mig_profiles"]) == gpu["mig_capable"]
    text = runner.invoke(gpushare, ["gpus"], env={"COLUMNS": "80"})
    assert text.exit_code == 0 and all(len(line) <= 80 for line in text.stdout.splitlines())
    assert "NVIDIA H100 80GB HBM3" in text.stdout and "gpushare mig profiles --gpu MODEL" in text.stdout


def test_an_unknown_gpu_points_at_a_command_that_lists_them(tmp_path: Any) -> None:
    from gpushare.cli import app as gpushare

    result = run("mig", "profiles", "--gpu", "NVIDIA H99", "--json")
    assert result.exit_code == 2 and "`gpushare gpus`" in json.loads(result.stdout)["errors"][0]
    demand = tmp_path / "demand.yaml"
    demand.write_text("gpus: [{model: NVIDIA H99}]\nworkloads: [{name: w, tenant: t, kind: batch, memory_gib: 4, "
                      "compute: 0.1}]\n")
    packed = runner.invoke(gpushare, ["pack", "--demand", str(demand), "--json"])
    assert "`gpushare gpus`" in json.loads(packed.stdout)["problems"][0]["fix"]
    assert runner.invoke(gpushare, ["gpus"]).exit_code == 0  # the command the hint names exists
