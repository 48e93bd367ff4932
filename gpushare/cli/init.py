"""`gpushare init DIR`: a new workspace (environments, profiles, policies and the policy pack, Pulumi project and
stack, ansible.cfg, requirements.txt) that validates, plans, renders and previews at once; `gpushare init --example
NAME` adds one of the examples the docs use. Skeleton and examples ship in the package (gpushare/data/workspace,
gpushare/data/examples).

A workspace holds no path of the machine that made it, so a colleague's clone and CI use it as it is: Pulumi runs
the program with the `python3` on PATH (an activated virtualenv), or with the workspace's own `.venv` where init ran
from one inside it; Ansible finds gpushare's playbooks, roles and plugins through the installed package
(`gpushare ansible-env`, and `gpushare rollout` by itself)."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer

from gpushare.cli.common import fail
from gpushare.core.errors import GpushareError, Problem, printable
from gpushare.core.files import (
    Unwritable,
    check_name_length,
    check_output_file,
    rename_noreplace,
    take_dir,
    write_files,
)
from gpushare.core.paths import WORKSPACE_MARKER, package_data_path, project_root

# Files of the skeleton written with values filled in; `gitignore` ships without its dot (package data skips those).
_FILLED = ("Pulumi.yaml", "PulumiPolicy.yaml", "requirements.txt")
# What a directory may already hold for init to fill it: a Git repository (cloned or `git init`) and the virtualenv
# gpushare runs from (the README's flow); init writes neither, so nothing of yours is overwritten.
_KEPT = (".git", ".venv")
# Examples the docs point at, by name: the files under gpushare/data/examples/, written to the same paths under
# the workspace's examples/, and what to run on them.
EXAMPLES: dict[str, tuple[tuple[str, ...], str]] = {
    "dra": (("environments/dra.yaml",),
            "gpushare plan --env examples/environments/dra.yaml (docs/dra.md)"),
    "demand": (("demand/inference.yaml", "demand/training-cost.yaml"),
               "gpushare pack --demand examples/demand/inference.yaml (docs/pack.md)"),
}


def init_command(
    directory: Annotated[Path | None, typer.Argument(
        help="Where to create the workspace: a new or empty directory (a .git or .venv in it stays). With --example: "
             "the workspace to add it to (default: the one you are in).")] = None,
    example: Annotated[str | None, typer.Option(
        "--example", help=f"Add an example to a workspace instead: {', '.join(EXAMPLES)}. Nothing is overwritten.")
                       ] = None,
) -> None:
    """Create a gpushare workspace in DIR: an example environment, the shipped profiles, guardrails and policy pack,
    a Pulumi project with one stack, ansible.cfg and requirements.txt; or, with --example NAME, add an example."""
    try:
        if example is not None:
            workspace = _workspace(directory)
            written = write_example(example, workspace)
            print(printable(f"added example {example} to {workspace}: {', '.join(written)}\n  try: "
                            f"{EXAMPLES[example][1]}", keep="\n"))
            return
        if directory is None:
            raise GpushareError(Problem("give the directory to create the workspace in", path="DIR",
                                        fix="e.g. `gpushare init fleet`, or `gpushare init --example dra` to add an "
                                            "example to the workspace you are in"), exit_code=2)
        written = write_workspace(directory)
    except GpushareError as err:
        raise fail(err, False) from None
    venv = _venv_inside(directory.resolve())
    setup = "" if venv is not None else (
        "  # Pulumi runs the program with the python3 on PATH: activate the virtualenv that has gpushare\n")
    # The directory as typed: shown as text, never as a terminal escape.
    print(printable(f"created a gpushare workspace in {directory} ({len(written)} files).\n"
                    f"{git_repository(directory)}\nNext:\n  cd {directory}\n{setup}  gpushare validate --env dev\n"
                    "  gpushare plan --env dev\n  gpushare preview --env dev --out build/dev\n"
                    "In a team and in CI: docs/workspace.md", keep="\n"))


# The commit identity where Git has none configured (user.name and user.email, or GIT_AUTHOR_*/GIT_COMMITTER_*):
# given to that one commit with `git -c`, never written into any Git config.
FALLBACK_IDENTITY = ("gpushare", "gpushare@localhost")
INIT_MESSAGE = "gpushare init: a new workspace"


def git_repository(directory: Path) -> str:
    """Make the new workspace a Git repository with a first commit of what init wrote (`.gitignore` keeps build/,
    .venv/ and .gpushare/ out), unless it lies inside a repository already or git is not installed. What happened,
    as one line: init goes on (exit 0) whatever Git does."""
    import subprocess

    git = shutil.which("git")
    redo = f"git init && git add -A && git commit -m '{INIT_MESSAGE}'"
    if git is None:
        return f"git is not installed, so no Git repository was made: install git, then in {directory}: {redo}"
    # Only this directory decides: a GIT_DIR or GIT_WORK_TREE of the calling shell (a hook) would point elsewhere.
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run([git, *args], cwd=directory, env=env, capture_output=True, text=True, timeout=120,
                                  check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            return subprocess.CompletedProcess([git, *args], 1, "", str(exc))

    def why(done: subprocess.CompletedProcess[str]) -> str:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        return lines[-1].strip() if lines else f"exit {done.returncode}"

    inside = run("rev-parse", "--show-toplevel")
    if inside.returncode == 0:
        return (f"{directory} lies inside the Git repository {inside.stdout.strip()}, so no new one was made: commit "
                f"the workspace there (git add {directory} && git commit)")
    made = run("init", "-q")
    if made.returncode != 0:
        return f"no Git repository was made (git init: {why(made)}); fix that, then in {directory}: {redo}"
    configured = all(run("-c", "user.useConfigOnly=true", "var", ident).returncode == 0
                     for ident in ("GIT_AUTHOR_IDENT", "GIT_COMMITTER_IDENT"))
    name, email = FALLBACK_IDENTITY
    identity = [] if configured else ["-c", f"user.name={name}", "-c", f"user.email={email}"]
    added = run("add", "-A", "--", ".")
    committed = run(*identity, "commit", "-q", "-m", INIT_MESSAGE) if added.returncode == 0 else added
    if committed.returncode != 0:
        return (f"initialised a Git repository in {directory}, but the first commit failed ({why(committed)}): "
                "commit the files yourself (git add -A && git commit)")
    count = len(run("ls-files", "-z").stdout.split("\0")) - 1
    line = (f"initialised a Git repository in {directory} with a first commit of the {count} files "
            "(.gitignore keeps build/, .venv/ and .gpushare/ out)")
    if identity:
        line += (f"; Git has no identity configured here, so that commit is by {name} <{email}>: set yours with "
                 "git config --global user.name and user.email (git commit --amend --reset-author redoes it)")
    return line


def write_workspace(target: Path) -> list[str]:
    """Write the skeleton into `target`: built beside it, then renamed into place in one step that fails where
    anything is there by then (into an existing directory holding only a .git or .venv, entry by entry, each
    rename failing where the entry exists); the files written. Of two inits of one directory at the same time,
    one writes the workspace and the other stops with exit 2, leaving it as the first wrote it."""
    _refuse_used(target)
    try:
        if not target.exists():
            take_dir(lambda tmp: _fill(tmp, target), target)
        else:
            _fill_existing(target)
    except FileExistsError:
        raise GpushareError(Problem(
            "another process wrote into the workspace directory while init was building the workspace (two "
            "`gpushare init` of one directory at once?); it was left as that process wrote it, and nothing of "
            "this init was kept", file=str(target),
            fix="use the workspace the other init made, or name another new directory"), exit_code=2) from None
    kept = {target / k for k in _KEPT}
    return sorted(str(p.relative_to(target)) for p in target.rglob("*")
                  if p.is_file() and not any(p.is_relative_to(k) for k in kept))


def _refuse_used(target: Path) -> None:
    check_name_length(target, "DIR")
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise GpushareError(Problem("the workspace directory names something that is not a directory",
                                    file=str(target), fix="name a new or empty directory"), exit_code=2)
    if target.is_dir() and any(p.name not in _KEPT for p in target.iterdir()):
        raise GpushareError(Problem("the workspace directory is not empty; init writes only into a new or empty "
                                    "one (a .git or .venv may be there), so nothing of yours is overwritten",
                                    file=str(target),
                                    fix="name a new directory, e.g. `gpushare init fleet`, or empty this one"),
                            exit_code=2)


def _fill_existing(target: Path) -> None:
    """Into a directory that holds only a .git or .venv: the skeleton is built beside it and its entries renamed
    in; if any rename fails, those already moved are taken out again."""
    import tempfile

    tmp: Path | None = None
    moved: list[Path] = []
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.resolve().parent))
        _fill(tmp, target)
        # Every init moves the same names in the same order: the first rename decides between two at once.
        for entry in sorted(tmp.iterdir()):
            rename_noreplace(entry, target / entry.name)
            moved.append(target / entry.name)
    except BaseException as exc:
        for path in moved:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        if isinstance(exc, OSError) and not isinstance(exc, FileExistsError):
            raise Unwritable(target, exc) from None
        raise
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _fill(tmp: Path, target: Path) -> None:
    from importlib.metadata import version

    skeleton = package_data_path("workspace")
    shutil.copytree(skeleton, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", *_FILLED))
    (tmp / "gitignore").rename(tmp / ".gitignore")
    venv = _venv_inside(target.resolve())
    project = (skeleton / "Pulumi.yaml").read_text()
    runtime = "runtime:\n  name: python\n"
    (tmp / "Pulumi.yaml").write_text(project.replace("name: fleet\n", f"name: {_project_name(target)}\n", 1)
                                     .replace(runtime, runtime + _runtime_options(venv), 1))
    pack = (skeleton / "policies" / "pack" / "PulumiPolicy.yaml").read_text()
    (tmp / "policies" / "pack" / "PulumiPolicy.yaml").write_text(
        pack.replace(runtime, runtime + _runtime_options(None if venv is None else Path("..", "..", venv)), 1))
    (tmp / "requirements.txt").write_text((skeleton / "requirements.txt").read_text().replace("{version}",
                                                                                              version("gpushare")))
    _write_schemas(tmp / "schema")


def _project_name(target: Path) -> str:
    """A Pulumi project name from the directory's (letters, digits, `-`, `_`, `.`)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", target.resolve().name).strip("-.") or "gpushare"


