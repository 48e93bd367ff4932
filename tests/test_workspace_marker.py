"""The workspace marker (gpushare.yaml) is read, not only found: a binary marker, one that is not YAML or names a
version this gpushare does not know is refused (exit 2) before any other file of the workspace is trusted."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpushare.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("environments", "profiles", "policies"):
        shutil.copytree(ROOT / "tests" / "fixtures" / name, tmp_path / name)
    shutil.copy(ROOT / "gpushare.yaml", tmp_path / "gpushare.yaml")
    monkeypatch.delenv("GPUSHARE_ROOT", raising=False)
    monkeypatch.chdir(tmp_path / "environments")  # found by walking up
    return tmp_path


def test_the_marker_gpushare_init_writes_is_read(workspace: Path) -> None:
    result = runner.invoke(app, ["validate", "--env", "dev"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(("what", "data", "said"), [
    ("binary", b"\xff\xfe\x00\x01binary", "not UTF-8"),
    ("an unknown version", b"apiVersion: gpushare.io/v7\nkind: Workspace\n", "'gpushare.io/v7' is not a version"),
    ("no version", b"kind: Workspace\n", "None"),
    ("another kind", b"apiVersion: gpushare.io/v1\nkind: Environment\n", "kind: Workspace"),
    ("not YAML", b"apiVersion: [\n", "not valid YAML"),
    ("a list", b"- gpushare.io/v1\n", "kind: Workspace"),
])
def test_a_marker_gpushare_cannot_read_is_refused(workspace: Path, what: str, data: bytes, said: str) -> None:
    (workspace / "gpushare.yaml").write_bytes(data)
    result = runner.invoke(app, ["validate", "--env", "dev"])
    assert result.exit_code == 2, result.output
    assert "gpushare.yaml" in result.output and said in result.output and "fix" in result.output, result.output
