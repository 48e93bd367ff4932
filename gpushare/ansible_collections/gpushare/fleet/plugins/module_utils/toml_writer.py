"""TOML as gpushare writes it, in one place: the rendered toolkit config and containerd drop-in (gpushare's templates,
through gpushare.render.templating on the controller) and the containerd configs the module containerd_runtime
writes on a host. A host runs it without gpushare installed, so it lives here, imports nothing beyond Python's own
library, and gpushare imports it from the collection inside its package.

Values: strings as basic strings (quotes, backslashes and control characters escaped, other text as it is),
integers and floats as Python writes them (which TOML reads back: 1.5, 1e+20, inf, nan), booleans, lists as
arrays, dicts as inline tables. A document (dumps) puts nested dicts under [table] headers and lists of dicts
under [[array of tables]] headers, as `containerd config dump` prints them; tomllib reads every form back to the
value it was written from."""

from __future__ import annotations

import re

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def encode_string(text):
    """A TOML basic string. Control characters TOML does not take as they are (below 0x20, and 0x7f) are escaped;
    a lone surrogate, which no TOML (UTF-8) file can hold, is refused with ValueError."""
    out = []
    for char in text:
        if char in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[char])
        elif char < " " or char == "\x7f":
            out.append(f"\\u{ord(char):04x}")
        elif "\ud800" <= char <= "\udfff":
            raise ValueError(f"no TOML form for {text!r}: it holds the lone surrogate U+{ord(char):04X}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def encode_key(key):
    """A key: bare where TOML allows (letters, digits, `_` and `-`), else a quoted basic string."""
    if not isinstance(key, str):
        raise TypeError(f"no TOML key for {key!r}: keys are strings")
    return key if _BARE_KEY.match(key) else encode_string(key)


def encode_value(value):
    """One TOML value: a string, boolean, integer, float, list (array) or dict (inline table); TypeError else."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))  # int(): an IntEnum is its number
    if isinstance(value, float):
        return repr(float(value))
    if isinstance(value, str):
        return encode_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(encode_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{encode_key(k)} = {encode_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML form for {value!r}")


def _is_table_array(value):
    return isinstance(value, list) and value and all(isinstance(v, dict) for v in value)


def dumps(data):
    """A TOML document of a dict: its values first, then each nested dict as a [table] and each list of dicts as
    [[array of tables]], with the dotted key path in the header (the form `containerd config dump` prints)."""
    lines = []

    def emit(table, path):
        for key, value in table.items():
            if not isinstance(value, dict) and not _is_table_array(value):
                lines.append(f"{encode_key(key)} = {encode_value(value)}")
        for key, value in table.items():
            header = ".".join(encode_key(p) for p in path + [key])
            if isinstance(value, dict):
                lines.extend(["", f"[{header}]"])
                emit(value, path + [key])
            elif _is_table_array(value):
                for item in value:
                    lines.extend(["", f"[[{header}]]"])
                    emit(item, path + [key])

    emit(data, [])
    return "\n".join(lines).lstrip("\n") + "\n"
