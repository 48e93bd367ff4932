"""The workspace: found by walking up to gpushare.yaml (GPUSHARE_ROOT overriding, never the package's own folder),
and the paths `ansible-env` gives. The marker (gpushare.yaml) is read, not only found: a binary marker, one that is
not YAML or names a version this gpushare does not know is refused (exit 2) before any other file of the workspace
is trusted."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core.errors import GpushareError
from gpushare.core.paths import (
    WORKSPACE_MARKER,
    find_workspace,
    package_ansible,
    package_collection,
    package_data_path,
    project_root,
)
from tests.conftest import ROOT, WORKSPACE

runner = CliRunner()
SKELETON = package_data_path("workspace")


# ---------------------------------------------------------------- discovery


def test_the_workspace_is_found_by_walking_up(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = workspace / "environments" / "drafts"
    deep.mkdir()
    monkeypatch.chdir(deep)
    assert project_root() == workspace.resolve()
    result = runner.invoke(app, ["validate", "--env", "dev"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert str(workspace.resolve() / "environments" / "dev.yaml") in result.output


def test_gpushare_root_wins_over_the_working_directory(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workspace)
    monkeypatch.setenv("GPUSHARE_ROOT", str(WORKSPACE))
    assert project_root() == WORKSPACE
    monkeypatch.setenv("GPUSHARE_ROOT", str(workspace / "nowhere"))
    with pytest.raises(GpushareError) as info:
        project_root()
    assert "GPUSHARE_ROOT" in info.value.problems[0].message


def test_outside_a_workspace_commands_say_how_to_make_one(outside: Path) -> None:
    with pytest.raises(GpushareError) as info:
        project_root()
    problem = info.value.problems[0]
    assert str(outside) in problem.message and "gpushare init" in (problem.fix or "")
    result = runner.invoke(app, ["validate", "--env", "dev", "--json"])
    assert result.exit_code == 2
    assert "gpushare init" in json.loads(result.stdout)["problems"][0]["fix"]


def test_never_the_package_location(outside: Path) -> None:
    """This checkout is a workspace, and the package lives in it: standing elsewhere must not find it."""
    import gpushare

    assert find_workspace(Path(gpushare.__file__).parent) == ROOT  # reachable from the package, yet...
    with pytest.raises(GpushareError):
        project_root()  # ...not used from outside


def test_the_checkout_is_a_workspace_and_its_defaults_are_the_package_s() -> None:
    assert find_workspace(ROOT / "gpushare" / "cli") == ROOT
    assert (ROOT / "profiles").resolve() == SKELETON / "profiles"
    assert (ROOT / "policies" / "guardrails.yaml").resolve() == SKELETON / "policies" / "guardrails.yaml"
    assert (ROOT / "policies" / "pack" / "__main__.py").resolve() == SKELETON / "policies" / "pack" / "__main__.py"
    assert (ROOT / "playbooks").resolve() == package_ansible()
    for part in ("environments", "demand"):
        assert (ROOT / "examples" / part).resolve() == package_data_path("examples", part)
    # The workspace ansible.cfg that init writes is this checkout's, less the paths of the checkout's own playbooks/
    # (a workspace's Ansible finds the installed package's: `gpushare ansible-env`).
    paths = ("collections_path =", "# The package's collection")
    checkout = [line for line in (ROOT / "ansible.cfg").read_text().split("[defaults]")[1].splitlines()
                if not line.startswith(paths)]
    assert (SKELETON / "ansible.cfg").read_text().split("[defaults]")[1].splitlines() == checkout


def test_a_virtualenv_inside_the_workspace_is_named_by_its_relative_path(outside: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's flow: the virtualenv is made in the new directory first (fleet/.venv), then init fills it."""
    target = outside / "fleet"
    (target / ".venv" / "bin").mkdir(parents=True)
    (target / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (target / ".git").mkdir()
    monkeypatch.setattr("sys.prefix", str(target / ".venv"))
    result = runner.invoke(app, ["init", "fleet"])
    assert result.exit_code == 0, result.output
    project = yaml.safe_load((target / "Pulumi.yaml").read_text())
    assert project["runtime"]["options"] == {"toolchain": "pip", "virtualenv": ".venv"}
    pack = yaml.safe_load((target / "policies" / "pack" / "PulumiPolicy.yaml").read_text())
    assert pack["runtime"]["options"] == {"toolchain": "pip", "virtualenv": "../../.venv"}
    assert (target / ".venv" / "pyvenv.cfg").read_text() == "home = /usr/bin\n" and (target / ".git").is_dir()
    assert (target / WORKSPACE_MARKER).is_file() and "activate the virtualenv" not in result.output
    assert not [p for p in outside.iterdir() if p.name != "fleet"]  # nothing left beside it


def test_ansible_env_points_at_the_installed_package(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shlex

    monkeypatch.chdir(workspace)
    result = runner.invoke(app, ["ansible-env"])
    assert result.exit_code == 0, result.output
    env = dict(shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in result.stdout.splitlines())
    assert env["ANSIBLE_CONFIG"] == str(workspace.resolve() / "ansible.cfg")
    # The package's collection comes first on the collections path, ahead of ansible-core's default places.
    first, *rest = env["ANSIBLE_COLLECTIONS_PATH"].split(os.pathsep)
    assert Path(first) / "ansible_collections" / "gpushare" / "fleet" == package_collection()
    assert rest and (package_collection("roles", "mig", "tasks", "main.yml")).is_file()
    assert (Path(env["GPUSHARE_PLAYBOOKS"]) / "site.yml").is_file()
    assert (package_collection("plugins", "inventory", "gpushare_fleet.py")).is_file()
    assert json.loads(runner.invoke(app, ["ansible-env", "--json"]).stdout) == env


def test_ansible_env_mitogen_names_mitogen_s_strategy_or_says_how_to_install_it(
        workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.chdir(workspace)
    result = runner.invoke(app, ["ansible-env", "--mitogen", "--json"])
    assert result.exit_code == 0, result.output
    env = json.loads(result.stdout)
    assert env["GPUSHARE_ANSIBLE_STRATEGY"] == "mitogen_free"
    assert (Path(env["ANSIBLE_STRATEGY_PLUGINS"]) / "mitogen_free.py").is_file()
    assert "ANSIBLE_STRATEGY_PLUGINS" not in json.loads(runner.invoke(app, ["ansible-env", "--json"]).stdout)
    monkeypatch.setitem(sys.modules, "ansible_mitogen", None)  # as if not installed
    missing = runner.invoke(app, ["ansible-env", "--mitogen"])
    assert missing.exit_code == 2
    assert "Mitogen is not installed" in missing.output and "gpushare[mitogen]" in missing.output
    assert "export" not in missing.stdout

# ---------------------------------------------------------------- the workspace marker


@pytest.fixture
def copied_workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("environments", "profiles", "policies"):
        shutil.copytree(ROOT / "tests" / "fixtures" / name, tmp_path / name)
    shutil.copy(ROOT / "gpushare.yaml", tmp_path / "gpushare.yaml")
    monkeypatch.delenv("GPUSHARE_ROOT", raising=False)
    monkeypatch.chdir(tmp_path / "environments")  # found by walking up
    return tmp_path


def test_the_marker_gpushare_init_writes_is_read(copied_workspace: Path) -> None:
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
def test_a_marker_gpushare_cannot_read_is_refused(copied_workspace: Path, what: str, data: bytes, said: str) -> None:
    (copied_workspace / "gpushare.yaml").write_bytes(data)
    result = runner.invoke(app, ["validate", "--env", "dev"])
    assert result.exit_code == 2, result.output
    assert "gpushare.yaml" in result.output and said in result.output and "fix" in result.output, result.output
