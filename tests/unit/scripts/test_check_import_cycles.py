"""`make lint`'s import-cycle check (scripts/check_import_cycles.py): a cycle planted between two modules of one
package fails it and names the chain, a cycle of TYPE_CHECKING imports too, and gpushare itself has none."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "check_import_cycles.py"


def _check(package: str, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = f"{path}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return subprocess.run([sys.executable, str(SCRIPT), package], capture_output=True, text=True, env=env,
                          check=False, timeout=120)


def _plant(root: Path, modules: dict[str, str]) -> None:
    package = root / "planted"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "inner" / "__init__.py").write_text("")
    for name, text in modules.items():
        (package / f"{name.replace('.', '/')}.py").write_text(text)


@pytest.mark.parametrize("b_imports_a", [
    "from planted.inner import a\n",
    "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from planted.inner.a import A\n",
], ids=["runtime", "type-checking"])
def test_a_planted_cycle_inside_one_layer_fails_the_check(tmp_path: Path, b_imports_a: str) -> None:
    _plant(tmp_path, {"inner.a": "from planted.inner import b\n\nclass A: ...\n", "inner.b": b_imports_a,
                      "inner.c": "from planted.inner import a\n"})
    result = _check("planted", tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "import cycle: planted.inner.a -> planted.inner.b -> planted.inner.a" in result.stderr
    assert "planted.inner.c" not in result.stderr  # importing a member of a cycle is no cycle


def test_a_package_without_cycles_passes(tmp_path: Path) -> None:
    _plant(tmp_path, {"inner.a": "from planted.inner import b\n", "inner.b": ""})
    result = _check("planted", tmp_path)
    assert result.returncode == 0, result.stderr


def test_gpushare_has_no_import_cycle() -> None:
    result = _check("gpushare")
    assert result.returncode == 0, result.stderr
