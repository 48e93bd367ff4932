"""Every file gpushare writes goes out through here: one writer for the YAML it produces for people (rendered
files, preview manifests, imported environments, plans), the checks of output paths before any work, and atomic
writers for everything it produces. Reading is gpushare.core.reading.

Writing: a file is written beside its target and renamed over it; a directory is built beside its target and
exchanged with it in one step (Linux renameat2 RENAME_EXCHANGE), so at every instant the target holds either the
whole old or the whole new content. Where the exchange is not available, the old directory is renamed aside
first; a leftover of that swap is detected and completed by the next write. Several directories replaced together
(a preview's two folders) are put in place with SIGINT, SIGTERM and SIGHUP held, and put back if one fails, so they
never hold two runs' output mixed; temporary files are removed on every error and signal (the CLI turns SIGTERM and
SIGHUP into the same exception as Ctrl-C)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from gpushare.core.errors import EXCERPT_CHARS, GpushareError, Problem

# Re-exported only for the tests that reach the reading side as files.X (tests/unit/core/test_files.py);
# gpushare's own modules import these from gpushare.core.reading.
from gpushare.core.reading import MAX_BYTES, StrictLoader, parse_yaml, parse_yaml_documents, read_text  # noqa: F401

# ---------------------------------------------------------------- writing YAML

# The line length of the repository's yamllint and ruff. PyYAML's width is where it starts looking for a space to
# break a long plain or quoted scalar at, so a line ends with the word that crosses it; literal blocks never break.
YAML_WIDTH = 120


class _YamlDumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """Safe dumping (libyaml where present) that writes a multi-line string as a literal block (`|`), so a rendered
    config in a ConfigMap or a PromQL expression reads in the file, and in a diff, as it was written."""


def _represent_str(dumper: Any, value: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_YamlDumper.add_representer(str, _represent_str)


def yaml_text(data: Any) -> str:
    """The one form of the YAML gpushare writes for people: block style, keys in the order given (never sorted),
    multi-line strings as literal blocks, non-ASCII text as it is (UTF-8, not escapes), scalars broken at
    YAML_WIDTH. Ends with a newline. (A file patched in place keeps its own layout: gpushare.ops.patch.)"""
    return yaml.dump(data, Dumper=_YamlDumper, sort_keys=False, default_flow_style=False, allow_unicode=True,
                     width=YAML_WIDTH)


# ---------------------------------------------------------------- checking output paths


def check_output_dir(out: Path, inputs: Iterable[Path] = (), option: str = "--out") -> None:
    """Before any work: the output directory can be created or replaced, and replacing it cannot touch input."""
    _check_output(out, inputs, option, want_dir=True)


def check_output_file(out: Path, inputs: Iterable[Path] = (), option: str = "--out") -> None:
    """Before any work: the output file can be written, and writing it cannot overwrite an input."""
    _check_output(out, inputs, option, want_dir=False)


# Room beside an output's name for the temporary names its atomic write uses (".NAME.XXXXXXXX", ".NAME.gpushare-old").
_TEMP_NAME_ROOM = 16


def check_name_length(path: Path, option: str) -> None:
    """A name the file system takes, with room for the temporary name an atomic write gives it: too long a name
    is a located error before any work, not a failure at the end (or an OSError from a mere exists())."""
    try:
        limit = os.pathconf(_existing_parent(path), "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    for part in path.absolute().parts:
        if len(os.fsencode(part)) > limit - _TEMP_NAME_ROOM:
            shown = part if len(part) <= 40 else f"{part[:20]}...({len(part)} characters)"
            raise GpushareError(Problem(f"{option}: the name {shown!r} is longer than this file system takes beside "
                                        f"the temporary name of an atomic write ({limit - _TEMP_NAME_ROOM} bytes)",
                                        file=str(path)[:EXCERPT_CHARS], fix="choose a shorter name"), exit_code=2)


def _check_output(out: Path, inputs: Iterable[Path], option: str, want_dir: bool) -> None:
    file = str(out)
    check_name_length(out, option)
    if out.exists() or out.is_symlink():
        if want_dir and not out.is_dir():
            raise GpushareError(Problem(f"{option} names an existing file, not a directory", file=file,
                                        fix="name a new or gpushare-written directory"), exit_code=2)
        if not want_dir and not out.is_file():
            kind = "a directory" if out.is_dir() else "not a regular file"
            raise GpushareError(Problem(f"{option} names {kind}", file=file, fix="name a file to write"),
                                exit_code=2)
    parent = _existing_parent(out)
    if not parent.is_dir():
        raise GpushareError(Problem(f"{option}: {parent} is not a directory", file=file, fix="check the path"),
                            exit_code=2)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise GpushareError(Problem(f"{option}: {parent} is not writable", file=file,
                                    fix="choose a path you can write"), exit_code=2)
    target = out.resolve()
    for source in inputs:
        src = source.resolve()
        if target == src or (want_dir and src.is_relative_to(target)):
            raise GpushareError(Problem(f"{option} would replace input {source}", file=file,
                                        fix="write the output somewhere else, e.g. build/"), exit_code=2)
        if src.is_dir() and target.is_relative_to(src):
            raise GpushareError(Problem(f"{option} lies inside the input directory {source}", file=file,
                                        fix="write the output outside it, e.g. build/"), exit_code=2)


def _existing_parent(path: Path) -> Path:
    parent = path.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent


# ---------------------------------------------------------------- writing atomically


def write_file(path: Path, text: str | bytes) -> None:
    """Write beside the target and rename over it: readers see the whole old or the whole new file."""
    write_with(path, lambda tmp: tmp.write_bytes(text if isinstance(text, bytes) else text.encode()))


def os_error(exc: OSError) -> tuple[int | None, str]:
    """(errno, reason) of an OSError, also of shutil.Error, which copytree raises with a list of (source,
    target, reason) in place of one errno."""
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) and exc.args[0]:
        reason = str(exc.args[0][0][-1])
        found = re.search(r"\[Errno (\d+)\]", reason)
        code = int(found.group(1)) if found else None
        return code, os.strerror(code) if code is not None else reason
    return exc.errno, exc.strerror or str(exc)


class Unwritable(GpushareError):
    """An output that could not be written (exit 2); on a full disk, one that says so and what to do. Raised after
    what the command had created is removed again."""

    def __init__(self, path: Path, exc: OSError) -> None:
        code, reason = os_error(exc)
        if code in (errno.ENOSPC, errno.EDQUOT):
            problem = Problem(f"cannot write: {reason} (the file system is full); nothing was written and "
                              "what this command had created is removed", file=str(path),
                              fix=f"free space on the file system that holds it (df -h {_existing_parent(path)}), "
                                  "or write the output somewhere else")
        else:
            problem = Problem(f"cannot write: {reason}", file=str(path),
                              fix="choose a path on a writable file system, e.g. build/")
        super().__init__(problem, exit_code=2)


def make_parents(path: Path) -> list[Path]:
    """Create the missing directories above `path`; those created, outermost first, for remove_made()."""
    missing: list[Path] = []
    parent = path.absolute().parent
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    made: list[Path] = []
    try:
        for directory in reversed(missing):
            try:
                directory.mkdir()
            except FileExistsError:
                if not directory.is_dir():
                    raise
                continue  # made by another process meanwhile: not ours to remove
            made.append(directory)
    except BaseException:
        remove_made(made)
        raise
    return made


def remove_made(made: list[Path]) -> None:
    """Remove directories make_parents() created, innermost first, where they are empty again."""
    for directory in reversed(made):
        try:
            directory.rmdir()
        except OSError:
            pass  # something else was put there meanwhile: it stays


def write_with(path: Path, produce: Callable[[Path], object]) -> None:
    """Let `produce` write a temporary file beside `path` (e.g. matplotlib's savefig), then rename it over `path`."""
    try:
        _write_with(path, produce)
    except OSError as exc:
        raise Unwritable(path, exc) from None


def _write_with(path: Path, produce: Callable[[Path], object]) -> None:
    made = make_parents(path)
    tmp: Path | None = None
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
        os.close(fd)
        tmp = Path(name)
        produce(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        mode = stat.S_IMODE(os.stat(path).st_mode) if path.exists() else 0o644
        os.chmod(tmp, mode)
        with held_signals():
            os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        remove_made(made)
        raise


def write_files(files: Mapping[Path, str | bytes]) -> None:
    """Several files, all or none: each is written beside its target first (directories created as needed), then
    all are renamed into place with signals held. A failure before the renames (a full disk) removes every
    temporary file and every directory this call created and leaves the targets as they were; a failure between
    two renames puts the files already replaced back (from hard links of the old ones) and removes new ones."""
    try:
        _write_files(files)
    except OSError as exc:
        raise Unwritable(_failed_path(exc, files), exc) from None


def _failed_path(exc: OSError, files: Mapping[Path, str | bytes]) -> Path:
    named = getattr(exc, "gpushare_path", None)
    return named if isinstance(named, Path) else next(iter(files))


def _write_files(files: Mapping[Path, str | bytes]) -> None:
    made: list[Path] = []
    temps: dict[Path, Path] = {}
    backups: dict[Path, Path] = {}
    done: list[Path] = []
    try:
        for path, data in files.items():
            try:
                made += make_parents(path)
                fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
                temps[path] = Path(name)
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data if isinstance(data, bytes) else data.encode())
                    handle.flush()
                    os.fsync(handle.fileno())
                os.chmod(name, stat.S_IMODE(os.stat(path).st_mode) if path.exists() else 0o644)
                if path.exists():  # the old file, to put back if a later rename fails
                    backup = path.with_name(f".{path.name}.gpushare-old")
                    backup.unlink(missing_ok=True)
                    try:
                        os.link(path, backup)
                        backups[path] = backup
                    except OSError as exc:
                        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EMLINK):
                            raise  # a file system without hard links goes on without the backup
            except OSError as exc:
                exc.gpushare_path = path  # type: ignore[attr-defined]
                raise
        with held_signals():
            for path, tmp in temps.items():
                os.replace(tmp, path)
                done.append(path)
    except BaseException:
        for path in reversed(done):
            if path in backups:
                os.replace(backups.pop(path), path)
            else:
                path.unlink(missing_ok=True)
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
        for backup in backups.values():
            backup.unlink(missing_ok=True)
        remove_made(made)
        raise
    for backup in backups.values():
        backup.unlink(missing_ok=True)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2); False where the system cannot."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _aside(target: Path) -> Path:
    return target.with_name(f".{target.name}.gpushare-old")


