"""Snapshots: the files a revision of an environment resolves from (from the work tree or from Git), enough to
re-apply it later without Git."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.paths import default_profiles_dir

GIT_READ_TIMEOUT = 60  # seconds for one git ls-tree or show of a revision's files
GIT_STATE_TIMEOUT = 30  # seconds for git rev-parse HEAD, or git status of the environment's files


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=GIT_READ_TIMEOUT)
    if done.returncode != 0:
        raise GpushareError(Problem(f"git {' '.join(args)}: {done.stderr.strip()}", path="--previous",
                                    fix="give a commit of this repository that has the environment file"),
                            exit_code=2)
    return done.stdout


@dataclass(frozen=True)
class Snapshot:
    """The files a revision of an environment resolves from: enough to re-apply it without Git."""

    name: str  # the environment file's name
    text: str
    profiles: dict[str, str]
    group_vars: dict[str, str]

    @classmethod
    def of(cls, env_file: Path) -> Snapshot:
        profiles_dir = default_profiles_dir(env_file)
        group_vars = env_file.parent / "group_vars"
        return cls(
            name=env_file.name, text=env_file.read_text(),
            profiles={p.name: p.read_text() for p in sorted(profiles_dir.glob("*.yaml"))},
            group_vars={str(p.relative_to(group_vars)): p.read_text() for p in sorted(group_vars.rglob("*"))
                        if p.is_file()} if group_vars.is_dir() else {},
        )

    @classmethod
    def from_git(cls, root: Path, revision: str, env_file: Path) -> Snapshot:
        """The environment file and profiles as Git has them at `revision` (site settings as they are now)."""
        top = root.resolve()
        profiles_dir = default_profiles_dir(env_file).resolve()
        if not env_file.resolve().is_relative_to(top) or not profiles_dir.is_relative_to(top):
            raise GpushareError(Problem(f"{env_file} is not in the Git work tree at {root}", path="--previous",
                                        fix="give --previous only for environment files kept in the repository"),
                                exit_code=2)
        env_rel = env_file.resolve().relative_to(top).as_posix()
        prof_rel = profiles_dir.relative_to(top).as_posix()
        listed = _git(root, "ls-tree", "--name-only", f"{revision}:{prof_rel}").split()
        names = [n for n in listed if n.endswith(".yaml")]
        return cls(name=env_file.name, text=_git(root, "show", f"{revision}:{env_rel}"),
                   profiles={n: _git(root, "show", f"{revision}:{prof_rel}/{n}") for n in names},
                   group_vars=cls.of(env_file).group_vars)

    @property
    def fingerprint(self) -> str:
        """What resolution depends on (site settings in group_vars excluded)."""
        digest = hashlib.sha256(self.text.encode())
        for name, text in sorted(self.profiles.items()):
            digest.update(f"\0{name}\0{text}".encode())
        return digest.hexdigest()[:16]

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "text": self.text, "profiles": self.profiles, "group_vars": self.group_vars}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Snapshot:
        return cls(name=data["name"], text=data["text"], profiles=dict(data["profiles"]),
                   group_vars=dict(data.get("group_vars", {})))

    def materialize(self, directory: Path) -> Path:
        """environments/<name> (an inventory the plugin recognises) beside profiles/; returns the environment file."""
        shutil.rmtree(directory, ignore_errors=True)
        (directory / "profiles").mkdir(parents=True)
        env_dir = directory / "environments"
        files = {directory / "profiles" / name: text for name, text in self.profiles.items()}
        files |= {env_dir / "group_vars" / rel: text for rel, text in self.group_vars.items()}
        files[env_dir / self.name] = self.text
        top = directory.resolve()
        for target in files:
            # The journal checks each name (journal.py); this holds for a Snapshot made any other way too.
            if not target.resolve().is_relative_to(top) or target.is_symlink():
                raise GpushareError(Problem(f"snapshot file {target.relative_to(directory)} would be written "
                                            f"outside {directory}", file=str(directory),
                                            fix="repair the journal's snapshot names: plain file names only"),
                                    exit_code=2)
        for target, text in files.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        return env_dir / self.name


def git_revision(root: Path, paths: Iterable[Path] = ()) -> tuple[str, bool]:
    """HEAD's commit and whether the given files differ from it ("unknown" outside a Git work tree)."""
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True, timeout=GIT_STATE_TIMEOUT).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown", False
    inside = [str(p) for p in paths if p.resolve().is_relative_to(root.resolve())]
    if not inside:
        return rev, False
    status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", *inside],
                            capture_output=True, text=True, timeout=GIT_STATE_TIMEOUT)
    return rev, bool(status.stdout.strip())
