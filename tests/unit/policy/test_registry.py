"""Where the policy's pieces live. Every rule registers: importing any entry the callers use (the rules package,
waivers, context, evaluate, the policy pack) imports every module of gpushare/policy/rules/, and RULES then holds
exactly the rules those modules define, each from its own module. And the Pulumi program and ops take NVIDIA's facts
from gpushare.core.nvidia, never through a policy module."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import gpushare
from gpushare.policy.rules import FAMILIES, RULES

PACKAGE = Path(gpushare.__file__).resolve().parent
FAMILY_DIR = PACKAGE / "policy" / "rules"
# What a fresh interpreter has registered after importing one module (argv[1]): no other test's imports help it.
PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
from gpushare.policy.registry import RULES
print(json.dumps({r.id: r.check.__module__ for r in RULES.values()}))
"""


def _rule_calls(path: Path) -> list[str]:
    """The ids of the `@rule(...)` decorators in a module's source."""
    ids = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef):
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and isinstance(deco.func, ast.Name) and deco.func.id == "rule":
                    first = deco.args[0]
                    assert isinstance(first, ast.Constant) and isinstance(first.value, str), f"{path}: rule id"
                    ids.append(first.value)
    return ids


def _defined_in_families() -> dict[str, str]:
    """Rule id -> the family module whose source defines it, over every module of gpushare/policy/rules/."""
    out: dict[str, str] = {}
    for path in sorted(FAMILY_DIR.glob("*.py")):
        if path.name != "__init__.py":
            for rule_id in _rule_calls(path):
                assert rule_id not in out, f"rule {rule_id} defined twice"
                out[rule_id] = f"gpushare.policy.rules.{path.stem}"
    return out


def test_every_family_module_is_imported_and_registers_its_rules() -> None:
    defined = _defined_in_families()
    assert {m.__name__ for m in FAMILIES} == set(defined.values()), "a module of policy/rules/ is not in FAMILIES"
    assert {r.id: r.check.__module__ for r in RULES.values()} == defined


def test_rules_are_defined_only_in_the_family_modules() -> None:
    elsewhere = {str(p.relative_to(PACKAGE)): ids for p in sorted(PACKAGE.rglob("*.py"))
                 if FAMILY_DIR not in p.parents and (ids := _rule_calls(p))}
    assert elsewhere == {}


@pytest.mark.parametrize("entry", ["gpushare.policy.rules", "gpushare.policy.waivers", "gpushare.policy.context",
                                   "gpushare.policy.evaluate", "gpushare.policy.pack"])
def test_importing_an_entry_alone_registers_every_rule(entry: str) -> None:
    run = subprocess.run([sys.executable, "-c", PROBE, entry], capture_output=True, text=True, timeout=120,
                         cwd=PACKAGE.parent)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == _defined_in_families()


def _nvidia_names() -> set[str]:
    """The top-level names gpushare.core.nvidia's modules define."""
    names: set[str] = set()
    for path in (PACKAGE / "core" / "nvidia").glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return names


@pytest.mark.parametrize("package", ["program", "ops"])
def test_nvidia_facts_are_imported_from_core_nvidia_not_from_policy(package: str) -> None:
    facts = _nvidia_names()
    assert {"gpu_operator_chart_values", "effective_device_list_strategy", "toolkit_version_of"} <= facts
    through_policy = []
    for path in sorted((PACKAGE / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpushare.policy"):
                through_policy += [f"{path.relative_to(PACKAGE)}: {node.module}.{a.name}" for a in node.names
                                   if a.name in facts]
    assert through_policy == []
