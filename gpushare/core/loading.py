"""Reading a workspace file into a pydantic model, with errors that name the file, the line, the field and the fix:
the loader every file format shares (environments and profiles in gpushare.core.spec, guardrails, waivers, prices,
demand). It knows no format: a format's module tells it how to explain its patterns and its tagged union."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticCustomError

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.paths import check_inside_workspace
from gpushare.core.reading import load_yaml_file


def invalid(message: str, fix: str) -> PydanticCustomError:
    """A validation error that carries its fix, for the error report."""
    return PydanticCustomError("gpushare", message.replace("{", "(").replace("}", ")"), {"fix": fix})


class Strict(BaseModel):
    # strict: YAML's `true` is not a count and '4' is not a number, as the JSON Schema says.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# ---------------------------------------------------------------- what a file format tells the loader
# pydantic's errors name a string pattern by its regex, and put a tagged union's tag (the value of `kind`) into an
# error's location as if it were a key. The module that defines a pattern or a union says here what it means.

_PATTERN_FIXES: dict[str, str] = {}
_UNION_TAGS: dict[str, None] = {}  # in the order they were given, for the fix that lists them


def explain_pattern(pattern: str, fix: str) -> str:
    """`pattern`, with the fix an error gives where a value does not match it; one statement defines both."""
    _PATTERN_FIXES[pattern] = fix
    return pattern


def explain_tags(tags: Iterable[str]) -> None:
    """The tags (values of `kind`) of a union pydantic tells apart by `kind`: never keys of the data."""
    _UNION_TAGS.update(dict.fromkeys(tags))


# ---------------------------------------------------------------- loading with located errors


_Loader: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class Located:
    """A loaded YAML document that can say on which line a dotted path sits."""

    def __init__(self, file: str, data: Any, text: str, base: tuple[Any, ...] = ()) -> None:
        self.file = file
        self.data = data
        self.text = text
        self.base = base
        self._node: yaml.Node | None = None

    @property
    def node(self) -> yaml.Node | None:
        """The node tree, composed only when an error needs a line number."""
        if self._node is None:
            self._node = yaml.compose(self.text, Loader=_Loader)
        return self._node

    def at(self, *base: Any) -> Located:
        located = Located(self.file, self.data, self.text, base)
        located._node = self._node
        return located

    def line(self, loc: tuple[Any, ...]) -> int | None:
        node = self.node
        best = node.start_mark.line + 1 if node is not None else None
        for part in self.data_path(loc):
            if isinstance(node, yaml.MappingNode):
                nxt = next((v for k, v in node.value if k.value == part), None)
                if nxt is None:
                    key = next((k for k, _ in node.value if k.value == part), None)
                    return key.start_mark.line + 1 if key is not None else best
                node = nxt
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
                node = node.value[part]
            else:
                continue
            best = node.start_mark.line + 1
        return best

    def problem(self, loc: tuple[Any, ...], message: str, fix: str | None = None) -> Problem:
        return Problem(message, file=self.file, path=format_path(self.data_path(loc)), fix=fix, line=self.line(loc))

    def data_path(self, loc: tuple[Any, ...]) -> tuple[Any, ...]:
        """Drop the parts of a pydantic location that are not in the data (union tags, model names)."""
        data = self.data
        for part in self.base:
            data = data[part] if isinstance(data, (dict, list)) else data
        kept: list[Any] = []
        tag_skipped_at: int | None = None
        for part in loc:
            if isinstance(data, dict) and data.get("kind") == part and tag_skipped_at != id(data):
                tag_skipped_at = id(data)  # pydantic puts a discriminated union's tag into the location
                continue
            if isinstance(data, dict) and part in data:
                data = data[part]
                kept.append(part)
            elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
                data = data[part]
                kept.append(part)
            elif isinstance(data, dict) and isinstance(part, str) and not _is_tag(part):
                kept.append(part)  # a missing key: still worth naming
                data = None
        return (*self.base, *kept)


def _is_tag(part: str) -> bool:
    """A part pydantic put into a location that is no key of the data: a union's tag, or a validator's name."""
    return part in _UNION_TAGS or part.startswith("function-")


def format_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _fix_for(err: Any, model: type[BaseModel] | None, data_loc: tuple[Any, ...]) -> str | None:
    kind = err["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model, data_loc[:-1]) if model is not None else []
        bad = str(data_loc[-1]) if data_loc else ""
        close = difflib.get_close_matches(bad, allowed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"{hint}remove the key or use one of: {', '.join(allowed)}" if allowed else "remove the key"
    if kind == "gpushare":
        return str(err.get("ctx", {}).get("fix")) or None
    if kind == "missing":
        return "add this field"
    if kind == "union_tag_not_found":
        return f"add kind: one of {', '.join(_UNION_TAGS)}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        return "use a value in the allowed range"
    if kind in ("literal_error", "union_tag_invalid", "enum"):
        expected = err.get("ctx", {}).get("expected") or err.get("ctx", {}).get("expected_tags")
        return f"use one of: {expected}" if expected else None
    if kind == "string_pattern_mismatch":
        pattern = str(err.get("ctx", {}).get("pattern", ""))
        return _PATTERN_FIXES.get(pattern, f"write a value that matches {pattern}")
    if kind in _TYPE_FIXES:
        return _TYPE_FIXES[kind]
    return None


_TYPE_FIXES = {
    "int_type": "write a whole number without quotes, e.g. 4",
    "int_from_float": "write a whole number, e.g. 4",
    "float_type": "write a number without quotes, e.g. 1.5",
    "finite_number": "write a finite number, e.g. 1.5 (not .inf or .nan)",
    "bool_type": "write true or false without quotes",
    "string_type": "write text; quote it if YAML would read it as something else, e.g. '123'",
    "dict_type": "write a mapping (key: value lines)",
    "list_type": "write a list (- item lines, or [a, b])",
    "model_type": "write a mapping (key: value lines)",
    "date_from_datetime_parsing": "write a date as YYYY-MM-DD",
    "date_parsing": "write a real date as YYYY-MM-DD",
    "date_from_datetime_inexact": "write a date as YYYY-MM-DD",
}


def _read_as(value: Any) -> str:
    """What YAML made of a value, for messages: users see `yes` turned into a boolean, `010` into a number."""
    kind = {bool: "a boolean", int: "a number", float: "a number", str: "text", list: "a list", dict: "a mapping",
            type(None): "nothing (null)"}.get(type(value), type(value).__name__)
    shown = repr(value) if not isinstance(value, (dict, list)) else ""
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return f"YAML read {shown + ', ' if shown else ''}{kind}"


def _allowed_keys(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> list[str]:
    """Follow a data path through the model's fields to list the keys allowed there."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        current = _inner_model(fields[part].annotation)
    fields = getattr(current, "model_fields", None)
    return list(fields) if fields else []


