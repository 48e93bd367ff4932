"""The collection's modules document what they take: each module's options as ansible-doc shows them (doc fragments
resolved) are its ARGUMENT_SPEC (types, elements, defaults, choices, required), and its EXAMPLES are tasks that
ansible-doc renders and that use the module's own options. Written twice, checked here; nothing boots a test host."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ansible.test_ansible_modules import LIBRARY, module
from tests.ansible.testbed import ROOT

COLLECTION = LIBRARY.parents[1]
MODULES = sorted(p.stem for p in LIBRARY.glob("*.py"))
BIN = Path(sys.executable).parent


def ansible_doc(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PYTHONWARNINGS": "ignore",
           "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "gpushare"), "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "False"}
    return subprocess.run([str(BIN / "ansible-doc"), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


@cache
def documented() -> dict[str, Any]:
    run = ansible_doc("--json", *(f"gpushare.fleet.{m}" for m in MODULES))
    assert run.returncode == 0, run.stderr
    return {name.removeprefix("gpushare.fleet."): doc for name, doc in json.loads(run.stdout).items()}


def argument_spec(name: str) -> dict[str, Any]:
    if name == "role_arguments":  # an action plugin; its module file only documents it
        spec = importlib.util.spec_from_file_location("gpushare_test_action_role_arguments",
                                                      COLLECTION / "plugins" / "action" / "role_arguments.py")
        assert spec and spec.loader
        action = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(action)
        return action.ARGUMENT_SPEC
    return module(name).ARGUMENT_SPEC


def _normal(option: dict[str, Any]) -> dict[str, Any]:
    """What an option means to Ansible, with its defaults filled in the same way on both sides."""
    kind = option.get("type", "str")
    return {"type": kind, "elements": option.get("elements"), "required": bool(option.get("required", False)),
            "default": option.get("default"), "choices": option.get("choices")}


def test_every_module_is_checked() -> None:
    assert MODULES == ["apt_source", "cdi_spec", "containerd_runtime", "dcgm_diag", "gpu_facts", "gpushare_state",
                       "host_read", "kube_node", "role_arguments"]
    assert set(documented()) == set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_documented_options_are_the_argument_spec(name: str) -> None:
    options = documented()[name]["doc"]["options"]
    spec = argument_spec(name)
    assert sorted(options) == sorted(spec)
    for option, doc in options.items():
        assert _normal(doc) == _normal(spec[option]), option
        assert doc.get("description"), option


def test_the_state_path_option_is_shared_by_spec_and_fragment() -> None:
    from gpushare.ansible_collections.gpushare.fleet.plugins.doc_fragments.state_file import ModuleDocFragment

    fragment = yaml.safe_load(ModuleDocFragment.DOCUMENTATION)["options"]
    shared = sys.modules["ansible_collections.gpushare.fleet.plugins.module_utils.state"].STATE_PATH_OPTION
    for name in ("dcgm_diag", "host_read"):
        assert argument_spec(name)["state_path"] is shared["state_path"]
        assert documented()[name]["doc"]["options"]["state_path"]["description"] == fragment["state_path"][
            "description"]


@pytest.mark.parametrize("name", MODULES)
def test_examples_are_tasks_with_the_module_s_own_options(name: str) -> None:
    tasks = yaml.safe_load(documented()[name]["examples"])
    assert isinstance(tasks, list) and tasks
    options = documented()[name]["doc"]["options"]
    required = {o for o, doc in options.items() if doc.get("required")}
    calls = [task[f"gpushare.fleet.{name}"] for task in tasks if f"gpushare.fleet.{name}" in task]
    assert calls, f"no example calls gpushare.fleet.{name}"
    for task in tasks:
        assert task.get("name"), task
    for args in calls:
        args = args or {}
        assert set(args) <= set(options), set(args) - set(options)
        assert required <= set(args), required - set(args)
        for option, value in args.items():
            if options[option].get("choices") and isinstance(value, str) and "{{" not in value:
                assert value in options[option]["choices"], (option, value)


def test_ansible_doc_renders_every_module_with_its_examples() -> None:
    run = ansible_doc(*(f"gpushare.fleet.{m}" for m in MODULES))
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("EXAMPLES:") == len(MODULES), run.stdout
    # The module path alone (as ansible-test sanity reads modules) finds them too, the fragment from the collection.
    by_path = ansible_doc("-M", str(LIBRARY), "--json", "dcgm_diag")
    assert by_path.returncode == 0, by_path.stderr
    assert "state_path" in json.loads(by_path.stdout)["dcgm_diag"]["doc"]["options"]
