"""Every device-plugin config gpushare renders, read by NVIDIA's own `nvidia-device-plugin` as far as it goes
without NVML.

The plugin loads its config file, then validates its flags, then opens NVML. Without NVML a good file ends in one
of two ways: with CDI strategies (what the GPU Operator sets) flag validation stops at once with "CDI ... only
supported on NVML-based systems", so a second run overrides the list strategy on the command line (command-line
flags win over the file, as in the plugin's own precedence) to get every other flag validated and reach NVML.
`--mps-root` is what the GPU Operator passes (devicePlugin.mps.root in its values); the plugin requires it for MPS.
"""

from __future__ import annotations

import ctypes.util
from pathlib import Path

import pytest
import yaml

from tests.nvidia.programs import ENVIRONMENT_FILES, ENVIRONMENT_IDS, Run, nvidia_files, run_all, run_tool

LOADER_ERROR = "unable to load config"
FLAG_ERROR = "unable to validate flags:"
CDI_NEEDS_NVML = "CDI --device-list-strategy options are only supported on NVML-based systems"
NVML_MISSING = "nvml init failed"
PAST_THE_FLAGS = ("--device-list-strategy", "envvar", "--mps-root", "/run/nvidia/mps")

pytestmark = pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None,
    reason="this host has NVML: the plugin would start for real and serve sockets in /var/lib/kubelet; "
           "scripts/gpu_check.py --full runs it on GPU hosts with a kubelet stand-in")


def past_the_loader(run: Run) -> bool:
    """The config loaded and the flags passed validation up to the point where the plugin needs NVML."""
    flag_errors = [line for line in run.output.splitlines() if FLAG_ERROR in line and CDI_NEEDS_NVML not in line]
    reached = CDI_NEEDS_NVML in run.output or NVML_MISSING in run.output or run.returncode is None
    return LOADER_ERROR not in run.output and not flag_errors and reached


def start(device_plugin: Path, config: Path, *extra: str) -> list[str | Path]:
    return [device_plugin, "--config-file", config, "--kubelet-socket", config.parent / "kubelet.sock", *extra]


def device_plugin_configs(env_file: Path) -> dict[str, str]:
    return {rel: text for rel, text in nvidia_files(env_file).items() if rel.startswith("device-plugin/")}


@pytest.mark.parametrize("env_file", ENVIRONMENT_FILES, ids=ENVIRONMENT_IDS)
def test_every_config_passes_the_plugins_loader_and_flags(device_plugin: Path, env_file: Path,
                                                          tmp_path: Path) -> None:
    configs = device_plugin_configs(env_file)
    assert configs, "every shipped or fixture environment renders at least one device-plugin config"
    calls, names = [], []
    for rel, text in configs.items():
        path = tmp_path / Path(rel).name
        path.write_text(text)
        calls += [start(device_plugin, path), start(device_plugin, path, *PAST_THE_FLAGS)]
        names += [f"{rel} as rendered", f"{rel} {' '.join(PAST_THE_FLAGS)}"]
    runs = run_all(calls)
    failed = {name: run.output[-600:] for name, run in zip(names, runs, strict=True) if not past_the_loader(run)}
    assert failed == {}


def first_shared_config() -> tuple[str, dict]:
    for env_file in ENVIRONMENT_FILES:
        for rel, text in device_plugin_configs(env_file).items():
            data = yaml.safe_load(text)
            if "timeSlicing" in (data.get("sharing") or {}):
                return rel, data
    raise AssertionError("no environment file renders a time-slicing config")


def run_changed(device_plugin: Path, tmp_path: Path, change: object, *extra: str) -> Run:
    _, data = first_shared_config()
    change(data)  # type: ignore[operator]
    path = tmp_path / "changed.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return run_tool(start(device_plugin, path, *extra))


def test_one_replica_fails(device_plugin: Path, tmp_path: Path) -> None:
    run = run_changed(device_plugin, tmp_path,
                      lambda d: d["sharing"]["timeSlicing"]["resources"][0].update(replicas=1))
    assert run.returncode == 1 and not past_the_loader(run)
    assert f"{LOADER_ERROR}: " in run.output and "number of replicas must be >= 2" in run.output


@pytest.mark.parametrize(("field", "value", "says"), [
    ("migStrategy", "mixd", "unknown MIG strategy: mixd"),
    ("deviceDiscoveryStrategy", "gpu", "invalid --device-discovery-strategy option gpu"),
])
def test_a_bad_flag_value_fails_past_the_cdi_check(device_plugin: Path, tmp_path: Path, field: str, value: str,
                                                   says: str) -> None:
    run = run_changed(device_plugin, tmp_path, lambda d: d["flags"].update({field: value}), *PAST_THE_FLAGS)
    assert run.returncode == 1 and not past_the_loader(run) and says in run.output


def test_the_plugin_drops_a_misspelt_key_in_silence(device_plugin: Path, tmp_path: Path) -> None:
    """Why test_config_keys.py exists: the loader accepts a file whose key it does not know."""
    def misspell(data: dict) -> None:
        sharing = data["sharing"]["timeSlicing"]
        sharing["renameByDefualt"] = sharing.pop("renameByDefault")

    run = run_changed(device_plugin, tmp_path, misspell)
    assert past_the_loader(run), run.output[-600:]
