"""Ansible action: check the arguments of several of gpushare.fleet's roles in one task, on the controller.

Ansible checks a role's arguments against its `meta/argument_specs.yml` in a task of its own that it adds in front of
the role, one task result per role and host. The converge plays run six roles and import them with
`rolespec_validate: false`; their first task runs this action instead, which checks the same specs against the same
values (the play's variables over each role's defaults, templated) with Ansible's own validator, for all six roles
in one task result.
"""

from __future__ import annotations

from pathlib import Path

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

ROLES = Path(__file__).resolve().parents[2] / "roles"
PREFIX = "gpushare.fleet."
# The action's options, as plugins/modules/role_arguments.py documents them (tests/ansible/test_module_docs.py).
ARGUMENT_SPEC = {"roles": {"type": "list", "elements": "str", "required": True}}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def _role_spec(self, name: str) -> tuple[dict, dict]:
        short = name[len(PREFIX):] if name.startswith(PREFIX) else name
        base = ROLES / short
        if "/" in short or not (base / "meta" / "argument_specs.yml").is_file():
            raise AnsibleActionFail(f"role_arguments: {name} is not a role of gpushare.fleet with an argument spec "
                                    f"(roles: {', '.join(sorted(p.name for p in ROLES.iterdir() if p.is_dir()))})")
        specs = self._loader.load_from_file(str(base / "meta" / "argument_specs.yml"))["argument_specs"]
        defaults_file = base / "defaults" / "main.yml"
        defaults = (self._loader.load_from_file(str(defaults_file), trusted_as_template=True) or {}
                    if defaults_file.is_file() else {})
        return specs["main"].get("options", {}), defaults

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        roles = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)[1]["roles"]
        if not isinstance(roles, list) or not roles or not all(isinstance(r, str) for r in roles):
            raise AnsibleActionFail("role_arguments: give roles, a list of gpushare.fleet role names")
        errors: list[str] = []
        checked: dict[str, int] = {}
        for role in roles:
            spec, defaults = self._role_spec(role)
            # The role's defaults sit under the play's variables (Ansible's precedence), and may refer to each other.
            templar = self._templar.copy_with_new_env(available_variables={**defaults, **task_vars})
            values = {name: templar.template(task_vars[name] if name in task_vars else defaults[name])
                      for name in spec if name in task_vars or name in defaults}
            outcome = ArgumentSpecValidator(spec).validate(values, validate_role_argument_spec=True)
            errors += [f"role {role}: {message}" for message in outcome.error_messages]
            checked[role] = len(values)
        result["checked"] = checked
        if errors:
            result["failed"] = True
            result["argument_errors"] = errors
            result["msg"] = ("Validation of arguments failed (fix the variable in the environment's group_vars, "
                             "host_vars or -e):\n" + "\n".join(errors))
            return result
        result["changed"] = False
        result["msg"] = f"the arguments of {len(roles)} roles passed their argument specs"
        return result
