"""Pulumi stack files (`Pulumi.<stack>.yaml`) of the workspace: which stack deploys which environment, and its
`gpushare:*` settings. Read by the preview, the policy pack and `gpushare check`; the Pulumi CLI is not needed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.files import load_yaml_file
from gpushare.core.paths import project_root


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
            target = Path(str(config.get("gpushare:environment", "")))
            target = target if target.is_absolute() else root / target
            if target.exists() and target.resolve() == path.resolve():
                return name, config, []
        config = {"gpushare:environment": str(path.resolve()), "gpushare:monitoring": {"mode": "install"}}
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
    data = load_yaml_file(path, "stack file")[1] or {}
    config = data.get("config") if isinstance(data, dict) else None
    if not isinstance(config, dict):
        raise GpushareError(Problem("a stack file needs a config: mapping", file=str(path),
                                    fix="start from Pulumi.dev.yaml"), exit_code=2)
    return path.name[len("Pulumi."):-len(".yaml")], config, []
