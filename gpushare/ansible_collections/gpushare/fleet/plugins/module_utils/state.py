"""The host's gpushare state file (/var/lib/gpushare/state.json): read, and updated only where something differs.

Shared by the modules that record what gpushare did to a host (gpushare_state, dcgm_diag)."""

from __future__ import annotations

import json
import os

from ansible_collections.gpushare.fleet.plugins.module_utils.files import write_if_differs

DEFAULT_PATH = "/var/lib/gpushare/state.json"


def read_state(path):
    try:
        with open(path) as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


def write_state(path, data):
    write_if_differs(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def update_state(path, update, check_mode=False):
    """(changed, before, after): `update`'s keys set in the file, which is written only when something differs."""
    before = read_state(path)
    after = dict(before)
    after.update(update or {})
    changed = after != before or (update is not None and not os.path.exists(path))
    if changed and not check_mode:
        write_state(path, after)
    return changed, before, after
