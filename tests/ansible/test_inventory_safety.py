"""Strings from environment files stay data (docs/safety-rules.md rule 12): `gpushare validate` refuses a template
expression or a command substitution in every string field, and Ansible never evaluates one that reaches it from the
inventory."""

from __future__ import annotations

import ast
import copy
import importlib.util
import json
import subprocess
import sys
import types
import typing
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core.loading import format_path
from gpushare.core.resolve import resolve
from gpushare.core.spec import Environment
from gpushare.ops.inventory import build_inventory
from tests.conftest import PROFILES, ROOT, WORKSPACE

pytestmark = pytest.mark.usefixtures("frozen_workspace")  # GPUSHARE_ROOT: the frozen workspace, as in tests/unit

FIXTURES = ROOT / "tests" / "data" / "inventory_safety"
EVERY_STRING = FIXTURES / "environments" / "every-string.yaml"
COLLECTION = ROOT / "gpushare" / "ansible_collections" / "gpushare" / "fleet"
PLUGIN = COLLECTION / "plugins" / "inventory" / "gpushare_fleet.py"
ANSIBLE_BIN = Path(sys.executable).parent

runner = CliRunner()


def attacks(marker_dir: Path) -> dict[str, str]:
    """Payloads that create a marker file if anything evaluates them: Jinja2 expression, statement, shell forms."""
    tag = uuid.uuid4().hex
    return {
        "expression": f"{{{{ lookup('pipe', 'touch {marker_dir}/PWNED-{tag}-expression') }}}}",
        "statement": f"{{% if lookup('pipe', 'touch {marker_dir}/PWNED-{tag}-statement') %}}{{% endif %}}",
        "substitution": f"$(touch {marker_dir}/PWNED-{tag}-substitution)",
        "backticks": f"`touch {marker_dir}/PWNED-{tag}-backticks`",
    }


# ---------------------------------------------------------------- every string field, found from the models


@dataclass(frozen=True)
class Slot:
    """A string in the fixture: its data path, whether it is a mapping key, and the model field that holds it."""

    path: tuple[Any, ...]
    is_key: bool
    field: str


