"""The host's gpushare state file (/var/lib/gpushare/state.json): read, and updated only where something differs.

Shared by the modules that record what gpushare did to a host (gpushare_state, dcgm_diag) and read it (host_read).
A file that is there but cannot be read as gpushare wrote it (not a regular file, not UTF-8, not JSON, not a JSON
object) is an error, never an empty state: writing over it would lose the record it holds (whether gpushare
cordoned the node, the MIG state, the DCGM verdict)."""

from __future__ import annotations

import json
import os
import platform

from ansible_collections.gpushare.fleet.plugins.module_utils.files import write_if_differs

DEFAULT_PATH = "/var/lib/gpushare/state.json"

# The option of the modules that read or record the state file (host_read, dcgm_diag), documented once in the doc
# fragment gpushare.fleet.state_file: optional, as they work without it.
STATE_PATH_OPTION = {"state_path": {"type": "path"}}

_JSON_KINDS = {list: "a JSON list", str: "a JSON string", int: "a JSON number", float: "a JSON number",
               bool: "a JSON boolean", type(None): "JSON null"}


class StateFileError(Exception):
    """The state file is there but is not gpushare's JSON object; the message names the host, file and field."""


def this_host():
    """The host's name, as messages name it (the module runs on the host)."""
    return platform.node() or "this host"


def _refuse(path, problem, fix):
    return StateFileError(f"host {this_host()}: {path}: {problem}; the file was left as it is (fix: {fix})")


_REPAIR = ("repair it as the JSON object gpushare writes ({} holds no record), or move it aside: the next run "
           "records the MIG state, cordon and DCGM verdict again, and `kubectl get node` shows whether the node is "
           "cordoned")


def read_state(path):
    """The state file's object; {} when the file does not exist. Raises StateFileError for anything else that
    is not a JSON object."""
    if os.path.isdir(path):
        raise _refuse(path, "the state file is a directory", f"remove the directory or give the state file's path "
                      f"(a regular file, default {DEFAULT_PATH})")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(16 * 1024 * 1024 + 1)
    except FileNotFoundError:
        return {}
    except OSError as err:
        raise _refuse(path, f"cannot read the state file: {err.strerror or err}",
                      "check the path and its permissions") from None
    if len(raw) > 16 * 1024 * 1024:
        raise _refuse(path, "the state file is larger than 16 MiB; gpushare writes a few hundred bytes", _REPAIR)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _refuse(path, f"not UTF-8: byte 0x{raw[err.start]:02x} at offset {err.start}", _REPAIR) from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:
        where = f"line {err.lineno}, column {err.colno}: " if isinstance(err, json.JSONDecodeError) else ""
        reason = err.msg if isinstance(err, json.JSONDecodeError) else str(err)
        raise _refuse(path, f"not JSON ({where}{reason})", _REPAIR) from None
    if not isinstance(data, dict):
        kind = _JSON_KINDS.get(type(data), type(data).__name__)
        raise _refuse(path, f"the top level is {kind}, not the JSON object of keys gpushare writes", _REPAIR)
    return data


def write_state(path, data):
    write_if_differs(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def update_state(path, update, check_mode=False):
    """(changed, before, after): `update`'s keys set in the file, which is written only when something differs.
    Raises StateFileError, before anything is written, when the file is there but is not a JSON object, and when
    it cannot be written."""
    before = read_state(path)
    after = dict(before)
    after.update(update or {})
    changed = after != before or (update is not None and not os.path.exists(path))
    if changed and not check_mode:
        try:
            write_state(path, after)
        except OSError as err:
            raise _refuse(path, f"cannot write the state file: {err.strerror or err}",
                          "check that its directory is a writable directory with free space") from None
    return changed, before, after
