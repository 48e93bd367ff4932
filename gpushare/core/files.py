"""Every file gpushare reads or writes goes through here: one loader for the user's YAML files (environments,
profiles, guardrails, waivers, demand, stack settings) and atomic writers for everything it produces.

Reading: regular files only (a directory, FIFO or device is refused without opening it, so nothing blocks), at
most MAX_BYTES, UTF-8 with the offending byte named. YAML is read without surprises: `no`, `on`, `2026-02-30` and
`1:30` stay strings (YAML 1.1's boolean, timestamp and sexagesimal resolvers are dropped; true/false stay
booleans), integers are decimal (`010` is ten, not eight) and at most MAX_INT_DIGITS long, duplicate keys are
errors, and so are merge keys (`<<: *anchor`): a key a merge copies in has no line of its own in the mapping it
changes, so a reviewer of the diff would not see it (a tenant's trust, a quota, a rule lifted from non_waivable).

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
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from gpushare.core.errors import GpushareError, Problem

MAX_BYTES = 4 * 1024 * 1024  # the largest environment shipped is ~6 KB; a 4 MiB limit leaves room for any fleet
MAX_INT_DIGITS = 18  # every count, quota and id fits; a longer number is a typo or an attack
# Values a document may hold once its aliases are expanded (each alias counts as all it repeats). The largest input
# read, a 5,000-node cluster dump, holds about 3 million; a "billion laughs" file of a few hundred bytes holds 10^9
# and would exhaust memory wherever the values are walked (operator values merged, JSON written).
MAX_EXPANDED = 10_000_000

# ---------------------------------------------------------------- reading


def read_text(path: Path, what: str = "file", limit: int = MAX_BYTES) -> str:
    """The text of a regular UTF-8 file of at most `limit` bytes, or a located error (exit 2: the input cannot be
    used at all)."""
    file = str(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise GpushareError(Problem(f"{what} not found", file=file, fix="check the path or the name"),
                            exit_code=2) from None
    except NotADirectoryError:
        raise GpushareError(Problem(f"{what} not found: a parent of this path is a file", file=file,
                                    fix="check the path"), exit_code=2) from None
    except PermissionError:
        raise GpushareError(Problem(f"{what} cannot be read (permission denied)", file=file,
                                    fix="check the file's permissions"), exit_code=2) from None
    except OSError as exc:
        raise GpushareError(Problem(f"{what} cannot be read: {exc.strerror}", file=file, fix="check the path"),
                            exit_code=2) from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, socket or device)"
        raise GpushareError(Problem(f"{what} is {kind}", file=file, fix=f"name a regular YAML {what}"), exit_code=2)
    if st.st_size > limit:
        raise GpushareError(Problem(f"{what} is {st.st_size} bytes, above the limit of {limit}", file=file,
                                    fix="split it, or check that this is the file you meant"), exit_code=2)
    try:
        # O_NONBLOCK: if the path was swapped for a FIFO after the stat, opening still does not hang.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise GpushareError(Problem(f"{what} cannot be read: {exc.strerror}", file=file, fix="check the path"),
                            exit_code=2) from None
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise GpushareError(Problem(f"{what} is above the limit of {limit} bytes", file=file,
                                    fix="split it, or check that this is the file you meant"), exit_code=2)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise GpushareError(Problem(
            f"not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start} cannot be decoded", file=file, line=line,
            fix="save the file as UTF-8"), exit_code=2) from None


_Loader: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# YAML 1.2 core schema forms (what a reader of the file expects), replacing YAML 1.1's.
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT = re.compile(r"^[-+]?[0-9]+$")
_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
                    r"|\.(?:nan|NaN|NAN))$")
_DROPPED = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
            "tag:yaml.org,2002:timestamp"}


class DuplicateKey(Exception):
    def __init__(self, key: str, line: int) -> None:
        self.key, self.line = key, line


class MergeKey(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


_MERGE_TAG = "tag:yaml.org,2002:merge"


class ComplexKey(Exception):
    def __init__(self, kind: str, line: int) -> None:
        self.kind, self.line = kind, line


class NumberTooLong(Exception):
    def __init__(self, text: str, line: int) -> None:
        self.text, self.line = text, line


class AliasBomb(Exception):
    def __init__(self, line: int, recursive: bool) -> None:
        self.line, self.recursive = line, recursive


def _check_expansion(root: yaml.Node) -> None:
    """Count the values `root` expands to, each node once (aliases share their anchor's node, so the count is
    linear in the document even where the expansion is exponential); refuse more than MAX_EXPANDED, or a cycle."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        if key in sizes and not done:
            continue
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if not done:
            if key in open_nodes:
                raise AliasBomb(node.start_mark.line + 1, recursive=True)
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
            continue
        open_nodes.discard(key)
        sizes[key] = 1 + sum(sizes[id(c)] for c in children)
        if sizes[key] > MAX_EXPANDED:
            raise AliasBomb(node.start_mark.line + 1, recursive=False)


