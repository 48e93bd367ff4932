"""`gpushare init`: the workspace it writes validates, plans, renders and previews, holds every part and names no
path of the machine that made it; `--example`; a used directory is refused and an empty one filled. `gpushare init
DIR` makes the workspace a Git repository with a first commit of what it wrote (a fallback identity on that one
commit only where Git has none), makes none inside an existing repository, and carries on without git."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core.guardrails import load_guardrails
from gpushare.core.paths import (
    WORKSPACE_MARKER,
    package_data_path,
)
from gpushare.policy.waivers import load_waivers
from tests.conftest import ROOT

runner = CliRunner()
SKELETON = package_data_path("workspace")


# ---------------------------------------------------------------- init


def test_init_writes_a_workspace_that_validates_plans_renders_and_previews(workspace: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workspace)
    for args in (["validate", "--env", "dev"], ["plan", "--env", "dev"], ["check", "--env", "dev"],
                 ["render", "--env", "dev", "--out", "build/render"],
                 ["preview", "--env", "dev", "--out", "build/dev"]):
        result = runner.invoke(app, args, env={"COLUMNS": "200"})
        assert result.exit_code == 0, (args, result.output)
    assert (workspace / "build" / "render" / "fleet.json").is_file()
    assert any((workspace / "build" / "dev" / "manifests").iterdir())


def test_init_writes_every_part(workspace: Path) -> None:
    names = {str(p.relative_to(workspace)) for p in workspace.rglob("*") if p.is_file()}
    assert {"gpushare.yaml", "environments/dev.yaml", "policies/guardrails.yaml", "policies/waivers.yaml",
            "Pulumi.yaml", "Pulumi.dev.yaml", "infra/__main__.py", "ansible.cfg", ".gitignore",
            "schema/environment.schema.json"} <= names
    assert {p.name for p in (workspace / "profiles").iterdir()} == {p.name for p in (SKELETON / "profiles").iterdir()}
    project = yaml.safe_load((workspace / "Pulumi.yaml").read_text())
    assert project["name"] == "gpu-fleet" and project["main"] == "infra/" and project["runtime"]["name"] == "python"
    assert "{" not in (workspace / "ansible.cfg").read_text() + (workspace / "requirements.txt").read_text()
    assert {"policies/pack/PulumiPolicy.yaml", "policies/pack/__main__.py", "requirements.txt"} <= names
    assert (workspace / ".gitignore").read_text().split() == ["build/", ".venv/", ".gpushare/"]
    # The commented waivers example reads as no waivers.
    assert load_waivers(workspace / "policies" / "waivers.yaml", load_guardrails(workspace / "policies" /
                                                                                 "guardrails.yaml"))[0] == []


def _absolute_paths(text: str) -> list[str]:
    return [word for word in text.replace("=", " ").replace('"', " ").split() if word.startswith("/")]


def test_a_workspace_names_no_path_of_the_machine_that_made_it(workspace: Path) -> None:
    """A colleague's clone and CI use the files as they are: no virtualenv, site-packages or checkout path."""
    import sys
    from importlib.metadata import version

    import gpushare

    written = {rel: (workspace / rel).read_text() for rel in ("Pulumi.yaml", "ansible.cfg", "requirements.txt",
                                                            "policies/pack/PulumiPolicy.yaml", "infra/__main__.py")}
    for rel, text in written.items():
        assert _absolute_paths(text) == [], rel
        for machine in (sys.prefix, str(Path(gpushare.__file__).parent), str(ROOT)):
            assert machine not in text, (rel, machine)
    project = yaml.safe_load(written["Pulumi.yaml"])
    # This test's interpreter lives outside the workspace: Pulumi runs the python3 on PATH (the activated virtualenv).
    assert project["runtime"] == {"name": "python", "options": {"toolchain": "pip"}}
    pack = yaml.safe_load(written["policies/pack/PulumiPolicy.yaml"])
    assert pack["runtime"] == project["runtime"]
    ansible = written["ansible.cfg"]
    assert not [line for line in ansible.splitlines()
                if line.startswith(("roles_path", "library", "inventory_", "collections_path"))]
    assert 'eval "$(gpushare ansible-env)"' in ansible
    assert f"gpushare=={version('gpushare')}" in written["requirements.txt"].splitlines()