def complete_swap(target: Path) -> None:
    """Finish a directory swap that was interrupted between its two renames (the fallback path)."""
    old = _aside(target)
    if old.exists():
        if target.exists():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.rename(target)  # the new tree never arrived: the old one comes back


_HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP wait while the renames that put an output in place run: an interruption comes
    before them (nothing changed) or after them (all changed), never between two of them. Held by Python-level
    handlers, not the thread's signal mask: any thread of the process may receive a signal (the preview's Pulumi
    threads), but Python runs its handlers in the main thread, the one that writes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[signal.Signals] = []
    before = {sig: signal.signal(sig, lambda signum, frame: caught.append(signal.Signals(signum))) for sig in _HELD}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if caught:  # what the signal would have done, now that the output is whole
            handler = before[caught[0]]
            if callable(handler):
                handler(caught[0], None)
            elif handler in (signal.SIG_DFL, None):
                signal.raise_signal(caught[0])


def replace_dir(fill: Callable[[Path], None], target: Path) -> None:
    """Build a directory beside `target` with `fill`, then put it in place of `target` in one step."""
    replace_dirs({target: fill})


def replace_dirs(parts: dict[Path, Callable[[Path], None]]) -> None:
    """Several directories replaced together (a preview's manifests and its Helm values): each is built beside its
    target, then all are put in place with signals held; a failure between two puts the earlier ones back, so the
    targets never hold two runs' output mixed. Temporary trees are removed however it ends, short of SIGKILL."""
    try:
        _replace_dirs(parts)
    except OSError as exc:
        raise Unwritable(next(iter(parts)), exc) from None


