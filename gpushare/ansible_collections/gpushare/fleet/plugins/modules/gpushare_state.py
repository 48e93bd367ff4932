#!/usr/bin/python
"""Ansible module: the host's own record of what gpushare did to it (/var/lib/gpushare/state.json)."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpushare.fleet.plugins.module_utils.state import DEFAULT_PATH, StateFileError, update_state

DOCUMENTATION = r"""
module: gpushare_state
author: gpushare maintainers (@gpushare)
short_description: Read and update the host's gpushare state file
description:
  - A JSON object on the host (by default C(/var/lib/gpushare/state.json)) that records the MIG config, its state
    (C(success) or C(failed)), the GPU processes that blocked a change, whether gpushare cordoned the node, and the
    last DCGM diagnostic verdict. Verification and rollouts read it.
  - Keys given in O(update) replace those in the file; the file is written only when something differs.
  - A file that is there but is not a JSON object (not JSON, a JSON list, a directory, not UTF-8) fails the task
    naming the host, the file and what is wrong, and is left as it is (writing over it would lose its record).
options:
  path:
    description: State file.
    type: path
    default: /var/lib/gpushare/state.json
  update:
    description: Keys to set; omit to only read.
    type: dict
"""

EXAMPLES = r"""
- name: Read the host's state
  gpushare.fleet.gpushare_state:
  register: host_state

- name: Record a MIG layout applied, with no blocking processes left
  gpushare.fleet.gpushare_state:
    update: {mig_config: gpushare-a100-balanced, state: success, pids: [], message: ""}

- name: Record that gpushare cordoned the node, in a state file elsewhere
  gpushare.fleet.gpushare_state:
    path: /srv/gpushare/state.json
    update:
      cordoned: true
"""

RETURN = r"""
state:
  description: The state after the call.
  returned: always
  type: dict
"""


ARGUMENT_SPEC = {
    "path": {"type": "path", "default": DEFAULT_PATH},
    "update": {"type": "dict"},
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        changed, before, after = update_state(module.params["path"], module.params["update"], module.check_mode)
    except StateFileError as err:
        module.fail_json(msg=str(err), path=module.params["path"])
    module.exit_json(changed=changed, state=after, diff={"before": before, "after": after})


if __name__ == "__main__":
    main()