class StrictLoader(_Loader):
    """Safe loading (libyaml when present) with YAML 1.2 scalars, no duplicate keys, no merge keys and a bound on
    what aliases expand to."""

    yaml_implicit_resolvers: dict[str, list[tuple[str, re.Pattern[str]]]] = {}

    def construct_document(self, node: yaml.Node) -> Any:
        _check_expansion(node)
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:  # checked before the base class flattens the merge away
                raise MergeKey(key_node.start_mark.line + 1)
            if not isinstance(key_node, yaml.ScalarNode):  # `? [a, b]` or `? {a: 1}`: no field is named so
                raise ComplexKey("list" if isinstance(key_node, yaml.SequenceNode) else "mapping",
                                 key_node.start_mark.line + 1)
            key = key_node.value
            if key in seen:
                raise DuplicateKey(str(key), key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _resolvers() -> dict[str, list[tuple[str, re.Pattern[str]]]]:
    out: dict[str, list[tuple[str, re.Pattern[str]]]] = {}
    for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items():
        kept = [(tag, rx) for tag, rx in entries if tag not in _DROPPED]
        if kept:
            out[first] = kept
    # Inserted at the front in reverse order of precedence: an int is tried before a float.
    for tag, rx, firsts in (("tag:yaml.org,2002:float", _FLOAT, "-+0123456789."),
                            ("tag:yaml.org,2002:int", _INT, "-+0123456789"),
                            ("tag:yaml.org,2002:bool", _BOOL, "tTfF")):
        for ch in firsts:
            out.setdefault(ch, []).insert(0, (tag, rx))
    return out


StrictLoader.yaml_implicit_resolvers = _resolvers()


def _construct_int(loader: StrictLoader, node: yaml.ScalarNode) -> int:
    text = str(node.value)
    if not _INT.match(text):  # an explicit !!int tag on something else
        raise yaml.constructor.ConstructorError(None, None, f"{text!r} is not a decimal integer", node.start_mark)
    if len(text.lstrip("+-")) > MAX_INT_DIGITS:
        raise NumberTooLong(text, node.start_mark.line + 1)
    return int(text, 10)


StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
StrictLoader.add_constructor("tag:yaml.org,2002:bool", lambda loader, node: node.value in ("true", "True", "TRUE"))
StrictLoader.add_constructor("tag:yaml.org,2002:timestamp", StrictLoader.construct_yaml_str)
StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                             lambda loader, node: loader.construct_mapping(node, deep=True))


def parse_yaml(text: str, file: str) -> Any:
    """One YAML document, or a located error."""
    return _parsed(lambda: yaml.load(text, Loader=StrictLoader), file)  # noqa: S506 - a safe loader subclass