def _replace_dirs(parts: dict[Path, Callable[[Path], None]]) -> None:
    built: list[tuple[Path, Path]] = []
    made: list[Path] = []
    try:
        for target, fill in parts.items():
            made += make_parents(target)
            complete_swap(target)
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
            built.append((target, tmp))
            fill(tmp)
            os.chmod(tmp, 0o755)
        leftovers = _put_in_place(built)
        for tree in leftovers:
            shutil.rmtree(tree, ignore_errors=True)
    except BaseException:
        for target, tmp in built:
            shutil.rmtree(tmp, ignore_errors=True)
            complete_swap(target)
        remove_made(made)  # the folders above the targets that this call created, e.g. build/ of build/dev
        raise


_RENAME_NOREPLACE = 1


def _renameat2() -> Any:
    """libc's renameat2, or None where the C library has none."""
    libc_name = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(libc_name, use_errno=True), "renameat2", None) if libc_name else None


def rename_noreplace(source: Path, target: Path) -> None:
    """Rename `source` to `target` only where `target` does not exist, in one step (Linux renameat2 with
    RENAME_NOREPLACE); FileExistsError where it does, however near in time another process made it. Where the
    system cannot, os.rename after a check, which an empty directory made in between would lose to."""
    renameat2 = _renameat2()
    if renameat2 is not None:
        rc = renameat2(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), _RENAME_NOREPLACE)
        if rc == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise (FileExistsError if err == errno.EEXIST else OSError)(err, os.strerror(err), str(target))
    if os.path.lexists(target):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target))
    try:
        os.rename(source, target)
    except OSError as exc:  # a directory onto a non-empty one made in between
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise FileExistsError(exc.errno, exc.strerror, str(target)) from None
        raise


