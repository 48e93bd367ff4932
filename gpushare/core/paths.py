"""Where things are: the user's workspace (environments, profiles, policies, stacks) and the data that ships
inside the package (catalog, chart values, CRD schemas, templates)."""

from __future__ import annotations

import os
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.reading import parse_yaml, read_text


def package_data(*parts: str) -> Traversable:
    """A file shipped in the package's data folder (read with `.read_text()`; never written)."""
    return files("gpushare").joinpath("data", *parts)


def package_data_path(*parts: str) -> Path:
    """The same as a path, for readers that need one (jsonschema, Pulumi): packages are installed unzipped."""
    return Path(str(package_data(*parts)))


WORKSPACE_MARKER = "gpushare.yaml"  # at a workspace's root, as Pulumi.yaml marks a Pulumi project


COLLECTION = ("gpushare", "fleet")  # the Ansible collection the package ships (namespace, name)
DEFAULT_COLLECTIONS_PATH = "~/.ansible/collections:/usr/share/ansible/collections"  # ansible-core's own default


def package_collection(*parts: str) -> Path:
    """The Ansible collection gpushare.fleet shipped in the package: roles, modules, the inventory plugin and the
    playbooks, laid out as `ansible-galaxy collection build` takes it."""
    return Path(str(files("gpushare").joinpath("ansible_collections", *COLLECTION, *parts)))


def package_ansible(*parts: str) -> Path:
    """The playbooks shipped in the package (site.yml, rollout.yml, verify.yml), in the collection's playbooks/."""
    return package_collection("playbooks", *parts)


def ansible_environment(workspace: Path) -> dict[str, str]:
    """How Ansible finds gpushare's content on this machine: the workspace's ansible.cfg, and the installed package's
    collection first on the collections path (ANSIBLE_* settings win over the file), with the playbooks' folder.
    Found where the package is, so a workspace's files name no path of the machine that made them."""
    collections = os.environ.get("ANSIBLE_COLLECTIONS_PATH") or DEFAULT_COLLECTIONS_PATH
    return {"ANSIBLE_CONFIG": str(workspace / "ansible.cfg"),
            "ANSIBLE_COLLECTIONS_PATH": os.pathsep.join([str(package_collection().parents[2]), collections]),
            "GPUSHARE_PLAYBOOKS": str(package_ansible())}


# Mitogen's strategy (the PyPI package mitogen, gpushare's `mitogen` extra): the converge plays take their strategy
# from the extra var gpushare_strategy, else this environment variable, else `free`.
MITOGEN_STRATEGY = "mitogen_free"
STRATEGY_VARIABLE = "GPUSHARE_ANSIBLE_STRATEGY"


def mitogen_environment() -> dict[str, str]:
    """What runs the converge plays under Mitogen's `mitogen_free` strategy: its strategy plugins on Ansible's path,
    and the strategy named for the plays. Mitogen keeps one Python interpreter per host and sends each module once,
    instead of an ssh session and a module transfer per task."""
    try:
        import ansible_mitogen  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        raise GpushareError(Problem(
            "Mitogen is not installed in the Python that runs gpushare and Ansible", path="--mitogen",
            fix="pip install 'gpushare[mitogen]' (or run without --mitogen: the stock strategy does the same work)",
        ), exit_code=2) from None
    plugins = Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"
    return {"ANSIBLE_STRATEGY_PLUGINS": str(plugins), STRATEGY_VARIABLE: MITOGEN_STRATEGY}


def find_workspace(start: Path) -> Path | None:
    """The nearest directory at or above `start` holding the workspace marker, as Git and Pulumi find theirs."""
    start = start.resolve()
    return next((d for d in (start, *start.parents) if (d / WORKSPACE_MARKER).is_file()), None)


def lexical_workspace(path: Path) -> Path | None:
    """The workspace a path names by its spelling: the nearest directory above it, symbolic links not followed,
    that holds the workspace marker. None for a path outside every workspace (a file named on the command line)."""
    absolute = Path(os.path.normpath(path.absolute()))
    return next((d for d in absolute.parents if (d / WORKSPACE_MARKER).is_file()), None)


