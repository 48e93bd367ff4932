"""Running NVIDIA's own programs on what gpushare renders: finding them, the environment files to render, and
running many short calls at once.

The programs are found in $GPUSHARE_NVIDIA_TOOLS (a directory, or its bin/), then where `make nvidia-bins`
(tools/gobuild.sh) builds them from their Go modules, then on PATH (`make test` puts ../shared/nvidia-tools/bin
there where it exists). Where none has them but Go is installed, the first test that needs one builds it (minutes,
once per machine); only without Go do the tests skip, saying so.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TOOLS_VARIABLE = "GPUSHARE_NVIDIA_TOOLS"
MIG_PARTED = "nvidia-mig-parted"
DEVICE_PLUGIN = "nvidia-device-plugin"
GOBUILD = ROOT / "tools" / "gobuild.sh"
# binary -> (tools/gobuild.sh's name for the program, the tools/versions.env key of its version)
BUILT = {MIG_PARTED: ("mig-parted", "MIG_PARTED_VERSION"),
         DEVICE_PLUGIN: ("k8s-device-plugin", "DEVICE_PLUGIN_VERSION")}
# Shipped environments, fixture environments, and environment-shaped test data anywhere under tests/.
ENVIRONMENT_GLOBS = ("environments/*.yaml", "tests/**/*.yaml")


def built_tool(name: str) -> Path:
    """Where tools/gobuild.sh puts NAME at the version tools/versions.env pins."""
    from tests.cluster.bins import cache_dir, versions

    program, key = BUILT[name]
    return cache_dir() / f"{program}-{versions()[key]}" / name


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_tool(name: str) -> Path | None:
    """$GPUSHARE_NVIDIA_TOOLS/NAME (or its bin/NAME) first, then the build from NVIDIA's Go module, then PATH."""
    folder = os.environ.get(TOOLS_VARIABLE)
    if folder:
        for candidate in (Path(folder) / name, Path(folder) / "bin" / name):
            if _executable(candidate):
                return candidate
    built = built_tool(name)
    if _executable(built) and (built.parent / ".built").exists():
        return built
    found = shutil.which(name)
    return Path(found) if found else None


def require_tool(name: str) -> Path:
    found = find_tool(name)
    if found is not None:
        return found
    if shutil.which("go") is None:
        pytest.skip(f"{name} not found in ${TOOLS_VARIABLE}, {built_tool(name).parent} or on PATH, and Go is not "
                    "installed to build it from NVIDIA's module (`make nvidia-bins`; see docs/nvidia-tools.md)")
    done = subprocess.run([str(GOBUILD), BUILT[name][0]], capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0 or find_tool(name) is None:
        pytest.fail(f"building {name} with tools/gobuild.sh {BUILT[name][0]} failed:\n{done.stderr[-4000:]}")
    return find_tool(name)  # type: ignore[return-value]


def _is_environment(path: Path) -> bool:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return False
    return isinstance(data, dict) and {"name", "clusters", "pools"} <= set(data)


def _renders_for_nvidias_programs(path: Path) -> bool:
    """An environment with a device-plugin cluster: one whose clusters all allocate through DRA (the DRA driver's
    tests' tests/cluster/dra-partitionable.yaml) renders no device-plugin config and no MIG layout to parse."""
    data = yaml.safe_load(path.read_text()) or {}
    return any(c.get("gpu_allocation", "device-plugin") == "device-plugin" for c in data.get("clusters") or [])


def environment_files() -> list[Path]:
    found = {p for pattern in ENVIRONMENT_GLOBS for p in ROOT.glob(pattern) if "/roles/" not in p.as_posix()}
    return sorted(p for p in found if _is_environment(p) and _renders_for_nvidias_programs(p))


ENVIRONMENT_FILES = environment_files()
ENVIRONMENT_IDS = [p.relative_to(ROOT).as_posix() for p in ENVIRONMENT_FILES]


@functools.cache
def rendered(env_file: Path) -> Mapping[str, str]:
    """Everything gpushare renders for one environment file, by relative path."""
    from gpushare.core.paths import find_workspace
    from gpushare.core.resolve import resolve
    from gpushare.render.fleet import render_fleet

    with pytest.MonkeyPatch.context() as patch:
        # Each file under the policies of its own workspace; test data outside any workspace under the checkout's.
        patch.setenv("GPUSHARE_ROOT", str(find_workspace(env_file.parent) or ROOT))
        return render_fleet(resolve(env_file)).files


def nvidia_files(env_file: Path) -> dict[str, str]:
    """The rendered files NVIDIA's programs read: mig-parted's config and one device-plugin config per profile."""
    return {rel: text for rel, text in rendered(env_file).items() if rel == "mig-parted/config.yaml" or
            (rel.startswith("device-plugin/") and rel.endswith(".yaml"))}


@dataclass(frozen=True)
class Run:
    args: tuple[str, ...]
    returncode: int | None  # None: still running when the time was up, so past every check looked at
    output: str


def run_tool(args: Sequence[str | Path], timeout: float = 20) -> Run:
    """One call with a bare environment, so that no MIG_STRATEGY or CONFIG_FILE of the caller's leaks in."""
    argv = tuple(str(a) for a in args)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/nonexistent"}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired as err:
        return Run(argv, None, _text(err.stdout) + _text(err.stderr))
    return Run(argv, done.returncode, done.stdout + done.stderr)


def _text(data: Any) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def run_all(calls: Sequence[Sequence[str | Path]]) -> list[Run]:
    """Each call takes milliseconds; a few threads keep a whole environment's checks well under a second."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(run_tool, calls))


def write_all(folder: Path, files: Mapping[str, str]) -> dict[str, Path]:
    out = {}
    for rel, text in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        out[rel] = path
    return out
