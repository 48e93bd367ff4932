#!/usr/bin/python
"""Ansible module: what a role needs to know about a host, read in one call (read-only).

Each task result costs the controller a fork, templating, an ssh session and a module transfer, so a role reads
everything it checks in one task: installed packages, units, the output of version commands, whether paths exist,
and gpushare's state file.
"""

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpushare.fleet.plugins.module_utils.state import STATE_PATH_OPTION, StateFileError, read_state

DOCUMENTATION = r"""
module: host_read
author: gpushare maintainers (@gpushare)
short_description: Read packages, units, command output, paths and gpushare's state file in one call
description:
  - Changes nothing; every read is optional. A package that is not installed, a unit that does not exist or a command
    that is missing is reported as such, not as a failure, so the role's assert can say what to fix.
  - With O(state_path), the state file's object is returned as C(state), empty when the file is absent.
options:
  packages:
    description: Debian packages; each is reported with its installed C(version), C(want) (C(hold), C(install), ...)
      and C(status) (C(installed), C(not-installed), ...), all null when dpkg does not know it.
    type: list
    elements: str
    default: []
  units:
    description: systemd units; each is reported with C(active) (ActiveState), C(enabled) (UnitFileState) and
      C(environment) (the unit's Environment= settings as one string).
    type: list
    elements: str
    default: []
  commands:
    description: Commands to run, by a name of the caller's choosing; each is reported with C(rc), C(stdout) and
      C(stderr). A command that is not installed reports rc 127 and the reason in C(stderr).
    type: dict
    default: {}
  paths:
    description: Paths whose existence is reported (true or false).
    type: list
    elements: path
    default: []
extends_documentation_fragment:
  - gpushare.fleet.state_file
"""

EXAMPLES = r"""
- name: Read what the MIG role checks before it changes anything, in one task
  gpushare.fleet.host_read:
    packages: [nvidia-mig-manager]
    units: [nvidia-mig-manager.service]
    commands:
      mig_parted: [nvidia-mig-parted, --version]
    paths: [/sys/module/nvidia_drm]
    state_path: /var/lib/gpushare/state.json
  register: host

- name: Say what is missing
  ansible.builtin.assert:
    that:
      - host.packages['nvidia-mig-manager'].status == 'installed'
      - host.commands.mig_parted.rc == 0
    fail_msg: "install nvidia-mig-manager: {{ host.commands.mig_parted.stderr }}"
"""

RETURN = r"""
packages:
  description: Per package, version, want and status.
  returned: always
  type: dict
units:
  description: Per unit, active, enabled and environment.
  returned: always
  type: dict
commands:
  description: Per command name, rc, stdout and stderr.
  returned: always
  type: dict
paths:
  description: Per path, whether it exists.
  returned: always
  type: dict
state:
  description: gpushare's state file, when state_path is given.
  returned: when state_path is given
  type: dict
"""

ARGUMENT_SPEC = {
    "packages": {"type": "list", "elements": "str", "default": []},
    "units": {"type": "list", "elements": "str", "default": []},
    "commands": {"type": "dict", "default": {}},
    "paths": {"type": "list", "elements": "path", "default": []},
    **STATE_PATH_OPTION,
}

DPKG_FORMAT = "${Package}\t${Version}\t${db:Status-Want}\t${db:Status-Status}\n"
UNIT_PROPERTIES = ("Id", "ActiveState", "UnitFileState", "Environment")


def parse_dpkg(text, names):
    """dpkg-query's lines for the names asked; a name it does not know is all null."""
    found = {name: {"version": None, "want": None, "status": None} for name in names}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) == 4 and parts[0] in found:
            found[parts[0]] = {"version": parts[1] or None, "want": parts[2] or None, "status": parts[3] or None}
    return found


def parse_units(text, names):
    """`systemctl show` prints one block per unit, in the order asked, separated by empty lines."""
    blocks = [block for block in text.split("\n\n") if block.strip()]
    found = {}
    for index, block in enumerate(blocks[:len(names)]):
        name = names[index]
        props = dict(line.partition("=")[::2] for line in block.splitlines() if "=" in line)
        found[name] = {"active": props.get("ActiveState") or None, "enabled": props.get("UnitFileState") or None,
                       "environment": props.get("Environment", "")}
    for name in names:
        found.setdefault(name, {"active": None, "enabled": None, "environment": ""})
    return found


def run(module, argv):
    if not isinstance(argv, list) or not argv or not all(isinstance(a, (str, int)) for a in argv):
        module.fail_json(msg=f"commands: each command is a non-empty list of arguments (got {argv!r})")
    exe = module.get_bin_path(str(argv[0])) if "/" not in str(argv[0]) else str(argv[0])
    if not exe or not os.path.exists(exe):
        return {"rc": 127, "stdout": "", "stderr": f"{argv[0]}: not installed"}
    rc, out, err = module.run_command([exe] + [str(a) for a in argv[1:]])
    return {"rc": rc, "stdout": out, "stderr": err}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    result = {"changed": False, "packages": {}, "units": {}, "commands": {}, "paths": {}}
    if p["packages"]:
        dpkg = module.get_bin_path("dpkg-query", required=True)
        _, out, _ = module.run_command([dpkg, "-W", "-f", DPKG_FORMAT] + p["packages"])
        result["packages"] = parse_dpkg(out, p["packages"])
    if p["units"]:
        systemctl = module.get_bin_path("systemctl", required=True)
        props = [arg for prop in UNIT_PROPERTIES for arg in ("-p", prop)]
        _, out, _ = module.run_command([systemctl, "show"] + props + ["--"] + p["units"])
        result["units"] = parse_units(out, p["units"])
    for name, argv in p["commands"].items():
        result["commands"][name] = run(module, argv)
    result["paths"] = {path: os.path.exists(path) for path in p["paths"]}
    if p["state_path"]:
        try:
            result["state"] = read_state(p["state_path"])
        except StateFileError as err:
            module.fail_json(msg=str(err), path=p["state_path"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
