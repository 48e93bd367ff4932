"""Running NVIDIA's own programs on what gpushare renders: finding them, the environment files to render, and
running many short calls at once.

The programs are found in $GPUSHARE_NVIDIA_TOOLS (a directory, or its bin/) or on PATH; `make test` puts
../shared/nvidia-tools/bin on PATH where it exists. Where they are absent the tests skip, saying so.
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
# Shipped environments, fixture environments, and environment-shaped test data anywhere under tests/.
ENVIRONMENT_GLOBS = ("environments/*.yaml", "tests/**/*.yaml")


def find_tool(name: str) -> Path | None:
    """$GPUSHARE_NVIDIA_TOOLS/NAME (or its bin/NAME) first, then PATH."""
    folder = os.environ.get(TOOLS_VARIABLE)
    if folder:
        for candidate in (Path(folder) / name, Path(folder) / "bin" / name):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
    found = shutil.which(name)
    return Path(found) if found else None


def require_tool(name: str) -> Path:
    found = find_tool(name)
    if found is None:
        pytest.skip(f"{name} not found on PATH or in ${TOOLS_VARIABLE}: these checks run NVIDIA's own program "
                    "(`make test` adds ../shared/nvidia-tools/bin to PATH; see docs/nvidia-tools.md)")
    return found


def _is_environment(path: Path) -> bool:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return False
    return isinstance(data, dict) and {"name", "clusters", "pools"} <= set(data)


def environment_files() -> list[Path]:
    found = {p for pattern in ENVIRONMENT_GLOBS for p in ROOT.glob(pattern) if "/roles/" not in p.as_posix()}
    return sorted(p for p in found if _is_environment(p))


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
