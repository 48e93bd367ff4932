"""The workspace: found by walking up to gpushare.yaml (GPUSHARE_ROOT overriding, never the package's own folder),
written by `gpushare init`, and its files' format versions (no apiVersion reads as v1; anything else is an error)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.cli.init import write_workspace
from gpushare.core.errors import GpushareError
from gpushare.core.guardrails import load_guardrails
from gpushare.core.paths import (
    WORKSPACE_MARKER,
    find_workspace,
    package_ansible,
    package_collection,
    package_data_path,
    project_root,
)
from gpushare.core.spec import load_environment, load_profile_file
from gpushare.planner.demand import load_demand
from gpushare.policy.waivers import load_waivers
from tests.conftest import ROOT, WORKSPACE

runner = CliRunner()
SKELETON = package_data_path("workspace")


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


# ---------------------------------------------------------------- file format versions

SAMPLES = {  # kind -> (a valid file of that kind, how it is loaded)
    "Environment": ("environments/dev.yaml", lambda p: load_environment(p)),
    "Guardrails": ("policies/guardrails.yaml", lambda p: load_guardrails(p)),
    "Waivers": ("policies/waivers.yaml", lambda p: load_waivers(p, load_guardrails(SKELETON / "policies" /
                                                                                   "guardrails.yaml"))),
    "Demand": (str(ROOT / "examples" / "demand" / "inference.yaml"), lambda p: load_demand(p)),
}


def _variant(tmp_path: Path, sample: str, **header: object) -> Path:
    """The sample file of a kind with its header replaced by `header` (first, so on line 1)."""
    source = Path(SAMPLES[sample][0])
    data = yaml.safe_load((source if source.is_absolute() else SKELETON / source).read_text()) or {}
    data = {**header, **{k: v for k, v in data.items() if k not in ("apiVersion", "kind")}}
    path = tmp_path / f"{sample.lower()}-{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("kind", SAMPLES)
def test_a_file_without_a_version_reads_as_v1(kind: str, tmp_path: Path) -> None:
    SAMPLES[kind][1](_variant(tmp_path, kind))
    SAMPLES[kind][1](_variant(tmp_path, kind, apiVersion="gpushare.io/v1", kind=kind))


@pytest.mark.parametrize("kind", SAMPLES)
def test_an_unknown_version_is_a_located_error(kind: str, tmp_path: Path) -> None:
    path = _variant(tmp_path, kind, apiVersion="gpushare.io/v2", kind=kind)
    with pytest.raises(GpushareError) as info:
        SAMPLES[kind][1](path)
    problem = info.value.problems[0]
    assert (problem.file, problem.path, problem.line) == (str(path), "apiVersion", 1)
    assert "gpushare.io/v2" in problem.message and "apiVersion: gpushare.io/v1" in (problem.fix or "")
    assert info.value.exit_code == 2


@pytest.mark.parametrize("kind", SAMPLES)
def test_a_wrong_kind_is_a_located_error(kind: str, tmp_path: Path) -> None:
    other = "Demand" if kind != "Demand" else "Environment"
    path = _variant(tmp_path, kind, apiVersion="gpushare.io/v1", kind=other)
    with pytest.raises(GpushareError) as info:
        SAMPLES[kind][1](path)
    problem = info.value.problems[0]
    assert (problem.file, problem.path) == (str(path), "kind")
    assert other in problem.message and f"kind: {kind}" in (problem.fix or "")


def test_guardrails_keep_their_old_version_field(tmp_path: Path) -> None:
    assert load_guardrails(_variant(tmp_path, "Guardrails", version=1))
    with pytest.raises(GpushareError, match="version"):
        load_guardrails(_variant(tmp_path, "Guardrails", version=2))


def test_profiles_carry_an_api_version_and_keep_kind_for_the_sharing_mode(tmp_path: Path) -> None:
    text = (SKELETON / "profiles" / "exclusive.yaml").read_text()
    assert "apiVersion: gpushare.io/v1" in text
    (tmp_path / "exclusive.yaml").write_text(text.replace("apiVersion: gpushare.io/v1\n", ""))
    assert load_profile_file(tmp_path / "exclusive.yaml")[0].kind == "exclusive"
    for bad, where in (("apiVersion: gpushare.io/v9", "apiVersion"), ("kind: SharingProfile", "kind")):
        wrong = text.replace("apiVersion: gpushare.io/v1", bad) if "apiVersion" in bad else \
            text.replace("kind: exclusive", bad)
        (tmp_path / "exclusive.yaml").write_text(wrong)
        with pytest.raises(GpushareError) as info:
            load_profile_file(tmp_path / "exclusive.yaml")
        assert info.value.problems[0].path == where and info.value.problems[0].fix


def test_shipped_files_carry_their_version() -> None:
    for path in [*SKELETON.rglob("*.yaml"), *(ROOT / "environments").glob("*.yaml"),
                 *(ROOT / "examples" / "demand").glob("*.yaml")]:
        if path.name.startswith(("Pulumi.", "PulumiPolicy.")):  # Pulumi's own project files
            continue
        assert yaml.safe_load(path.read_text())["apiVersion"] == "gpushare.io/v1", path