def _strip(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _options(annotation: Any) -> list[Any]:
    annotation = _strip(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [_strip(a) for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _holds_text(annotation: Any) -> Iterator[str]:
    """Yield 'text', 'choice' (a Literal) or 'key' for every place a string sits in an annotation, models aside."""
    for option in _options(annotation):
        origin = typing.get_origin(option)
        if option is str:
            yield "text"
        elif origin is typing.Literal:
            yield "choice"
        elif origin is list:
            yield from _holds_text(typing.get_args(option)[0])
        elif origin is dict:
            key, value = typing.get_args(option)
            if list(_holds_text(key)):
                yield "key"
            yield from _holds_text(value)


def _declared_by(model: type[BaseModel], name: str) -> str:
    """The class that declares a field (profile kinds inherit name and description from one base)."""
    owner = next(k for k in reversed(model.__mro__) if name in getattr(k, "__annotations__", {}))
    return f"{owner.__name__}.{name}"


def models_below(model: type[BaseModel], seen: set[type] | None = None) -> set[type[BaseModel]]:
    seen = set() if seen is None else seen
    if model in seen:
        return seen
    seen.add(model)
    for field in model.model_fields.values():
        stack = [field.annotation]
        while stack:
            for option in _options(stack.pop()):
                if _is_model(option):
                    models_below(option, seen)
                stack.extend(typing.get_args(option) if typing.get_origin(option) in (list, dict) else ())
    return seen


def free_text_fields(model: type[BaseModel]) -> set[str]:
    """Every `Model.field` below the model whose type holds free text (not a Literal choice) anywhere."""
    return {_declared_by(m, name) for m in models_below(model) for name, field in m.model_fields.items()
            if set(_holds_text(field.annotation)) - {"choice"}}


def _model_for(options: list[Any], data: dict[str, Any]) -> type[BaseModel] | None:
    """The model a mapping validates as: the only one, or the one whose `kind` tag the data names."""
    models = [o for o in options if _is_model(o)]
    if len(models) == 1:
        return models[0]
    for model in models:
        kind = model.model_fields.get("kind")
        if kind is not None and data.get("kind") in typing.get_args(_strip(kind.annotation)):
            return model
    return None


def slots(annotation: Any, data: Any, path: tuple[Any, ...], field: str) -> Iterator[Slot]:
    """Walk data and its annotation together, yielding every string the data holds where a string is allowed."""
    options = _options(annotation)
    if isinstance(data, str):
        if any(o is str or typing.get_origin(o) is typing.Literal for o in options):
            yield Slot(path, False, field)
        return
    if isinstance(data, dict):
        model = _model_for(options, data)
        if model is not None:
            for name, value in data.items():
                yield from slots(model.model_fields[name].annotation, value, (*path, name), _declared_by(model, name))
            return
        mapping = next((o for o in options if typing.get_origin(o) is dict), None)
        if mapping is not None:
            key_type, value_type = typing.get_args(mapping)
            for key, value in data.items():
                if list(_holds_text(key_type)):
                    yield Slot((*path, key), True, field)
                yield from slots(value_type, value, (*path, key), field)
        return
    if isinstance(data, list):
        sequence = next((o for o in options if typing.get_origin(o) is list), None)
        if sequence is not None:
            for i, item in enumerate(data):
                yield from slots(typing.get_args(sequence)[0], item, (*path, i), field)


def fixture_data() -> dict[str, Any]:
    return yaml.safe_load(EVERY_STRING.read_text())


def fixture_slots() -> list[Slot]:
    return list(slots(Environment, fixture_data(), (), "Environment"))


def with_text_at(data: dict[str, Any], slot: Slot, text: str) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """A copy of the data with `text` put into the slot (as the value, or as the key); and the path it now has."""
    data = copy.deepcopy(data)
    parent: Any = data
    for part in slot.path[:-1]:
        parent = parent[part]
    last = slot.path[-1]
    if slot.is_key:
        parent[text] = parent.pop(last)
        return data, (*slot.path[:-1], text)
    parent[last] = text
    return data, slot.path


def test_the_fixture_fills_in_every_string_field_of_the_models() -> None:
    """A string field added to the models without a value here would escape the test below: name it."""
    assert fixture_data()["name"] == EVERY_STRING.stem
    missing = free_text_fields(Environment) - {slot.field for slot in fixture_slots()}
    assert not missing, f"give these fields a value in {EVERY_STRING.relative_to(ROOT)}: {sorted(missing)}"
    # The fixture itself is valid, so every refusal below comes from the one string that changed.
    result = runner.invoke(app, ["validate", "--env", str(EVERY_STRING), "--json"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("form", ["expression", "statement", "substitution", "backticks"])
def test_validate_refuses_template_and_shell_text_in_every_string_field(tmp_path: Path, form: str) -> None:
    payload = attacks(tmp_path)[form]
    checked = 0
    for slot in fixture_slots():
        data, path = with_text_at(fixture_data(), slot, f"x{payload}")
        env = tmp_path / "environments" / EVERY_STRING.name
        env.parent.mkdir(exist_ok=True)
        env.write_text(yaml.safe_dump(data, sort_keys=False))
        result = runner.invoke(app, ["validate", "--env", str(env), "--json"])
        assert result.exit_code == 1, f"{slot.field} at {format_path(path)} took {payload!r}: {result.output}"
        problems = json.loads(result.stdout)["problems"]
        where = format_path(path)
        # A kind tag that no model has is reported on the object it would select.
        located = [p for p in problems if p["path"] in (where, format_path(path[:-1]))]
        assert located, f"{slot.field}: no problem at {where}: {problems}"
        assert all(p["file"] == str(env) and p["line"] and p["fix"] for p in located), located
        checked += 1
    assert checked == len(fixture_slots()) >= 40
    assert not list(tmp_path.glob("PWNED-*"))


def test_a_profile_file_description_is_refused_too(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    profile = yaml.safe_load((PROFILES / "exclusive.yaml").read_text())
    profile["description"] = "Whole GPUs " + attacks(tmp_path)["expression"]
    (profiles / "exclusive.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    result = runner.invoke(app, ["validate", "--env", str(EVERY_STRING), "--profiles", str(profiles), "--json"])
    assert result.exit_code == 1, result.output
    [problem] = json.loads(result.stdout)["problems"]
    assert problem["file"] == str(profiles / "exclusive.yaml") and problem["path"] == "description"
    assert "template code" in problem["message"] and "Ansible and Jinja2" in problem["fix"]


@pytest.mark.parametrize(("address", "accepted"), [
    # fe80::1%eth0 is refused: which machine a link-local address reaches depends on the controller's own links.
    ("10.80.1.12", True), ("2001:db8::11", True), ("fe80::1%eth0", False), ("gpu-01.lab.example.net", True),
    ("gpu01", True), ("999.40.3.11", False), ("10.80.1", False), ("010.80.1.11", False), ("GPU01.example.net", False),
    ("-gpu.example.net", False), ("gpu_01.example.net", False), ("gpu 01", False), ("10.80.1.11%eth0", False),
    ("fe80::1%$(id)", False), ("a" * 64 + ".example.net", False), ("10.80.1.11; id", False), ("", False),
])
def test_host_address_is_an_ip_address_or_an_rfc1123_hostname(write_env: Any, address: str, accepted: bool) -> None:
    data = fixture_data()
    data["pools"][0]["hosts"][1]["address"] = address
    result = runner.invoke(app, ["validate", "--env", str(write_env(data)), "--json"])
    assert result.exit_code == (0 if accepted else 1), result.output
    if not accepted:
        [problem] = json.loads(result.stdout)["problems"]
        assert problem["path"] == "pools[0].hosts[1].address" and "hostname" in problem["fix"]


@pytest.mark.parametrize(("field", "value", "accepted"), [
    ("kubeconfig_context", "gke_my-project_europe-west4_lab", True),
    ("kubeconfig_context", "arn:aws:eks:eu-west-1:123456789012:cluster/lab", True),
    ("kubeconfig_context", "admin@lab", True),
    ("kubeconfig_context", "lab admin", False),
    ("kubeconfig_context", "lab'admin", False),
    ("kubeconfig_context", "lab${HOME}", False),
    ("region", "eu-west-1", True),
    ("region", "Europe-West4", False),
])
def test_cluster_strings_follow_their_domain(write_env: Any, field: str, value: str, accepted: bool) -> None:
    data = fixture_data()
    data["clusters"][0][field] = value
    result = runner.invoke(app, ["validate", "--env", str(write_env(data)), "--json"])
    assert result.exit_code == (0 if accepted else 1), result.output


@pytest.mark.parametrize(("value", "accepted"), [
    ("search", True), ("team_a.v2", True), ("", True), ("-search", False), ("a" * 64, False), ("team/a", False),
])
def test_label_values_follow_kubernetes_syntax(write_env: Any, value: str, accepted: bool) -> None:
    data = fixture_data()
    data["pools"][0]["labels"]["team.example.com/owner"] = value
    result = runner.invoke(app, ["validate", "--env", str(write_env(data)), "--json"])
    assert result.exit_code == (0 if accepted else 1), result.output


def test_descriptions_take_prose_but_say_why_template_text_is_refused(write_env: Any) -> None:
    data = fixture_data()
    data["description"] = "Lab fleet: 50% of GPUs {shared}, costs $5/h;\nsee the #gpu channel."
    assert runner.invoke(app, ["validate", "--env", str(write_env(data))]).exit_code == 0
    data["description"] = "Lab fleet {# hidden #}"
    result = runner.invoke(app, ["validate", "--env", str(write_env(data)), "--json"])
    [problem] = json.loads(result.stdout)["problems"]
    assert problem["path"] == "description" and "'{#'" in problem["message"]


# ---------------------------------------------------------------- what Ansible does with what reaches it


def test_the_inventory_plugin_never_marks_its_values_trusted() -> None:
    """ansible-core 2.19 templates inventory values only if the plugin trusts them: this one never does."""
    tree = ast.parse(PLUGIN.read_text())
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    names |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    names |= {alias.name.rsplit(".", 1)[-1] for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)
              for alias in node.names}
    names |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    forbidden = {n for n in names if any(word in n.lower() for word in ("trust_as", "trustedastemplate", "unsafe",
                                                                        "templar", "_template", "constructable"))}
    assert not forbidden, f"the inventory plugin must hand Ansible plain data, not {sorted(forbidden)}"
    trust = [node for node in ast.walk(tree) if isinstance(node, ast.Assign | ast.AnnAssign)
             for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
             if isinstance(target, ast.Name | ast.Attribute) and "trusted" in ast.unparse(target)]
    assert [ast.unparse(node) for node in trust] == ["trusted_by_default = False"]


def _load_plugin(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_inventory_plugin_refuses_an_ansible_core_that_templates_inventory_values() -> None:
    from ansible.errors import AnsibleParserError

    plugin = _load_plugin(PLUGIN, "gpushare_fleet_checked")
    assert plugin.InventoryModule.trusted_by_default is False
    for old in ("2.17.12", "2.18.6"):
        with pytest.raises(AnsibleParserError, match="ansible-core 2.19 or later"):
            plugin.require_data_tagging(old)
    for new in ("2.19.0", "2.19.14", "2.20.0rc1"):
        plugin.require_data_tagging(new)


def test_pyproject_requires_an_ansible_core_with_data_tagging_that_runs_on_python_3_11() -> None:
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "ansible-core>=2.19,<2.20" in deps


def test_no_playbook_task_or_module_hands_a_value_to_a_shell() -> None:
    """`$(...)` and backticks are inert only while no shell reads a value: tasks use argv, modules no shell."""
    shells = {"shell", "ansible.builtin.shell", "raw", "ansible.builtin.raw", "script", "ansible.builtin.script"}
    for path in sorted(COLLECTION.rglob("*.yml")):
        def tasks(node: Any) -> Iterator[dict[str, Any]]:
            """Every task (an item of a task list, of a play's or a block's), not a module's arguments: the user
            module's `shell:` is the account's login shell, not a shell module."""
            if isinstance(node, list):
                for item in node:
                    if isinstance(item, dict):
                        yield item
                        for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
                            yield from tasks(item.get(key))

        for task in tasks(yaml.safe_load(path.read_text())):
            assert not shells & set(task), f"{path.relative_to(ROOT)}: {task.get('name')} uses a shell"
    for path in sorted(COLLECTION.rglob("*.py")):
        source = path.read_text()
        assert "shell=True" not in source and "use_unsafe_shell=True" not in source, path


def run_tampered(tmp_path: Path, payload: str, *args: str, mark_trusted: bool = False) -> subprocess.CompletedProcess:
    """Run an Ansible command on an inventory from the real plugin whose every value carries the payload."""
    attack = tmp_path / "attack.tampered.json"
    attack.write_text(json.dumps({"environment": str(EVERY_STRING), "payload": payload, "mark_trusted": mark_trusted}))
    env = {"PATH": f"{ANSIBLE_BIN}:/usr/bin:/bin", "HOME": str(tmp_path),
           "ANSIBLE_INVENTORY_PLUGINS": str(FIXTURES / "inventory_plugins"),
           "ANSIBLE_INVENTORY_ENABLED": "gpushare_tampered", "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "True",
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-local"), "ANSIBLE_NOCOLOR": "1",
           "GPUSHARE_ROOT": str(WORKSPACE)}  # the plugin runs from tmp_path, in no workspace
    return subprocess.run([str(ANSIBLE_BIN / args[0]), "-i", str(attack), *args[1:]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


PLAYBOOK = """
- name: Use every inventory value the ways gpushare's roles do
  hosts: lab-a100-01
  gather_facts: false
  vars:
    inventory_values: >-
      {{ hostvars[inventory_hostname] | dict2items | selectattr('key', 'match', '^(gpushare_|ansible_host$)')
         | items2dict }}
    role_style_context: "{{ gpushare_kubeconfig_context | default('') }}"
  tasks:
    - name: Write every value as JSON
      ansible.builtin.copy:
        content: "{{ inventory_values | to_nice_json }}"
        dest: "{{ out_dir }}/values.json"
        mode: "0600"
    - name: Render every value through a template
      ansible.builtin.template:
        src: values.j2
        dest: "{{ out_dir }}/values.txt"
        mode: "0600"
    - name: Put a value on a command line, as the roles hand contexts to kubectl
      ansible.builtin.command:
        argv: [echo, "{{ role_style_context }}"]
      register: echoed
      changed_when: false
    - name: Keep what the command saw
      ansible.builtin.copy:
        content: "{{ echoed.stdout }}"
        dest: "{{ out_dir }}/echoed.txt"
        mode: "0600"
      when: gpushare_pool | length > 0
"""

VALUES_TEMPLATE = """{% for name, value in inventory_values | dictsort %}
{{ name }}: {{ value }}
{% endfor %}
"""


def test_ansible_never_evaluates_template_or_shell_text_that_reaches_it_from_the_inventory(tmp_path: Path) -> None:
    payloads = attacks(tmp_path)
    payload = " " + " ".join(payloads.values())
    listed = run_tampered(tmp_path, payload, "ansible-inventory", "--list")
    assert listed.returncode == 0, listed.stderr
    hostvars = json.loads(listed.stdout)["_meta"]["hostvars"]["lab-a100-01"]
    # Every string came through, and Ansible keeps each one as untrusted data.
    assert hostvars["ansible_host"] == {"__ansible_unsafe": "10.80.1.11" + payload}
    assert hostvars["gpushare_kubeconfig_context"] == {"__ansible_unsafe": "lab-metal-admin" + payload}

    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "site.yml").write_text(PLAYBOOK)
    (tmp_path / "values.j2").write_text(VALUES_TEMPLATE)
    played = run_tampered(tmp_path, payload, "ansible-playbook", str(tmp_path / "site.yml"),
                          "-e", f"out_dir={out}")
    assert played.returncode == 0, played.stdout + played.stderr
    assert not list(tmp_path.glob("PWNED-*")), "Ansible evaluated text from the inventory"

    # What the tasks saw is the inventory's text, verbatim: the real plugin's values with the payload appended.
    tampered = _load_plugin(FIXTURES / "inventory_plugins" / "gpushare_tampered.py", "gpushare_tampered_expected")
    expected = tampered.tamper(build_inventory(resolve(EVERY_STRING)), payload)
    fleet_vars = {**next(g.vars for g in expected.groups.values() if g.vars), **expected.hostvars["lab-a100-01"]}
    seen = json.loads((out / "values.json").read_text())
    assert seen == {k: v for k, v in fleet_vars.items() if k.startswith("gpushare_") or k == "ansible_host"}
    assert (out / "values.txt").read_text().count(payloads["expression"]) >= len(seen)
    assert (out / "echoed.txt").read_text() == "lab-metal-admin" + payload


def test_the_harness_sees_evaluation_when_a_plugin_trusts_its_values(tmp_path: Path) -> None:
    """The control for the test above: the same payload from a plugin that marks values trusted does run."""
    marker = attacks(tmp_path)["expression"]
    listed = run_tampered(tmp_path, marker, "ansible", "lab-a100-01", "-m", "ansible.builtin.debug",
                          "-a", "var=gpushare_kubeconfig_context", mark_trusted=True)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert list(tmp_path.glob("PWNED-*")), "a trusted inventory value should have been templated"
