"""Pulumi stack files (`Pulumi.<stack>.yaml`) of the workspace: which stack deploys which environment, and its
`gpushare:*` settings. Read by the preview, the policy pack and `gpushare check`; the Pulumi CLI is not needed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.paths import check_inside_workspace, lexical_workspace, project_root
from gpushare.core.reading import load_yaml_file

ENVIRONMENT_KEY = "gpushare:environment"
OPERATOR_VALUES_KEY = "gpushare:operatorValues"  # the site's own GPU Operator values, added to gpushare's


def environment_file(value: Any, root: Path | None = None) -> Path:
    """The environment file a stack's `gpushare:environment` names, as every consumer reads it (the program, the
    policy pack, `gpushare check`): relative to the workspace root, or absolute."""
    path = Path(str(value))
    return path if path.is_absolute() else (root or project_root()) / path


def environment_escape(stack_file: Path, value: Any) -> Problem | None:
    """Why a stack file's `gpushare:environment` leads outside the stack file's workspace, or None: `check` judges
    environments/<env>.yaml, so a stack deploying a file elsewhere (`../`, an absolute path, a symbolic link) would
    deploy a file no check has judged."""
    workspace = lexical_workspace(stack_file)
    if workspace is None:
        return None  # a stack file named on the command line, outside every workspace
    target = environment_file(value, project_root())
    spelt = Path(os.path.normpath(target))
    real = target.resolve()
    if spelt.is_relative_to(workspace) and real.is_relative_to(workspace.resolve()):
        return None
    how = "through a symbolic link " if spelt.is_relative_to(workspace) else ""
    return Problem(f"{ENVIRONMENT_KEY} {str(value)[:200]!r} leads {how}outside the workspace {workspace} (to {real}): "
                   "the stack would deploy a file that `gpushare check` never judged", file=str(stack_file),
                   path=ENVIRONMENT_KEY, fix=f"name the environment file inside the workspace, e.g. {ENVIRONMENT_KEY}: "
                   f"environments/{stack_file.name[len('Pulumi.'):-len('.yaml')]}.yaml")


def stack_config(env: str) -> tuple[str, dict[str, Any], list[str]]:
    """Stack name, its config (from `Pulumi.<env>.yaml`), and notes. `env` names a stack, or is a path to a
    `Pulumi.<stack>.yaml` or to an environment file (previewed with the stack that names it, if one does)."""
    root = project_root()
    stacks = sorted(root.glob("Pulumi.*.yaml"))
    known = [p.name[len("Pulumi."):-len(".yaml")] for p in stacks]
    if env.endswith((".yaml", ".yml")) or os.sep in env:
        path = Path(env)
        if path.name.startswith("Pulumi."):
            return _read_stack(path)
        if not path.exists():
            raise GpushareError(Problem("file not found", file=str(path), fix="check the path"), exit_code=2)
        for candidate in stacks:
            name, config, _ = _read_stack(candidate)
            target = environment_file(config.get(ENVIRONMENT_KEY, ""), root)
            if target.exists() and target.resolve() == path.resolve():
                return name, config, []
        config = {ENVIRONMENT_KEY: str(path.resolve()), "gpushare:monitoring": {"mode": "install"}}
        return path.stem, config, [
            f"no stack names {path}: previewed as stack {path.stem!r} with an installed monitoring stack and no "
            "cloud cluster settings"]
    path = root / f"Pulumi.{env}.yaml"
    if not path.exists():
        raise GpushareError(Problem(f"no stack named {env!r}", file=str(path),
                                    fix=f"use one of {', '.join(known) or '(none)'}, or add Pulumi.{env}.yaml"),
                            exit_code=2)
    return _read_stack(path)


def _read_stack(path: Path) -> tuple[str, dict[str, Any], list[str]]:
    check_inside_workspace(path, "stack file")
    data = load_yaml_file(path, "stack file")[1] or {}
    config = data.get("config") if isinstance(data, dict) else None
    if not isinstance(config, dict):
        raise GpushareError(Problem("a stack file needs a config: mapping", file=str(path),
                                    fix="start from Pulumi.dev.yaml"), exit_code=2)
    if ENVIRONMENT_KEY in config and (escape := environment_escape(path, config[ENVIRONMENT_KEY])) is not None:
        raise GpushareError(escape)
    return path.name[len("Pulumi."):-len(".yaml")], config, []
