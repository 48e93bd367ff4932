#!/usr/bin/python
"""Ansible module: run `dcgmi diag` and judge its JSON report."""

from __future__ import annotations

import json

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpushare.fleet.plugins.module_utils.state import (
    STATE_PATH_OPTION,
    StateFileError,
    this_host,
    update_state,
)

DOCUMENTATION = r"""
module: dcgm_diag
author: gpushare maintainers (@gpushare)
short_description: Run DCGM's diagnostic (dcgmi diag --json) and report failing tests
description:
  - Runs C(dcgmi diag -r LEVEL --json) and parses the report (DCGM 4 layout, C(DCGM Diagnostic) >
    C(test_categories) > C(tests) > C(results) per entity; the older C(DCGM GPU Diagnostic) key is read too).
  - Changes nothing but the state record (O(state_path)) and never fails on a failing test; it returns C(passed)
    and C(failures) so the caller can cordon the node first. It fails only when dcgmi gives no report at all.
  - With O(state_path), the verdict is recorded in gpushare's state file (C(dcgm_diag) passed or failed,
    C(dcgm_failures)); the file is written only when the record differs, and the task then reports changed.
options:
  level:
    description: Diagnostic level (1 is the quick software and deployment check).
    type: int
    default: 1
  dcgmi:
    description: dcgmi executable.
    type: str
    default: dcgmi
extends_documentation_fragment:
  - gpushare.fleet.state_file
"""

EXAMPLES = r"""
- name: Run the quick diagnostic and record the verdict in the host's state file
  gpushare.fleet.dcgm_diag:
    level: 1
    state_path: /var/lib/gpushare/state.json
  register: diag

- name: Keep the node out of service when a test failed
  gpushare.fleet.kube_node:
    node: "{{ inventory_hostname }}"
    schedulable: false
  delegate_to: localhost
  when: not diag.passed

- name: A longer diagnostic (level 3, minutes per GPU) that records nothing, failing the task on a failed test
  gpushare.fleet.dcgm_diag:
    level: 3
    dcgmi: /usr/bin/dcgmi
  register: long_diag
  failed_when: not long_diag.passed
"""

RETURN = r"""
passed:
  description: No test failed.
  returned: always
  type: bool
failures:
  description: One entry per failing test and entity, with the warning text.
  returned: always
  type: list
dcgmi_rc:
  description: Exit status of dcgmi diag (non-zero when a test failed).
  returned: always
  type: int
"""


_KINDS = {str: "a string", int: "a number", float: "a number", bool: "a boolean", type(None): "null",
          dict: "an object", list: "a list"}


def _kind(value):
    return _KINDS.get(type(value), type(value).__name__)


def _objects(value, field, default_empty=True):
    """`value` as a list of JSON objects (a missing field is an empty list); ValueError naming `field` else."""
    if value is None and default_empty:
        return []
    if not isinstance(value, list):
        raise ValueError(f"field {field} is {_kind(value)} ({json.dumps(value)[:60]}), not a list of objects")
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise ValueError(f"field {field}[{index}] is {_kind(item)} ({json.dumps(item)[:60]}), not an object")
    return value


def parse(text):
    """(passed, failures, tests) from dcgmi's JSON; raises ValueError naming the field when it is not a
    diagnostic report of DCGM's layout."""
    try:
        data = json.loads(text[text.index("{"):text.rindex("}") + 1])
    except ValueError as exc:
        raise ValueError(f"the output is not JSON ({exc})") from None
    except RecursionError:
        raise ValueError("the output is not JSON (nested too deeply)") from None
    key = "DCGM Diagnostic" if "DCGM Diagnostic" in data else "DCGM GPU Diagnostic"
    root = data.get(key)
    if not isinstance(root, dict):
        raise ValueError("no 'DCGM Diagnostic' object in dcgmi's output")
    if root.get("runtime_error"):
        raise ValueError("dcgmi reported a runtime error: {}".format(root["runtime_error"]))
    failures, tests = [], []
    for c, category in enumerate(_objects(root.get("test_categories"), f"'{key}'.test_categories")):
        where = f"'{key}'.test_categories[{c}]"
        for t, test in enumerate(_objects(category.get("tests"), f"{where}.tests")):
            name = str(test.get("name", "?"))
            results = _objects(test.get("results"), f"{where}.tests[{t}].results")
            test_summary = test.get("test_summary") or {}
            if not isinstance(test_summary, dict):
                raise ValueError(f"field {where}.tests[{t}].test_summary is {_kind(test_summary)}, not an object")
            summary = test_summary.get("status")
            statuses = [str(r.get("status", "")) for r in results] or ([summary] if summary else [])
            tests.append({"category": category.get("category"), "name": name,
                          "status": "Fail" if "Fail" in statuses or summary == "Fail" else (summary or "Pass")})
            for r, result in enumerate(results):
                if result.get("status") == "Fail":
                    warnings = _objects(result.get("warnings"), f"{where}.tests[{t}].results[{r}].warnings")
                    failures.append({"category": category.get("category"), "test": name,
                                     "entity": "{} {}".format(result.get("entity_group", "GPU"),
                                                          result.get("entity_id", result.get("gpu_ids"))),
                                     "warning": "; ".join(str(w.get("warning", "")) for w in warnings
                                                          if w.get("warning"))})
            if summary == "Fail" and not any(f["test"] == name for f in failures):
                failures.append({"category": category.get("category"), "test": name, "entity": "all",
                                 "warning": ""})
    return not failures, failures, tests


ARGUMENT_SPEC = {
    "level": {"type": "int", "default": 1},
    "dcgmi": {"type": "str", "default": "dcgmi"},
    **STATE_PATH_OPTION,
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    dcgmi = module.get_bin_path(module.params["dcgmi"], required=True)
    cmd = [dcgmi, "diag", "-r", str(module.params["level"]), "--json"]
    rc, out, err = module.run_command(cmd)
    try:
        passed, failures, tests = parse(out)
    except ValueError as exc:
        module.fail_json(msg=f"host {this_host()}: `{' '.join(cmd)}` gave no usable report (rc {rc}): {exc}; "
                         f"nothing was recorded; stderr: {err.strip()[:500]} (fix: run the command on the host; "
                         "DCGM 4 prints a 'DCGM Diagnostic' object whose test_categories, tests and results are "
                         "lists of objects: check that dcgmi and nv-hostengine are DCGM 4's)",
                         cmd=cmd)
    # Not `rc`: Ansible fails any task whose result has a non-zero rc, and a failing diagnostic is a result here
    # (the role cordons the node and fails the host with the failures named).
    changed = False
    if module.params["state_path"]:
        record = {"dcgm_diag": "passed" if passed else "failed", "dcgm_failures": failures}
        try:
            changed = update_state(module.params["state_path"], record, module.check_mode)[0]
        except StateFileError as exc:
            module.fail_json(msg=f"{exc}; the diagnostic {'passed' if passed else 'failed'} but was not recorded",
                             passed=passed, failures=failures, tests=tests, dcgmi_rc=rc)
    module.exit_json(changed=changed, passed=passed, failures=failures, tests=tests, dcgmi_rc=rc)


if __name__ == "__main__":
    main()
