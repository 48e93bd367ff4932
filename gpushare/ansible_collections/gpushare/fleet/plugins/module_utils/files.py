"""Files the collection's modules write on a host: atomically (a temporary file renamed over the old one, its
directory created), and only where the content differs; and the check that a value written into a line-based file
(an apt source, a systemd unit or drop-in, containerd's TOML, a CDI spec) holds no control character, so it cannot
start a line of its own (a newline in a mirror URI would add `Trusted: yes` to an apt source)."""

from __future__ import annotations

import os
import tempfile


def write_if_differs(path, data, mode=0o644):
    """Write `data` (bytes) to `path` unless it already holds exactly that; True when it wrote."""
    try:
        with open(path, "rb") as handle:
            if handle.read() == data:
                return False
    except FileNotFoundError:
        pass
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".gpushare.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        # A full disk or a failed rename leaves neither a half-written file nor the temporary one behind.
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return True


def differs(path, data):
    """Whether `path` would change by holding `data` (bytes): absent or other content."""
    try:
        with open(path, "rb") as handle:
            return handle.read() != data
    except FileNotFoundError:
        return True


# ---------------------------------------------------------------- values written into line-based files

_CONTROL_NAMES = {"\n": "line feed", "\r": "carriage return", "\t": "tab", "\x00": "NUL", "\x1b": "escape",
                  "\x7f": "delete"}


def control_character(text, allow=""):
    """The first control character of `text` (below 0x20, or 0x7f) that is not in `allow`, as (index, character);
    None when there is none."""
    for index, char in enumerate(text):
        if (char < " " or char == "\x7f") and char not in allow:
            return index, char
    return None


def describe_character(char):
    """A control character as messages show it: '\\n' (U+000A, line feed)."""
    name = _CONTROL_NAMES.get(char)
    return f"{char!r} (U+{ord(char):04X}{', ' + name if name else ''})"


def line_value_error(option, value, allow="", kind="option"):
    """Why `value` (a string, or a list or mapping of them, as an option holds) cannot go into a line-based file:
    the option (with the list index or key; `kind` says what it is) and the control character in it; None when it
    can."""
    if isinstance(value, str):
        found = control_character(value, allow)
        if found is None:
            return None
        index, char = found
        return f"{kind} {option} holds the control character {describe_character(char)} at position {index}"
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            error = line_value_error(f"{option}[{index}]", item, allow, kind)
            if error:
                return error
    elif isinstance(value, dict):
        for key, item in value.items():
            error = line_value_error(f"{option} (a key)", key, "", kind) if isinstance(key, str) else None
            error = error or line_value_error(f"{option}.{key}", item, allow, kind)
            if error:
                return error
    return None


def refuse_control_characters(module, options, what, allow=None):
    """Fail the task (fail_json, before anything is written) when one of `options` holds a control character:
    a value a module writes into a line-based file could otherwise start a line of its own there. `what` names
    the values in the message ("values written into an apt source"); `allow` maps an option that holds a whole
    file's text to the characters it may hold."""
    allow = allow or {}
    for option in options:
        permitted = allow.get(option, "")
        error = line_value_error(option, module.params.get(option), permitted)
        if error:
            besides = " other than " + " and ".join(describe_character(c) for c in permitted) if permitted else ""
            module.fail_json(
                msg=f"{error}: {what} may hold no control characters{besides} (below 0x20, or 0x7f), since a "
                    "newline or carriage return would start a line of its own there; nothing was written (fix: "
                    "remove the character from the value, or from the role variable or group_vars entry that sets "
                    "it)",
                option=option)
