"""Every file gpushare reads comes in through here: the bounded reader and the one loader for the user's YAML files
(environments, profiles, guardrails, waivers, demand, stack settings, cluster dumps). Writing is gpushare.core.files.

Reading: regular files only (a directory, FIFO or device is refused without opening it, so nothing blocks), at
most MAX_BYTES, UTF-8 with the offending byte named. YAML is read without surprises: `no`, `on`, `2026-02-30` and
`1:30` stay strings (YAML 1.1's boolean, timestamp and sexagesimal resolvers are dropped; true/false stay
booleans), integers are decimal (`010` is ten, not eight) and at most MAX_INT_DIGITS long, duplicate keys are
errors, and so are merge keys (`<<: *anchor`): a key a merge copies in has no line of its own in the mapping it
changes, so a reviewer of the diff would not see it (a tenant's trust, a quota, a rule lifted from non_waivable)."""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer

from gpushare.core.errors import GpushareError, Problem

MAX_BYTES = 4 * 1024 * 1024  # the largest environment shipped is ~6 KB; a 4 MiB limit leaves room for any fleet
MAX_INT_DIGITS = 18  # every count, quota and id fits; a longer number is a typo or an attack
# Values a document may hold once its aliases are expanded (each alias counts as all it repeats). The largest input
# read, a 5,000-node cluster dump, holds about 3 million; a "billion laughs" file of a few hundred bytes holds 10^9
# and would exhaust memory wherever the values are walked (operator values merged, JSON written).
MAX_EXPANDED = 10_000_000


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
