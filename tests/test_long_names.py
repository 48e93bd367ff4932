"""A workspace or output name longer than the file system takes (with room for the temporary name of an atomic
write beside it) is a located error before any work, not an internal error; a long name that fits still works."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpushare.cli import app

runner = CliRunner()


@pytest.mark.parametrize("length", [300, 250])
def test_init_refuses_a_name_too_long(tmp_path: Path, length: int) -> None:
    result = runner.invoke(app, ["init", str(tmp_path / ("w" * length))])
    assert result.exit_code == 2, result.output
    assert "choose a shorter name" in result.output and "DIR" in result.output
    assert list(tmp_path.iterdir()) == []


def test_init_takes_a_long_name_that_fits(tmp_path: Path) -> None:
    result = runner.invoke(app, ["init", str(tmp_path / ("w" * 200))])
    assert result.exit_code == 0, result.output
    assert (tmp_path / ("w" * 200) / "gpushare.yaml").is_file()


def test_render_refuses_an_output_name_too_long(tmp_path: Path) -> None:
    result = runner.invoke(app, ["render", "--env", "dev", "--out", str(tmp_path / ("r" * 250))])
    assert result.exit_code == 2, result.output
    assert "--out" in result.output and "choose a shorter name" in result.output
    assert list(tmp_path.iterdir()) == []
