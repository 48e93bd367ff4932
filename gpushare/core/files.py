"""Every file gpushare reads or writes goes through here: one loader for the user's YAML files (environments,
profiles, guardrails, waivers, demand, stack settings), one writer for the YAML it produces for people (rendered
files, preview manifests, imported environments, plans) and atomic writers for everything it produces.

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
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer

from gpushare.core.errors import EXCERPT_CHARS, GpushareError, Problem

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
        if exc.errno == errno.ELOOP:
            raise GpushareError(Problem(f"{what} is a symbolic link in a loop: it leads back to itself, directly "
                                        "or through other links", file=file,
                                        fix="remove the link, or point it at a real file (ls -l shows where it "
                                            "leads)"), exit_code=2) from None
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


def _check_expansion(root: yaml.Node, already: int = 0) -> int:
    """Count the values `root` expands to, each node once (aliases share their anchor's node, so the count is
    linear in the document even where the expansion is exponential); refuse more than MAX_EXPANDED (with
    `already` counted before, by earlier parts of the same document), or a cycle. Returns the count."""
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
        if sizes[key] + already > MAX_EXPANDED:
            raise AliasBomb(node.start_mark.line + 1, recursive=False)
    return sizes[id(root)]


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


_BUILT_TAG = "tag:gpushare.io,2026:constructed"


class _Built(yaml.ScalarNode):
    """An item of a streamed list, constructed already: the node keeps only the Python value."""

    def __init__(self, data: Any, start_mark: Any, end_mark: Any) -> None:
        super().__init__(_BUILT_TAG, "", start_mark, end_mark)
        self.data = data


class _ItemStreamingLoader(Composer, StrictLoader):
    """StrictLoader for large `kind: List` dumps: each entry of the document's top-level `items` is composed,
    checked and constructed on its own, and its node tree dropped, before the next is read. A whole-document node
    tree holds a Python object and two position marks per value (about 20 bytes of memory per byte of dump, 1 GiB
    for a 50 MB one); one item's tree is a few hundred KB. The result and every error are those of StrictLoader:
    the events are libyaml's, composed by PyYAML's own Composer, and the alias bound counts every item."""

    def __init__(self, stream: Any) -> None:
        StrictLoader.__init__(self, stream)  # type: ignore[call-arg]  # libyaml's loader, typed as Any here
        Composer.__init__(self)
        self._depth = 0
        self._expanded = 0  # values the streamed items of this document expand to

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if (self._depth == 1 and isinstance(parent, yaml.MappingNode) and isinstance(index, yaml.ScalarNode)
                and index.value == "items" and self.check_event(yaml.SequenceStartEvent)
                and self.peek_event().anchor is None):
            return self._compose_items()
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def _compose_items(self) -> yaml.SequenceNode:
        start = self.get_event()
        tag = start.tag
        if tag is None or tag == "!":
            tag = self.resolve(yaml.SequenceNode, None, start.implicit)
        node = yaml.SequenceNode(tag, [], start.start_mark, None, flow_style=start.flow_style)
        self._depth += 1
        try:
            index = 0
            while not self.check_event(yaml.SequenceEndEvent):
                item = self.compose_node(node, index)
                assert item is not None  # an entry of a sequence is always a node
                self._expanded += _check_expansion(item, self._expanded)
                data = self.construct_object(item, deep=True)
                # Constructed objects are cached by node; dropping the cache drops this item's nodes (an alias to
                # an anchor in it, which kubectl never writes, is constructed again from the anchor's node).
                self.constructed_objects.clear()
                node.value.append(_Built(data, item.start_mark, item.end_mark))
                index += 1
        finally:
            self._depth -= 1
        node.end_mark = self.get_event().end_mark
        return node

    def construct_document(self, node: yaml.Node) -> Any:
        _check_expansion(node, self._expanded)
        self._expanded = 0
        return StrictLoader.construct_document(self, node)

    def construct_built(self, node: _Built) -> Any:
        return node.data


_ItemStreamingLoader.add_constructor(_BUILT_TAG, _ItemStreamingLoader.construct_built)


def parse_yaml(text: str, file: str) -> Any:
    """One YAML document, or a located error."""
    return _parsed(lambda: yaml.load(text, Loader=StrictLoader), file)  # noqa: S506 - a safe loader subclass


def parse_yaml_documents(text: str, file: str) -> list[Any]:
    """Every document of a YAML stream (`---` between them, as concatenated `kubectl get -o yaml` outputs), with
    the same rules and errors as one document; empty documents are left out. The top-level `items` of each
    document are read one by one (_ItemStreamingLoader), so a dump of thousands of nodes never holds the node tree
    of the whole file."""
    documents = _parsed(lambda: list(yaml.load_all(text, Loader=_ItemStreamingLoader)), file)  # noqa: S506
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
