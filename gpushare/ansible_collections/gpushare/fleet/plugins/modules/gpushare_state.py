#!/usr/bin/python
"""Ansible module: the host's own record of what gpushare did to it (/var/lib/gpushare/state.json)."""

from __future__ import annotations

import json
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: gpushare_state
short_description: Read and update the host's gpushare state file
description:
  - A JSON object on the host (by default C(/var/lib/gpushare/state.json)) that records the MIG config, its state
    (C(success) or C(failed)), the GPU processes that blocked a change, whether gpushare cordoned the node, and the
    last DCGM diagnostic verdict. Verification and rollouts read it.
  - Keys given in O(update) replace those in the file; the file is written only when something differs.
options:
  path:
    description: State file.
    type: path
    default: /var/lib/gpushare/state.json
  update:
    description: Keys to set; omit to only read.
    type: dict
"""

RETURN = r"""
state:
  description: The state after the call.
  returned: always
  type: dict
"""


def read(path):
    try:
        with open(path) as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


def write(path, data):
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".state.")
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def main():
    module = AnsibleModule(
        argument_spec={"path": {"type": "path", "default": "/var/lib/gpushare/state.json"},
                       "update": {"type": "dict"}},
        supports_check_mode=True,
    )
    path = module.params["path"]
    before = read(path)
    after = dict(before)
    after.update(module.params["update"] or {})
    changed = after != before or (module.params["update"] is not None and not os.path.exists(path))
    if changed and not module.check_mode:
        write(path, after)
    module.exit_json(changed=changed, state=after, diff={"before": before, "after": after})


if __name__ == "__main__":
    main()
