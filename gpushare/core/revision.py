"""The workspace as Git has it at one revision: what `gpushare check --base REF` reads of the change's base.

Files are read with `git ls-tree` and `git cat-file`, never from a checkout, so the working tree is left alone.
Symbolic links inside the repository are followed (this checkout links `profiles/` and `policies/guardrails.yaml`
into the package); a link out of the repository is refused, as its target is not under review."""

from __future__ import annotations

import os
import posixpath
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpushare.core.errors import GpushareError, Problem

MAX_LINKS = 8  # symbolic links followed inside the Git tree, per path
_LINK = "120000"
_TREE = "040000"


def _problem(message: str, fix: str) -> GpushareError:
    return GpushareError(Problem(message, path="--base", fix=fix), exit_code=2)


def _git(top: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "GIT_LITERAL_PATHSPECS": "1"}  # a file name is a name, never a glob
    try:
        return subprocess.run(["git", "-C", str(top), *args], capture_output=True, timeout=60, check=False, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        raise _problem(f"comparing with a base needs Git, which cannot run here: {exc}",
                       "install git, or leave --base out") from None


@dataclass(frozen=True)
class Revision:
    """One commit of the Git repository a workspace lies in: `ref` as the user spelt it, `commit` its id."""

    top: Path  # the repository's work tree
    ref: str
    commit: str

    @classmethod
    def of(cls, ref: str, folder: Path) -> Revision:
        """The commit `ref` names in the repository holding `folder`; exit 2, naming the ref and the fix, when
        there is none."""
        if not ref or ref.startswith("-"):
            raise _problem(f"{ref[:60]!r} is not a Git revision",
                           "give the branch the change merges into, e.g. --base origin/main")
        found = _git(folder, "rev-parse", "--show-toplevel")
        if found.returncode != 0:
            raise _problem(f"{folder} is not in a Git work tree, so there is no base to compare with",
                           "run check in the workspace's Git checkout (`git init` makes one), or leave --base out")
        top = Path(os.fsdecode(found.stdout.strip()))
        commit = _git(top, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
        if commit.returncode != 0:
            raise _problem(f"{ref[:60]!r} names no commit of the repository {top}",
                           "fetch the base branch first (git fetch origin main) and name it, e.g. --base origin/main")
        return cls(top, ref, commit.stdout.decode().strip())

    def relative(self, path: Path) -> str | None:
        """`path` (of the working tree) as a path inside the repository, or None where it lies outside. As spelt
        (a link inside the tree is followed at the commit instead), else with the folders above it resolved."""
        top = self.top.resolve()
        spelt = Path(os.path.normpath(path.absolute()))
        for candidate in (spelt, spelt.parent.resolve() / spelt.name):
            if candidate.is_relative_to(top):
                return candidate.relative_to(top).as_posix()
        return None

    def _entry(self, rel: str) -> tuple[str, str] | None:
        """(mode, object) of one path with no link above it, or None where it does not exist at the commit."""
        out = _git(self.top, "ls-tree", "-z", self.commit, "--", rel).stdout.split(b"\0")[0]
        if not out:
            return None
        meta, _, _ = out.partition(b"\t")
        mode, _, rest = meta.decode().partition(" ")
        return mode, rest.partition(" ")[2]

    def _blob(self, obj: str) -> bytes:
        return _git(self.top, "cat-file", "blob", obj).stdout

    def resolve(self, rel: str) -> tuple[str, str, str] | None:
        """(mode, object, path) of `rel` at the commit, every symbolic link on the way followed; None where nothing
        is there (or a link leads nowhere)."""
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        done: list[str] = []
        links = 0
        while parts:
            name = parts.pop(0)
            if name == "..":
                if not done:
                    raise _problem(f"{rel} at {self.ref} leads out of the repository", "keep the workspace's files "
                                   "(and what their links name) inside the repository")
                done.pop()
                continue
            current = "/".join([*done, name])
            entry = self._entry(current)
            if entry is None:
                return None
            mode, obj = entry
            if mode == _LINK:
                links += 1
                if links > MAX_LINKS:
                    raise _problem(f"{rel} at {self.ref} is a chain of more than {MAX_LINKS} links", "link it directly")
                target = os.fsdecode(self._blob(obj))
                if posixpath.isabs(target):
                    raise _problem(f"{current} at {self.ref} is a link out of the repository ({target})",
                                   "keep the workspace's files (and what their links name) inside the repository")
                parts = [*target.split("/"), *parts]
                continue
            if parts and mode != _TREE:
                return None
            done.append(name)
        if not done:
            return _TREE, f"{self.commit}^{{tree}}", ""
        path = "/".join(done)
        entry = self._entry(path)
        return None if entry is None else (*entry, path)

    def read(self, rel: str) -> str | None:
        """A file's text at the commit, links followed; None where it did not exist there (or is a folder)."""
        found = self.resolve(rel)
        if found is None or found[0] == _TREE:
            return None
        return self._blob(found[1]).decode("utf-8", errors="replace")

    def exists(self, rel: str) -> bool:
        return self.resolve(rel) is not None

    def names(self, rel: str) -> list[str]:
        """The names in a folder at the commit, links to it followed; empty where there is no such folder."""
        found = self.resolve(rel)
        if found is None or found[0] != _TREE:
            return []
        listing = _git(self.top, "ls-tree", "-z", "--name-only", self.commit, "--",
                       f"{found[2]}/" if found[2] else ".").stdout
        return [os.fsdecode(item).rsplit("/", 1)[-1] for item in filter(None, listing.split(b"\0"))]

    def copy(self, rel: str, dest: Path, limit: int = 2000) -> int:
        """Write `rel` (a file, or a folder with everything below it) as it is at the commit to `dest`, links
        followed and written as what they lead to; the number of files written (at most `limit`)."""
        found = self.resolve(rel)
        if found is None:
            return 0
        mode, obj, path = found
        if mode != _TREE:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(self._blob(obj))
            return 1
        dest.mkdir(parents=True, exist_ok=True)
        written = 0
        for name in self.names(path):
            if written >= limit:
                raise _problem(f"{rel} at {self.ref} holds more than {limit} files", "keep the workspace small")
            written += self.copy(f"{path}/{name}" if path else name, dest / name, limit - written)
        return written
