"""Ansible's `ini` inventory plugin, except for the files it must not read: a gpushare environment file (which only
gpushare_fleet reads: when gpushare refuses one, a plain plugin would take it as an inventory of no hosts and the run
would go on) and anything that is not a regular file (a FIFO would block the read for ever)."""

from __future__ import annotations

from pathlib import Path

from ansible.plugins.inventory.ini import InventoryModule as AnsibleIni

DOCUMENTATION = r"""
name: ini
short_description: INI inventories, except gpushare environment files
description:
  - Ansible's C(ansible.builtin.ini) plugin for every regular file that is not a gpushare environment file (a
    C(.yaml) or C(.yml) file directly inside a directory named C(environments)), which C(gpushare.fleet.gpushare_fleet)
    alone reads. FIFOs, sockets and devices are never read.
"""


class InventoryModule(AnsibleIni):
    NAME = "gpushare.fleet.ini"

    def verify_file(self, path):
        from gpushare.ops.inventory import is_environment_file

        if not Path(path).is_file() or is_environment_file(Path(path)):
            return False
        return super().verify_file(path)
