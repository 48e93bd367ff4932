"""Brownfield fixtures: `kubectl get -o yaml` dumps of five clusters (clusters/<name>/), each imported into a fresh
workspace made by `gpushare init`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.cli.init import write_workspace

CLUSTERS = Path(__file__).parent / "clusters"
FIXTURES = ("default-operator", "timeslicing-mig", "not-taken-effect", "quotas-kueue", "default-and-custom")
ENV = "brown"

runner = CliRunner()


def cli(*args: str) -> tuple[int, Any]:
    """Run gpushare with --json; (exit code, the JSON it printed)."""
    result = runner.invoke(app, [*args, "--json"])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip() else None


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