def take_dir(fill: Callable[[Path], None], target: Path) -> None:
    """Build a new directory beside `target` with `fill`, then rename it to `target` only if nothing is there yet:
    of two processes making the same directory, one gets it whole and the other FileExistsError, its own tree and
    the folders above `target` that it created removed. An OSError (a full disk) is Unwritable, after the same
    cleanup."""
    made: list[Path] = []
    tmp: Path | None = None
    try:
        made = make_parents(target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        fill(tmp)
        os.chmod(tmp, 0o755)
        with held_signals():
            rename_noreplace(tmp, target)
    except BaseException as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        remove_made(made)
        if isinstance(exc, OSError) and not isinstance(exc, FileExistsError):
            raise Unwritable(target, exc) from None
        raise


def _put_in_place(built: list[tuple[Path, Path]]) -> list[Path]:
    """Every new tree in its target's place; the old trees, to remove. All or none."""
    done: list[tuple[Path, Path, str]] = []
    with held_signals():
        try:
            for target, tmp in built:
                if not target.exists():
                    tmp.rename(target)
                    done.append((target, tmp, "new"))
                elif _exchange(tmp, target):
                    done.append((target, tmp, "exchanged"))  # tmp now holds the old tree
                else:
                    old = _aside(target)
                    target.rename(old)
                    tmp.rename(target)
                    done.append((target, old, "aside"))
        except BaseException:
            for target, other, how in reversed(done):
                if how == "new":
                    target.rename(other)
                elif how == "exchanged":
                    _exchange(other, target)
                else:
                    shutil.rmtree(target, ignore_errors=True)
                    other.rename(target)
            raise
    return [other for _, other, how in done if how != "new"]
