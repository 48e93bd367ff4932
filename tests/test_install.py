"""The built wheel, installed outside the repository, runs the whole workflow in a workspace `gpushare init` writes:
what a user gets from `pip install gpushare`, with nothing read from this checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow
WORKFLOW = (["validate", "--env", "dev"], ["plan", "--env", "dev"], ["check", "--env", "dev"],
            ["render", "--env", "dev", "--out", "build/render"], ["preview", "--env", "dev", "--out", "build/dev"])


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, cwd=cwd, env=env, text=True, capture_output=True, timeout=300)
    assert result.returncode == 0, (cmd, result.stdout[-3000:], result.stderr[-3000:])
    return result


def _wheel(tmp_path: Path, env: dict[str, str]) -> Path:
    """Built from a copy of the sources, so the build leaves nothing in the checkout."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "gpushare", source / "gpushare", ignore=shutil.ignore_patterns("__pycache__"))
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", ".", "-w", str(tmp_path / "dist")], source, env)
    return next((tmp_path / "dist").glob("gpushare-*.whl"))


def _venv(tmp_path: Path, wheel: Path, env: dict[str, str]) -> Path:
    """A fresh virtualenv with the wheel; its dependencies come from this one's site-packages through a .pth line
    (.pth files found there are not processed, so this checkout's editable gpushare stays out)."""
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env)
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp_path,
                     env).stdout.strip())
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)], tmp_path,
         env)
    return venv


def test_the_wheel_runs_init_and_the_workflow_outside_the_repository(tmp_path: Path) -> None:
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k not in ("GPUSHARE_ROOT", "PYTHONPATH", "VIRTUAL_ENV")}
    venv = _venv(tmp_path, _wheel(tmp_path, env), env)
    work = tmp_path / "work"
    work.mkdir()
    where = _run([str(venv / "bin" / "python"), "-c", "import gpushare; print(gpushare.__file__)"], work, env)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout
    gpushare = str(venv / "bin" / "gpushare")
    _run([gpushare, "init", "ws"], work, env)
    ws = work / "ws"
    assert str(venv) in (ws / "ansible.cfg").read_text()  # the installed package's playbooks and roles
    assert str(ROOT) not in (ws / "ansible.cfg").read_text() + (ws / "Pulumi.yaml").read_text()
    for args in WORKFLOW:
        _run([gpushare, *args], ws, {**env, "COLUMNS": "200"})
    assert any((ws / "build" / "dev" / "manifests").iterdir())
    assert time.monotonic() - started < 120, "the install test should take well under a minute"
