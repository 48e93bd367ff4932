"""`gpushare init DIR`: a new workspace (environments, profiles, policies, Pulumi project and stack, ansible.cfg)
that validates, plans, renders and previews at once. The skeleton ships in the package (gpushare/data/workspace)."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer

from gpushare.cli.common import fail
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.paths import package_ansible, package_data_path

# Files of the skeleton written with values filled in; `gitignore` ships without its dot (package data skips those).
_FILLED = ("Pulumi.yaml", "ansible.cfg")


def init_command(
    directory: Annotated[Path, typer.Argument(help="Where to create the workspace: a new or empty directory.")],
) -> None:
    """Create a gpushare workspace in DIR: an example environment, the shipped profiles and guardrails, a Pulumi
    project with one stack, and ansible.cfg pointing at this gpushare's playbooks."""
    try:
        written = write_workspace(directory)
    except GpushareError as err:
        raise fail(err, False) from None
    print(f"created a gpushare workspace in {directory} ({len(written)} files). Next:\n"
          f"  cd {directory}\n  gpushare validate --env dev\n  gpushare plan --env dev\n"
          f"  gpushare preview --env dev --out build/dev")


def write_workspace(target: Path) -> list[str]:
    """Write the skeleton into `target` in one step (built beside it, then renamed); the files written."""
    from gpushare.core.files import replace_dir

    _refuse_used(target)
    replace_dir(lambda tmp: _fill(tmp, target.resolve().name), target)
    return sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())


def _refuse_used(target: Path) -> None:
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise GpushareError(Problem("the workspace directory names something that is not a directory",
                                    file=str(target), fix="name a new or empty directory"), exit_code=2)
    if target.is_dir() and any(target.iterdir()):
        raise GpushareError(Problem("the workspace directory is not empty; init writes only into a new or empty "
                                    "one, so nothing of yours is overwritten", file=str(target),
                                    fix="name a new directory, e.g. `gpushare init fleet`, or empty this one"),
                            exit_code=2)


def _fill(tmp: Path, name: str) -> None:
    skeleton = package_data_path("workspace")
    shutil.copytree(skeleton, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", *_FILLED))
    (tmp / "gitignore").rename(tmp / ".gitignore")
    project = (skeleton / "Pulumi.yaml").read_text()
    runtime = "runtime:\n  name: python\n"
    (tmp / "Pulumi.yaml").write_text(project.replace("name: fleet\n", f"name: {_project_name(name)}\n", 1)
                                     .replace(runtime, runtime + _runtime_options(), 1))
    ansible = (skeleton / "ansible.cfg").read_text()
    (tmp / "ansible.cfg").write_text(ansible.replace("{ansible}", str(package_ansible())))
    _write_schemas(tmp / "schema")


def _project_name(directory: str) -> str:
    """A Pulumi project name from the directory's (letters, digits, `-`, `_`, `.`)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", directory).strip("-.") or "gpushare"


def _runtime_options() -> str:
    """Pulumi runs the program with the Python that has this gpushare: its virtualenv, where there is one."""
    if sys.prefix == sys.base_prefix:
        return ""
    return f"  options:\n    toolchain: pip\n    virtualenv: {json.dumps(sys.prefix)}\n"


def _write_schemas(directory: Path) -> None:
    """The JSON schemas the files' `yaml-language-server` comments point at, for editors."""
    from gpushare.core.schemas import json_schemas

    directory.mkdir()
    for name, schema in json_schemas().items():
        (directory / name).write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
