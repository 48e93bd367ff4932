"""`gpushare init DIR` makes the workspace a Git repository with a first commit of what it wrote (a fallback identity
on that one commit only where Git has none), makes none inside an existing repository, and carries on without git."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpushare.cli import app

runner = CliRunner()


@pytest.fixture
def outside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory in no workspace and no Git repository (Git looks no higher than it), whose Git has only
    the identity a test gives it."""
    monkeypatch.delenv("GPUSHARE_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout


def written(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and p.relative_to(root).parts[0] not in (".git", ".venv"))


def test_init_makes_a_repository_with_a_first_commit_of_what_it_wrote(outside: Path) -> None:
    (outside / "gitconfig").write_text("[user]\n\tname = Ada\n\temail = ada@example.net\n")
    fleet = outside / "fleet"
    (fleet / ".venv" / "bin").mkdir(parents=True)  # the README's flow: the virtualenv first, then init
    (fleet / ".venv" / "bin" / "python").write_text("#!/bin/sh\n")
    result = runner.invoke(app, ["init", "fleet"])
    assert result.exit_code == 0, result.output
    files = written(fleet)
    assert f"initialised a Git repository in fleet with a first commit of the {len(files)} files" in result.output
    assert "identity" not in result.output
    assert git(fleet, "log", "--format=%an <%ae> %s").splitlines() == ["Ada <ada@example.net> gpushare init: a new "
                                                                       "workspace"]
    assert sorted(git(fleet, "ls-files").splitlines()) == files
    assert ".gitignore" in files and not any(f.startswith(".venv") for f in git(fleet, "ls-files").splitlines())
    # What later runs write stays out of the next commits too.
    for rel in ("build/dev/fleet.json", ".venv/bin/python", ".gpushare/rollouts/dev/journal.jsonl"):
        assert git(fleet, "check-ignore", rel).strip() == rel
    assert git(fleet, "status", "--porcelain") == ""


def test_without_a_git_identity_the_first_commit_has_a_fallback_one_and_says_so(outside: Path) -> None:
    result = runner.invoke(app, ["init", "fleet"])
    assert result.exit_code == 0, result.output
    assert git(outside / "fleet", "log", "--format=%an <%ae>").strip() == "gpushare <gpushare@localhost>"
    assert "no identity configured" in result.output and "gpushare <gpushare@localhost>" in result.output
    # Only that one commit: no Git config was written.
    assert "gpushare@localhost" not in (outside / "fleet" / ".git" / "config").read_text()
    assert not (outside / "gitconfig").exists()


def test_inside_a_repository_init_makes_no_new_one(outside: Path) -> None:
    (outside / "gitconfig").write_text("[user]\n\tname = Ada\n\temail = ada@example.net\n")
    git(outside, "init", "-q")
    git(outside, "commit", "-q", "--allow-empty", "-m", "mine")
    result = runner.invoke(app, ["init", "infra/fleet"])
    assert result.exit_code == 0, result.output
    assert not (outside / "infra" / "fleet" / ".git").exists()
    assert git(outside, "log", "--format=%s").splitlines() == ["mine"]  # nothing committed for you
    assert f"lies inside the Git repository {outside}" in " ".join(result.output.split())
    assert "no new one was made" in result.output


def test_without_git_init_says_so_and_carries_on(outside: Path) -> None:
    empty = outside / "bin"
    empty.mkdir()
    result = runner.invoke(app, ["init", "fleet"], env={"PATH": str(empty)})
    assert result.exit_code == 0, result.output
    assert "git is not installed, so no Git repository was made" in result.output
    assert "git init && git add -A && git commit" in result.output
    assert (outside / "fleet" / "gpushare.yaml").is_file() and not (outside / "fleet" / ".git").exists()
    assert os.environ["PATH"] != str(empty)
