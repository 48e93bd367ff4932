"""`make test`'s driver (tools/run_tests.sh) runs each group of tests/cluster as soon as the Go programs it waits for
are built. A test that needs a program its group does not wait for passes wherever the programs are already built and
fails only on a fresh machine, so these checks read each test module's fixtures and imports and hold them against its
group: the Kueue fixtures (`queues`, `kueue_build`) and the JobSet controller (`jobset=True`) belong to the queue
group, the Pulumi engine (tests/cluster/pulumi_engine.py) to the real-engine group; everything else runs on the
control plane (etcd, Kubernetes, kwok) alone."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "tools" / "run_tests.sh"
GOBUILD = ROOT / "tools" / "gobuild.sh"
CLUSTER = ROOT / "tests" / "cluster"
# What a module's source shows it needs beyond the control plane.
KUEUE_FIXTURES = {"queues", "kueue_build"}


def _assignment(text: str, name: str) -> str:
    match = re.search(rf'^{name}="([^"]*)"$', text, re.M)
    assert match, f"{SCRIPT.name} no longer sets {name}"
    return match.group(1)


def _script() -> tuple[list[str], set[str], dict[str, tuple[set[str], list[str]]]]:
    """(the build order, the control plane's programs, group name -> (programs it waits for, its test files))."""
    text = SCRIPT.read_text()
    programs = _assignment(text, "programs").split()
    control_plane = _assignment(text, "control_plane")
    body = re.search(r"^CLUSTER_GROUPS=\((.*?)^\)", text, re.M | re.S)
    assert body, f"{SCRIPT.name} no longer declares CLUSTER_GROUPS"
    groups: dict[str, tuple[set[str], list[str]]] = {}
    for entry in re.findall(r'"([^"]*)"', body.group(1)):
        name, needs, files = entry.replace("$control_plane", control_plane).split("|")
        groups[name] = (set(needs.split()), files.split())
    return programs, set(control_plane.split()), groups


def _imports(tree: ast.Module) -> set[str]:
    """The tests.cluster modules a module imports (their own needs count as its)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "tests.cluster":
                out |= {alias.name for alias in node.names}
            elif node.module.startswith("tests.cluster."):
                out.add(node.module.split(".")[2])
    return out


def _direct_needs(path: Path) -> set[str]:
    text = path.read_text()
    tree = ast.parse(text)
    needs: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if {a.arg for a in node.args.args} & KUEUE_FIXTURES:
                needs.add("kueue")
        if isinstance(node, ast.keyword) and node.arg == "jobset" and isinstance(node.value, ast.Constant) \
                and node.value.value is True:
            needs |= {"kueue", "jobset"}
    if "pulumi_engine" in _imports(tree):
        needs |= {"pulumi", "pulumi-kubernetes"}
    return needs


def needs_of(module: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """The programs beyond the control plane that tests/cluster/<module>.py needs, with the modules it imports."""
    path = CLUSTER / f"{module}.py"
    if module in seen or not path.exists() or module == "conftest":
        return set()
    needs = _direct_needs(path)
    for imported in _imports(ast.parse(path.read_text())):
        needs |= needs_of(imported, seen | {module})
    return needs


def test_each_test_module_waits_for_every_program_it_needs() -> None:
    _, control_plane, groups = _script()
    group_of = {f: name for name, (_, files) in groups.items() for f in files}
    wrong = []
    for path in sorted(CLUSTER.glob("test_*.py")):
        rel = str(path.relative_to(ROOT))
        waits = groups[group_of[rel]][0] if rel in group_of else control_plane
        missing = needs_of(path.stem) - waits
        if missing:
            wrong.append(f"{rel} needs {sorted(missing)} but its group ({group_of.get(rel, 'control-plane')}) "
                         f"waits only for {sorted(waits)}: name it in a group of CLUSTER_GROUPS in {SCRIPT.name}")
    assert not wrong, "\n".join(wrong)


def test_the_needs_are_read_from_fixtures_and_imports() -> None:
    """The reading above finds what these modules are known to need (or every module would pass as control-plane)."""
    assert needs_of("test_kueue") == {"kueue"}
    assert needs_of("test_jobset") == {"kueue", "jobset"}
    assert needs_of("test_pulumi_up") == {"pulumi", "pulumi-kubernetes"}
    assert needs_of("test_pulumi_ops") == {"pulumi", "pulumi-kubernetes"}  # through test_pulumi_up's fixtures
    assert needs_of("test_controlplane") == set()


def test_groups_name_existing_modules_once_and_programs_gobuild_builds() -> None:
    programs, control_plane, groups = _script()
    buildable = set(re.findall(r"^  ([a-z0-9-]+)(?:\|[a-z0-9-]+)*\)", GOBUILD.read_text(), re.M))
    assert set(programs) <= buildable, f"{sorted(set(programs) - buildable)} are not programs gobuild.sh builds"
    assert len(programs) == len(set(programs))
    seen: set[str] = set()
    for name, (waits, files) in groups.items():
        assert control_plane <= waits, f"group {name} must wait for the control plane too"
        assert waits <= set(programs), f"group {name} waits for {sorted(waits - set(programs))}, never built"
        for f in files:
            assert (ROOT / f).is_file() and f.startswith("tests/cluster/test_"), f"group {name}: no test module {f}"
            assert f not in seen, f"{f} is in two groups"
            seen.add(f)


@pytest.mark.parametrize("group", ["nvidia", "control-plane"])
def test_the_early_groups_programs_build_first(group: str) -> None:
    """NVIDIA's two programs, then the control plane, are built before the longer builds the later groups wait for."""
    programs, control_plane, _ = _script()
    first = {"nvidia": ["mig-parted", "k8s-device-plugin"], "control-plane": sorted(control_plane)}[group]
    position = {"nvidia": 0, "control-plane": 2}[group]
    assert sorted(programs[position:position + len(first)]) == sorted(first)


def test_the_script_parses_in_bash() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)