def outside_workspace(path: Path) -> tuple[Path, Path] | None:
    """(workspace, real path) where a path spelt inside a workspace really lies outside it, through a symbolic link
    (of the file or of a folder above it); None where it does not. What Git shows a reviewer is the link, not the
    file it leads to, and the machine that deploys may hold another file there than the one CI checked."""
    root = lexical_workspace(path)
    if root is None:
        return None
    real = real_path(path, "file")
    return None if real.is_relative_to(root.resolve()) else (root, real)


def real_path(path: Path, what: str) -> Path:
    """`path` with every symbolic link followed; a located error (exit 2) where the links loop (a link to itself,
    or two to each other), which Path.resolve reports as a RuntimeError or OSError, not as bad input."""
    try:
        return path.resolve()
    except (RuntimeError, OSError):
        raise GpushareError(Problem(
            f"{what} is a symbolic link in a loop: it leads back to itself, directly or through other links",
            file=str(path),
            fix="remove the link, or point it at a real file (ls -l shows where it leads)"), exit_code=2) from None


def check_inside_workspace(path: Path, what: str) -> None:
    """Refuse a workspace file that is read from outside its workspace (see outside_workspace)."""
    real_path(path, what)
    found = outside_workspace(path)
    if found is not None:
        root, real = found
        raise GpushareError(Problem(
            f"{what} is a symbolic link (or lies below one) that leads outside the workspace {root}, to {real}: "
            "a review sees only the link, and the machine that deploys may read another file there",
            file=str(path), fix=f"copy the file into the workspace in place of the link (cp --remove-destination "
            f"{real} {path}), or link only to files inside {root}"))


WORKSPACE_API = "gpushare.io/v1"
_MARKERS_READ: dict[tuple[str, int], None] = {}  # (path, mtime) of markers already checked in this process


def check_marker(root: Path) -> None:
    """The workspace marker is read like any workspace file: text, YAML, and a version this gpushare knows. A
    marker that is none of these is refused before any other file of the workspace is trusted (exit 2)."""
    path = root / WORKSPACE_MARKER
    try:
        key = (str(path), os.stat(path).st_mtime_ns)
    except OSError:
        key = (str(path), -1)
    if key in _MARKERS_READ:
        return
    try:
        data = parse_yaml(read_text(path, "workspace marker"), str(path))
    except GpushareError as err:
        raise GpushareError(err.problems, exit_code=2) from None
    fix = (f"write the marker `gpushare init` writes: apiVersion: {WORKSPACE_API} and kind: Workspace, on lines of "
           "their own")
    if not isinstance(data, dict) or data.get("kind") != "Workspace":
        raise GpushareError(Problem("not a gpushare workspace marker (no `kind: Workspace`)", file=str(path),
                                    path="kind", fix=fix), exit_code=2)
    version = data.get("apiVersion")
    if version != WORKSPACE_API:
        raise GpushareError(Problem(
            f"{str(version)[:60]!r} is not a version this gpushare reads ({WORKSPACE_API})", file=str(path),
            path="apiVersion", fix=f"install the gpushare release the workspace's requirements.txt names, or {fix}"),
            exit_code=2)
    _MARKERS_READ[key] = None


def project_root() -> Path:
    """The workspace: GPUSHARE_ROOT where set, else found by walking up from the working directory; never the
    package's own location, so an installed gpushare reads the user's files wherever it lives."""
    env_root = os.environ.get("GPUSHARE_ROOT")
    if env_root:
        if not Path(env_root).is_dir():
            raise GpushareError(Problem("GPUSHARE_ROOT does not name a directory", file=env_root,
                                        fix="point GPUSHARE_ROOT at a workspace (run `gpushare init DIR` to make "
                                            "one) or unset it"), exit_code=2)
        if (Path(env_root) / WORKSPACE_MARKER).exists():
            check_marker(Path(env_root))
        return Path(env_root)
    found = find_workspace(Path.cwd())
    if found is None:
        raise GpushareError(Problem(
            f"not inside a gpushare workspace: no {WORKSPACE_MARKER} in {Path.cwd()} or any directory above it",
            fix="run `gpushare init DIR` to create a workspace and work inside it, or set GPUSHARE_ROOT"),
            exit_code=2)
    check_marker(found)
    return found


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


def patch_path(path: Path, workspace: Path | None = None) -> str:
    """How a patch names `path`: relative to the workspace holding it (or `workspace`), so `git apply` works
    there; absolute where it lies outside."""
    path = path.resolve()
    root = (workspace or find_workspace(path.parent) or project_root()).resolve()
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
