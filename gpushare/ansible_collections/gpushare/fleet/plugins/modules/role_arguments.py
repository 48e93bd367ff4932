#!/usr/bin/python
"""Documentation of the action plugin gpushare.fleet.role_arguments (plugins/action/role_arguments.py), which runs
on the controller only; as for ansible.builtin.assert, the module file carries the documentation."""

from __future__ import annotations

DOCUMENTATION = r"""
module: role_arguments
author: gpushare maintainers (@gpushare)
short_description: Check the arguments of several gpushare.fleet roles in one task
description:
  - For each role named, the options of its C(main) entry point in C(meta/argument_specs.yml) are checked with
    Ansible's argument spec validator against the values the role would see (the play's variables, else the role's
    C(defaults/main.yml)), templated. Fails naming the role and each error.
  - "Use with C(rolespec_validate: false) on the role imports, which drops the check task Ansible adds per role."
options:
  roles:
    description: Roles of gpushare.fleet, by short or fully qualified name.
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: Check the arguments of the roles this play imports
  gpushare.fleet.role_arguments:
    roles: [gpu_facts, mig]
"""

RETURN = r"""
checked:
  description: Per role, how many of its options had a value to check.
  returned: always
  type: dict
argument_errors:
  description: Each error, naming its role.
  returned: on failure
  type: list
"""
