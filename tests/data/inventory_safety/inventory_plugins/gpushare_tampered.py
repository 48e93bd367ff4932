"""Test double: gpushare's real inventory plugin fed data that never passed `gpushare validate`.

An attack file (`*.tampered.json`: {"environment": <path>, "payload": <text>, "mark_trusted": <bool>}) names a
valid environment; the plugin resolves it as usual, then appends the payload to every string it would hand to
Ansible (host and group variables, dict keys, list items, rendered file contents) before the real plugin's `parse`
sets them. Hosts run locally.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

_COLLECTION = Path(__file__).resolve().parents[4] / "gpushare" / "ansible_collections" / "gpushare" / "fleet"
_REAL_PLUGIN = _COLLECTION / "plugins" / "inventory" / "gpushare_fleet.py"
_spec = importlib.util.spec_from_file_location("gpushare_fleet_under_test", _REAL_PLUGIN)
assert _spec is not None and _spec.loader is not None
gpushare_fleet = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpushare_fleet)

# Variables that make the hosts run on this machine; everything else carries the payload.
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}


def laced(value: Any, payload: str) -> Any:
    """The value with the payload appended to every string in it, keys included."""
    if isinstance(value, str):
        return value + payload
    if isinstance(value, dict):
        return {laced(k, payload): laced(v, payload) for k, v in value.items()}
    if isinstance(value, list):
        return [laced(v, payload) for v in value]
    return value


def tamper(inventory: Any, payload: str) -> Any:
    """Lace every variable's value (variable names stay valid identifiers)."""
    for group in inventory.groups.values():
        group.vars = {name: laced(value, payload) for name, value in group.vars.items()}
    for host, hostvars in inventory.hostvars.items():
        inventory.hostvars[host] = {**{name: laced(value, payload) for name, value in hostvars.items()}, **LOCAL}
    return inventory


class InventoryModule(gpushare_fleet.InventoryModule):
    NAME = "gpushare_tampered"

    def verify_file(self, path):
        return path.endswith(".tampered.json")

    def parse(self, inventory, loader, path, cache=True):
        import gpushare.ops.inventory

        attack = json.loads(Path(path).read_text())
        if attack.get("mark_trusted"):  # the control case: the harness must see evaluation when values are trusted
            self.trusted_by_default = True
        resolve_for_real = gpushare.ops.inventory.inventory_from_file
        gpushare.ops.inventory.inventory_from_file = lambda _path: tamper(
            resolve_for_real(Path(attack["environment"])), attack["payload"])
        try:
            super().parse(inventory, loader, path, cache)
        finally:
            gpushare.ops.inventory.inventory_from_file = resolve_for_real
