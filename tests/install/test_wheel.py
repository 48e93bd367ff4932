"""The built wheel, installed outside the repository, runs the whole workflow in a workspace `gpushare init` writes:
what a user gets from `pip install gpushare`, with nothing read from this checkout."""

from __future__ import annotations

import json
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
# As the README runs it: render and preview share build/dev.
WORKFLOW = (["validate", "--env", "dev"], ["plan", "--env", "dev"], ["check", "--env", "dev"],
            ["render", "--env", "dev", "--out", "build/dev"], ["preview", "--env", "dev", "--out", "build/dev"])


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
    # Portable: no file names the virtualenv, the site-packages or this checkout.
    for rel in ("ansible.cfg", "Pulumi.yaml", "policies/pack/PulumiPolicy.yaml", "requirements.txt"):
        text = (ws / rel).read_text()
        assert str(venv) not in text and str(ROOT) not in text and str(tmp_path) not in text, rel
    # A colleague's clone elsewhere runs the same workflow, and the examples the docs use come from the wheel.
    clone = tmp_path / "elsewhere" / "fleet"
    shutil.copytree(ws, clone)
    for example in ("dra", "demand"):
        _run([gpushare, "init", "--example", example], clone, env)
    for args in (*WORKFLOW, ["plan", "--env", "examples/environments/dra.yaml"],
                 ["pack", "--demand", "examples/demand/inference.yaml", "--time-limit", "10", "--json"]):
        _run([gpushare, *args], clone, {**env, "COLUMNS": "200"})
    assert any((clone / "build" / "dev" / "manifests").iterdir()) and (clone / "build" / "dev" / "fleet.json").is_file()
    # Ansible finds the installed package's inventory plugin through `gpushare ansible-env`, from any directory.
    exported = _run([gpushare, "ansible-env", "--json"], clone, env).stdout
    ansible = {**env, **json.loads(exported)}
    assert Path(ansible["GPUSHARE_PLAYBOOKS"]).is_relative_to(venv)
    graph = _run([str(venv / "bin" / "python"), "-m", "ansible.cli.inventory", "-i", "environments/dev.yaml",
                  "--graph"], clone, ansible)
    assert "pool_" in graph.stdout, graph.stdout
    assert time.monotonic() - started < 180, "the install test should take well under two minutes"


def _readme_block() -> str:
    """The README's "Use it in your own repository" commands, as a user pastes them."""
    text = (ROOT / "README.md").read_text().split("## Use it in your own repository", 1)[1]
    return text.split("```sh\n", 1)[1].split("```", 1)[0]


def test_the_readme_block_works_pasted_into_a_fresh_shell(tmp_path: Path) -> None:
    """Run as written by bash from a directory holding the package (a wheel stands in for the checkout). pip gets
    no index: the dependencies come from this virtualenv's site-packages through PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("GPUSHARE_ROOT", "PYTHONPATH", "VIRTUAL_ENV")}
    wheel = _wheel(tmp_path, env)
    work = tmp_path / "work"
    work.mkdir()
    block = _readme_block()
    assert "./gpushare" in block and "init fleet" in block
    script = block.replace("./gpushare", str(wheel))
    shell = {**env, "PIP_NO_INDEX": "1", "PIP_NO_DEPS": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
             "PYTHONPATH": sysconfig.get_path("purelib"), "COLUMNS": "200",
             "PATH": os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                     if not Path(p, "gpushare").exists())}  # no gpushare on PATH to begin with
    done = subprocess.run(["bash", "-e", "-c", script], cwd=work, env=shell, text=True, capture_output=True,
                          timeout=600)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    fleet = work / "fleet"
    assert "environment dev" in done.stdout and (fleet / "gpushare.yaml").is_file()
    project = (fleet / "Pulumi.yaml").read_text()
    assert "virtualenv: \".venv\"" in project and str(work) not in project  # the workspace's own, by relative path
