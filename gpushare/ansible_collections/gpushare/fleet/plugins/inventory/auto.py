"""Ansible's `auto` inventory plugin (a YAML file that names its plugin), except for a gpushare environment file, which
only gpushare_fleet reads, and anything that is not a regular file: `auto` opens the file to find its `plugin:` key,
and a FIFO would block that read for ever."""

from __future__ import annotations

from pathlib import Path

from ansible.plugins.inventory.auto import InventoryModule as AnsibleAuto

DOCUMENTATION = r"""
name: auto
short_description: YAML inventories that name their plugin, except gpushare environment files
description:
  - Ansible's C(ansible.builtin.auto) plugin for every regular file that is not a gpushare environment file, which
    C(gpushare.fleet.gpushare_fleet) alone reads. FIFOs, sockets and devices are never read.
"""


class InventoryModule(AnsibleAuto):
    NAME = "gpushare.fleet.auto"

    def verify_file(self, path):
        from gpushare.ops.inventory import is_environment_file

        if not Path(path).is_file() or is_environment_file(Path(path)):
            return False
        return super().verify_file(path)