def _venv_inside(workspace: Path) -> Path | None:
    """The virtualenv running gpushare, relative to the workspace, where it lies inside it (as `.venv`)."""
    if sys.prefix == sys.base_prefix:
        return None
    prefix = Path(sys.prefix).resolve()
    return prefix.relative_to(workspace) if prefix.is_relative_to(workspace) else None


def _runtime_options(venv: Path | None) -> str:
    """Pulumi's pip toolchain; a virtualenv only by a path relative to the workspace. Without one Pulumi runs the
    `python3` on PATH, which is the activated virtualenv's (and `gpushare rollout` passes its own)."""
    lines = "  options:\n    toolchain: pip\n"
    return lines + (f"    virtualenv: {json.dumps(venv.as_posix())}\n" if venv is not None else "")


def _write_schemas(directory: Path) -> None:
    """The JSON schemas the files' `yaml-language-server` comments point at, for editors."""
    from gpushare.core.schemas import json_schemas  # lazy: pydantic models, ~0.2 s to import

    directory.mkdir()
    for name, schema in json_schemas().items():
        (directory / name).write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")


def _workspace(directory: Path | None) -> Path:
    workspace = directory if directory is not None else project_root()
    if not (workspace / WORKSPACE_MARKER).is_file():
        raise GpushareError(Problem(f"not a gpushare workspace (no {WORKSPACE_MARKER})", file=str(workspace),
                                    fix=f"create one first: gpushare init {workspace}"), exit_code=2)
    return workspace


def write_example(name: str, workspace: Path) -> list[str]:
    """Copy an example's files into the workspace's examples/; every file or none, and none may exist."""
    if name not in EXAMPLES:
        raise GpushareError(Problem(f"no example named {name!r}", path="--example",
                                    fix=f"use one of {', '.join(EXAMPLES)}"), exit_code=2)
    files = {Path("examples", rel): package_data_path("examples", rel).read_text() for rel in EXAMPLES[name][0]}
    taken = sorted(str(rel) for rel in files if (workspace / rel).exists() or (workspace / rel).is_symlink())
    if taken:
        raise GpushareError(Problem(f"the example would overwrite {', '.join(taken)}", file=str(workspace),
                                    fix="move those files away, or copy what you need from them by hand"),
                            exit_code=2)
    for rel in files:
        check_output_file(workspace / rel)
    write_files({workspace / rel: text for rel, text in files.items()})  # all or none (a full disk: none)
    return [os.fspath(rel) for rel in files]
