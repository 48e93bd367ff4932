"""Ansible inventory plugin: a gpushare environment file is an inventory.

`ansible-playbook -i environments/pilot.yaml playbooks/site.yml` resolves the environment with gpushare (the same
resolution `gpushare plan` and `gpushare render` use) and lists its bare-metal hosts, grouped per environment,
cluster and pool, with the resolved fleet and the rendered files as host variables.

Every value it sets is data: with ansible-core 2.19's data tagging, values from an inventory plugin are untrusted
and never templated unless the plugin marks them trusted, which this one never does (tests read this file to check).
"""

from __future__ import annotations

from pathlib import Path

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin
from ansible.release import __version__ as ansible_version

# The first ansible-core whose inventory values stay data (data tagging); older ones template them on use.
MIN_ANSIBLE_CORE = (2, 19)

DOCUMENTATION = r"""
name: gpushare_fleet
short_description: gpushare environment files (environments/<env>.yaml) as inventory
description:
  - Recognises any C(.yaml) or C(.yml) file directly inside a directory named C(environments); the file needs no
    C(plugin) key. Lists only Ansible-managed (bare-metal) hosts.
  - "Groups: C(env_<environment>) > C(cluster_<cluster>) > C(pool_<pool>), dashes turned into underscores."
  - Host variables are prefixed C(gpushare_) and come from the resolved fleet and the rendered files.
"""


def require_data_tagging(version: str) -> None:
    """Refuse an ansible-core that would evaluate `{{ }}` found in inventory values."""
    release = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    if release < MIN_ANSIBLE_CORE:
        raise AnsibleParserError(
            f"gpushare's inventory needs ansible-core {'.'.join(map(str, MIN_ANSIBLE_CORE))} or later (found "
            f"{version}): older releases evaluate templates found in inventory values. Fix: pip install "
            "'ansible-core>=2.19,<2.20' (the range gpushare's pyproject.toml requires)")


class InventoryModule(BaseInventoryPlugin):
    NAME = "gpushare.fleet.gpushare_fleet"
    # Values come from environment files that anyone with a pull request can edit: never templates.
    trusted_by_default = False

    def verify_file(self, path):
        if not super().verify_file(path):
            return False
        from gpushare.ops.inventory import is_environment_file

        return is_environment_file(Path(path))

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        require_data_tagging(ansible_version)
        from gpushare.core.errors import GpushareError
        from gpushare.ops.inventory import inventory_from_file

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
