"""Ansible filter: a value a role writes into a line-based file (a systemd unit drop-in), refused when it holds a
control character, so that it cannot start a line of its own there (a newline in a config name would add an
`ExecStartPre=` to the unit). The check of the collection's modules (module_utils/files.py), for what the roles
write with ansible.builtin.copy; it runs while the task is templated, so nothing is written and no task is added."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.gpushare.fleet.plugins.module_utils.files import line_value_error

DOCUMENTATION = r"""
name: one_line
short_description: A value for a line-based file, refused when it holds a control character
description:
  - Returns the value as it is when it holds no control character (below 0x20, or 0x7f); otherwise the task fails
    naming the variable, the character and the file, before anything is written.
positional: name, into
options:
  _input: {description: The value (a string; other types pass as they are)., type: raw, required: true}
  name: {description: The variable's name, for the message., type: str, required: true}
  into: {description: The file the value goes into, for the message., type: str, default: a line-based file}
"""


def one_line(value: Any, name: str, into: str = "a line-based file") -> Any:
    error = line_value_error(name, value, kind="variable") if isinstance(value, str) else None
    if error:
        raise AnsibleFilterError(f"{error}: a value written into {into} may hold no control characters (below 0x20, "
                                 "or 0x7f), since a newline or carriage return would start a line of its own there; "
                                 "nothing was written (fix: remove the character from the variable, in the "
                                 "environment's group_vars or wherever it is set)")
    return value


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"one_line": one_line}