def parse_yaml_documents(text: str, file: str) -> list[Any]:
    """Every document of a YAML stream (`---` between them, as concatenated `kubectl get -o yaml` outputs), with
    the same rules and errors as one document; empty documents are left out."""
    documents = _parsed(lambda: list(yaml.load_all(text, Loader=StrictLoader)), file)  # noqa: S506 - as above
    return [d for d in documents if d is not None]


def _parsed(load: Callable[[], Any], file: str) -> Any:
    try:
        return load()
    except DuplicateKey as dup:
        raise GpushareError(Problem(f"key {dup.key!r} appears twice; YAML would keep only the last", file=file,
                                    line=dup.line, fix="remove one of them")) from None
    except MergeKey as merge:
        raise GpushareError(Problem("a YAML merge key (<<) copies keys in from an anchor, so what it sets has no line "
                                    "of its own here and a review of the change would not show it", file=file,
                                    line=merge.line, fix="write the keys out in this mapping (anchors and aliases "
                                    "of whole values stay allowed)")) from None
    except ComplexKey as key:
        raise GpushareError(Problem(f"a mapping key is a {key.kind} (a YAML complex key, `? ...`); every key gpushare "
                                    "reads is a plain name", file=file, line=key.line,
                                    fix="write the key as plain text, e.g. `name: value`")) from None
    except AliasBomb as bomb:
        what = ("an alias inside the value it names repeats it without end" if bomb.recursive else
                f"its aliases (*name) expand to more than {MAX_EXPANDED:,} values")
        raise GpushareError(Problem(f"YAML document too large once expanded: {what}", file=file, line=bomb.line,
                                    fix="write the values out, or repeat fewer of them through anchors and "
                                        "aliases")) from None
    except NumberTooLong as big:
        shown = big.text if len(big.text) <= 24 else f"{big.text[:12]}...({len(big.text)} digits)"
        raise GpushareError(Problem(f"number {shown} is longer than {MAX_INT_DIGITS} digits", file=file,
                                    line=big.line, fix="use a realistic count, or quote it if it is a name")) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise GpushareError(Problem(f"not valid YAML: {getattr(exc, 'problem', None) or exc}", file=file, line=line,
                                    fix="fix the syntax")) from None
    except RecursionError:
        raise GpushareError(Problem("YAML nested too deeply", file=file, fix="flatten the document")) from None


def load_yaml_file(path: Path, what: str = "file") -> tuple[str, Any]:
    """The text and the data of a YAML file; every failure is a located GpushareError."""
    text = read_text(path, what)
    return text, parse_yaml(text, str(path))


def load_yaml_documents(path: Path, what: str = "file", limit: int = MAX_BYTES) -> list[Any]:
    """Every document of a YAML file (see parse_yaml_documents); every failure is a located GpushareError."""
    return parse_yaml_documents(read_text(path, what, limit), str(path))


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
                                        file=str(path)[:300], fix="choose a shorter name"), exit_code=2)


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


class _Unwritable(GpushareError):
    def __init__(self, path: Path, exc: OSError) -> None:
        super().__init__(Problem(f"cannot write: {exc.strerror or exc}", file=str(path),
                                 fix="choose a path on a writable file system, e.g. build/"), exit_code=2)


def write_with(path: Path, produce: Callable[[Path], object]) -> None:
    """Let `produce` write a temporary file beside `path` (e.g. matplotlib's savefig), then rename it over `path`."""
    try:
        _write_with(path, produce)
    except OSError as exc:
        raise _Unwritable(path, exc) from None


def _write_with(path: Path, produce: Callable[[Path], object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        produce(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        mode = stat.S_IMODE(os.stat(path).st_mode) if path.exists() else 0o644
        os.chmod(tmp, mode)
        with held_signals():
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2); False where the system cannot."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
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
        raise _Unwritable(next(iter(parts)), exc) from None


def _replace_dirs(parts: dict[Path, Callable[[Path], None]]) -> None:
    built: list[tuple[Path, Path]] = []
    try:
        for target, fill in parts.items():
            target.parent.mkdir(parents=True, exist_ok=True)
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
