"""Fixtures of the unit tests (tests/unit/ mirrors gpushare/): every module here runs in the frozen workspace
(tests/conftest.py); these give a test a working directory outside it, or a brownfield cluster imported into a
workspace of its own."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpushare.cli.init import write_workspace
from tests.unit.ops.brownfield.helpers import CLUSTERS, ENV, cli


@pytest.fixture
def outside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory in no workspace, with GPUSHARE_ROOT unset."""
    monkeypatch.delenv("GPUSHARE_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def workspace(outside: Path) -> Path:
    write_workspace(outside / "gpu-fleet")
    return outside / "gpu-fleet"


@pytest.fixture
def imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], tuple[Path, dict[str, Any]]]:
    """Import a fixture cluster into a new workspace; (workspace, the import's JSON). GPUSHARE_ROOT points there."""

    def run(name: str) -> tuple[Path, dict[str, Any]]:
        workspace = tmp_path / name
        write_workspace(workspace)
        code, out = cli("import", "--from", str(CLUSTERS / name), "--env", ENV, "--out", str(workspace))
        assert code == 0, out
        monkeypatch.setenv("GPUSHARE_ROOT", str(workspace))
        return workspace, out

    return run