@pytest.mark.parametrize(("name", "files", "command"), [
    ("dra", ["examples/environments/dra.yaml"], ["plan", "--env", "examples/environments/dra.yaml"]),
    ("demand", ["examples/demand/inference.yaml", "examples/demand/training-cost.yaml"],
     ["pack", "--demand", "examples/demand/inference.yaml", "--time-limit", "10"]),
])
def test_init_example_adds_what_the_docs_use(workspace: Path, monkeypatch: pytest.MonkeyPatch, name: str,
                                             files: list[str], command: list[str]) -> None:
    monkeypatch.chdir(workspace)
    result = runner.invoke(app, ["init", "--example", name])
    assert result.exit_code == 0, result.output
    for rel in files:
        assert (workspace / rel).read_text() == (ROOT / rel).read_text()
    done = runner.invoke(app, [*command, "--json"])
    assert done.exit_code == 0, done.output
    # Never overwritten: a second run refuses and leaves the (edited) file as it is.
    (workspace / files[0]).write_text("# mine\n")
    again = runner.invoke(app, ["init", "--example", name])
    assert again.exit_code == 2 and "would overwrite" in again.output
    assert (workspace / files[0]).read_text() == "# mine\n"


def test_init_example_needs_a_known_name_and_a_workspace(outside: Path) -> None:
    unknown = runner.invoke(app, ["init", "--example", "nope", str(outside)])
    assert unknown.exit_code == 2
    nowhere = runner.invoke(app, ["init", "--example", "dra", str(outside)])
    assert nowhere.exit_code == 2 and "not a gpushare workspace" in nowhere.output
    assert not list(outside.iterdir())
    assert runner.invoke(app, ["init"]).exit_code == 2


def test_init_refuses_a_used_directory(outside: Path) -> None:
    used = outside / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["init", str(used)])
    assert result.exit_code == 2 and "not empty" in result.output
    assert [p.name for p in used.iterdir()] == ["notes.txt"]
    (outside / "file").write_text("x")
    assert runner.invoke(app, ["init", str(outside / "file")]).exit_code == 2


def test_init_fills_an_empty_directory(outside: Path) -> None:
    (outside / "empty").mkdir()
    result = runner.invoke(app, ["init", "empty"])
    assert result.exit_code == 0, result.output
    assert (outside / "empty" / WORKSPACE_MARKER).is_file()
    assert not [p for p in outside.iterdir() if p.name.startswith(".")]  # nothing left beside it

# ---------------------------------------------------------------- the Git repository init makes


@pytest.fixture
def outside_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
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


def test_init_makes_a_repository_with_a_first_commit_of_what_it_wrote(outside_git: Path) -> None:
    (outside_git / "gitconfig").write_text("[user]\n\tname = Ada\n\temail = ada@example.net\n")
    fleet = outside_git / "fleet"
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


def test_without_a_git_identity_the_first_commit_has_a_fallback_one_and_says_so(outside_git: Path) -> None:
    result = runner.invoke(app, ["init", "fleet"])
    assert result.exit_code == 0, result.output
    assert git(outside_git / "fleet", "log", "--format=%an <%ae>").strip() == "gpushare <gpushare@localhost>"
    assert "no identity configured" in result.output and "gpushare <gpushare@localhost>" in result.output
    # Only that one commit: no Git config was written.
    assert "gpushare@localhost" not in (outside_git / "fleet" / ".git" / "config").read_text()
    assert not (outside_git / "gitconfig").exists()


def test_inside_a_repository_init_makes_no_new_one(outside_git: Path) -> None:
    (outside_git / "gitconfig").write_text("[user]\n\tname = Ada\n\temail = ada@example.net\n")
    git(outside_git, "init", "-q")
    git(outside_git, "commit", "-q", "--allow-empty", "-m", "mine")
    result = runner.invoke(app, ["init", "infra/fleet"])
    assert result.exit_code == 0, result.output
    assert not (outside_git / "infra" / "fleet" / ".git").exists()
    assert git(outside_git, "log", "--format=%s").splitlines() == ["mine"]  # nothing committed for you
    assert f"lies inside the Git repository {outside_git}" in " ".join(result.output.split())
    assert "no new one was made" in result.output


def test_without_git_init_says_so_and_carries_on(outside_git: Path) -> None:
    empty = outside_git / "bin"
    empty.mkdir()
    result = runner.invoke(app, ["init", "fleet"], env={"PATH": str(empty)})
    assert result.exit_code == 0, result.output
    assert "git is not installed, so no Git repository was made" in result.output
    assert "git init && git add -A && git commit" in result.output
    assert (outside_git / "fleet" / "gpushare.yaml").is_file() and not (outside_git / "fleet" / ".git").exists()
    assert os.environ["PATH"] != str(empty)