def _inner_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def validation_problems(exc: ValidationError, doc: Located, model: type[BaseModel] | None) -> list[Problem]:
    problems = []
    errors = exc.errors(include_url=False)
    # A misspelt key shows as an unknown key and a missing one: say it once, as the unknown key with its fix.
    misspelt = {(tuple(e["loc"][:-1]), m) for e in errors if e["type"] == "extra_forbidden" and e["loc"]
                for m in difflib.get_close_matches(str(e["loc"][-1]), [str(x["loc"][-1]) for x in errors
                                                                       if x["type"] == "missing" and x["loc"]], n=1)}
    for err in errors:
        loc = tuple(err["loc"])
        if err["type"] == "missing" and loc and (loc[:-1], str(loc[-1])) in misspelt:
            continue
        data_loc = doc.data_path(loc)[len(doc.base):]
        message = err["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, "):]
        if err["type"] == "extra_forbidden":
            message = f"unknown key {data_loc[-1]!r}" if data_loc else "unknown key"
        elif err["type"] == "union_tag_not_found":
            message = f"'{err.get('ctx', {}).get('discriminator', 'kind')}' is missing".replace("''", "'")
        elif err["type"] in _TYPE_FIXES:
            message = f"{message} ({_read_as(err.get('input'))})"
        problems.append(doc.problem(loc, message, _fix_for(err, model, data_loc)))
    return problems


def read_yaml(path: Path, what: str = "file") -> Located:
    """A YAML file through the one shared loader (gpushare.files), kept with its text for line numbers. A file in a
    workspace must really be there: a symbolic link out of it is refused (core.paths.check_inside_workspace)."""
    check_inside_workspace(path, what)
    text, data = load_yaml_file(path, what)
    return Located(str(path), data, text)


API_VERSION = "gpushare.io/v1"  # the one version of every workspace file format; a file without one reads as it
FILE_KINDS = ("Environment", "SharingProfile", "Guardrails", "Waivers", "Demand")


def file_body(doc: Located, kind: str | None) -> Any:
    """The document without its header (`apiVersion: gpushare.io/v1`, `kind: <kind>`), after checking both; a file
    without an apiVersion reads as v1. `kind=None` where `kind` is the document's own field (sharing profiles)."""
    data = doc.data
    if not isinstance(data, dict) or ("apiVersion" not in data and (kind is None or "kind" not in data)):
        return data
    version = data.get("apiVersion", API_VERSION)
    if version != API_VERSION:
        raise GpushareError(doc.problem(("apiVersion",), f"unknown apiVersion {version!r}: this gpushare reads "
                                        f"{API_VERSION}", fix=f"write apiVersion: {API_VERSION}, or upgrade gpushare "
                                        "to a release that reads this version"), exit_code=2)
    body = {k: v for k, v in data.items() if k != "apiVersion"}
    if kind is not None and "kind" in body:
        if body.pop("kind") != kind:
            raise GpushareError(doc.problem(("kind",), f"kind is {data['kind']!r}, but this file is read as a {kind}",
                                            fix=f"write kind: {kind}, or pass this file where a {data['kind']} "
                                                "is expected"), exit_code=2)
    return body


def with_header(schema: dict[str, Any], kind: str | None) -> dict[str, Any]:
    """A file's JSON schema with the optional header keys that `file_body` accepts."""
    props = {"apiVersion": {"const": API_VERSION, "description": "File format version; absent reads as v1."}}
    if kind is not None:
        props["kind"] = {"const": kind, "description": "What this file is."}
    if "properties" in schema:
        schema["properties"] = {**props, **schema["properties"]}
    return schema


ModelT = TypeVar("ModelT", bound=BaseModel)


def load_model(path: Path, model: type[ModelT], kind: str, what: str, start_from: str,
               empty: dict[str, Any] | None = None) -> tuple[ModelT, Located]:
    """A workspace file through the shared loader, its header checked and its body validated by `model`; every
    problem located. `empty`: what an empty file means, where an empty file is allowed."""
    doc = read_yaml(path, what)
    data = empty if doc.data is None and empty is not None else doc.data
    if not isinstance(data, dict):
        raise GpushareError(Problem(f"a {what} must be a mapping", file=doc.file, line=1,
                                    fix=f"start from {start_from}"))
    try:
        return model.model_validate(file_body(Located(doc.file, data, doc.text), kind)), doc
    except ValidationError as exc:
        raise GpushareError(validation_problems(exc, doc, model)) from None
