"""Where things are: the user's workspace (environments, profiles, policies, stacks) and the data that ships
inside the package (catalog, chart values, CRD schemas, templates)."""

from __future__ import annotations

import os
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

from gpushare.core.errors import GpushareError, Problem


def package_data(*parts: str) -> Traversable:
    """A file shipped in the package's data folder (read with `.read_text()`; never written)."""
    return files("gpushare").joinpath("data", *parts)


def package_data_path(*parts: str) -> Path:
    """The same as a path, for readers that need one (jsonschema, Pulumi): packages are installed unzipped."""
    return Path(str(package_data(*parts)))


def project_root() -> Path:
    env_root = os.environ.get("GPUSHARE_ROOT")
    if env_root:
        return Path(env_root)
    here = Path(__file__).resolve().parents[2]
    if (here / "environments").is_dir():
        return here
    return Path.cwd()


def environment_path(env: str) -> Path:
    """`--env` takes a name under environments/ or a path to a file."""
    if env.endswith((".yaml", ".yml")) or os.sep in env:
        return Path(env)
    path = project_root() / "environments" / f"{env}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in (project_root() / "environments").glob("*.yaml"))
        raise GpushareError(Problem(f"no environment named {env!r}", file=str(path),
                                    fix=f"use one of {', '.join(known) or '(none)'} or a path to a file"),
                            exit_code=2)
    return path


def default_profiles_dir(env_file: Path) -> Path:
    candidate = env_file.resolve().parent.parent / "profiles"
    return candidate if candidate.is_dir() else project_root() / "profiles"
