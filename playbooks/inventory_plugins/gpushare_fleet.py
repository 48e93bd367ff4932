"""Ansible inventory plugin: a gpushare environment file is an inventory.

`ansible-playbook -i environments/pilot.yaml playbooks/site.yml` resolves the environment with gpushare (the same
resolution `gpushare plan` and `gpushare render` use) and lists its bare-metal hosts, grouped per environment,
cluster and pool, with the resolved fleet and the rendered files as host variables.
"""

from __future__ import annotations

from pathlib import Path

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin

DOCUMENTATION = r"""
name: gpushare_fleet
short_description: gpushare environment files (environments/<env>.yaml) as inventory
description:
  - Recognises any C(.yaml) or C(.yml) file directly inside a directory named C(environments); the file needs no
    C(plugin) key. Lists only Ansible-managed (bare-metal) hosts.
  - "Groups: C(env_<environment>) > C(cluster_<cluster>) > C(pool_<pool>), dashes turned into underscores."
  - Host variables are prefixed C(gpushare_) and come from the resolved fleet and the rendered files.
"""


class InventoryModule(BaseInventoryPlugin):
    NAME = "gpushare_fleet"

    def verify_file(self, path):
        if not super().verify_file(path):
            return False
        from gpushare.inventory import is_environment_file

        return is_environment_file(Path(path))

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        from gpushare.errors import GpushareError
        from gpushare.inventory import inventory_from_file

        try:
            data = inventory_from_file(Path(path))
        except GpushareError as err:
            raise AnsibleParserError(f"gpushare could not resolve {path}:\n" + "\n".join(
                f"  {p}" for p in err.problems)) from None
        for group in data.groups.values():
            self.inventory.add_group(group.name)
        for group in data.groups.values():
            for child in group.children:
                self.inventory.add_child(group.name, child)
            for host in group.hosts:
                self.inventory.add_host(host, group=group.name)
            for key, value in group.vars.items():
                self.inventory.set_variable(group.name, key, value)
        for host, hostvars in data.hostvars.items():
            for key, value in hostvars.items():
                self.inventory.set_variable(host, key, value)
