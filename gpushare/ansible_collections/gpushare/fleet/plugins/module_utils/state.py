"""The host's gpushare state file (/var/lib/gpushare/state.json): read, and updated only where something differs.

Shared by the modules that record what gpushare did to a host (gpushare_state, dcgm_diag)."""

from __future__ import annotations

import json
import os
import tempfile

DEFAULT_PATH = "/var/lib/gpushare/state.json"


def read_state(path):
    try:
        with open(path) as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


def write_state(path, data):
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".state.")
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def update_state(path, update, check_mode=False):
    """(changed, before, after): `update`'s keys set in the file, which is written only when something differs."""
    before = read_state(path)
    after = dict(before)
    after.update(update or {})
    changed = after != before or (update is not None and not os.path.exists(path))
    if changed and not check_mode:
        write_state(path, after)
    return changed, before, after
