"""docs/architecture.md names every module of the package: a module added, moved or split without its row in the
sub-package table (or its name in the row) fails here, so the page keeps matching the tree.

A module gpushare/<pkg>/<sub>/<name>.py is named when the row of `gpushare/<pkg>/` holds `<name>` (or `<name>.py`) in
backticks and, for a module in a nested package, the nested package's path (`<sub>/`); or when the row holds its
path under `gpushare/<pkg>/` in backticks. A nested package's __init__.py is named by its path (`<sub>/`); a
module directly under gpushare/ by the row of `gpushare/`. The Ansible collection has its own pages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "gpushare"
ROW = re.compile(r"^\| `gpushare/([\w/]*)` \|(.*)$", re.M)


def rows() -> dict[str, str]:
    """The sub-package table's rows by sub-package ("" for gpushare/ itself): what the row says."""
    return {name.rstrip("/"): text for name, text in ROW.findall(DOC.read_text(encoding="utf-8"))}


def modules() -> list[Path]:
    return sorted(p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py")
                  if "ansible_collections" not in p.parts and "__pycache__" not in p.parts)


def named(module: Path, table: dict[str, str]) -> bool:
    if len(module.parts) == 1:
        return module.name == "__init__.py" or f"`{module.name}`" in table.get("", "")
    row = table.get(module.parts[0])
    if row is None:
        return False
    inner = Path(*module.parts[1:])
    nested = "/".join(inner.parts[:-1])
    if f"`{inner.as_posix()}`" in row:
        return True
    if module.name == "__init__.py":
        return not nested or f"`{nested}/" in row
    stem = module.stem
    if f"`{stem}`" not in row and f"`{stem}.py`" not in row:
        return False
    return not nested or f"`{nested}/" in row


def test_the_table_has_a_row_per_sub_package() -> None:
    table = rows()
    packages = {m.parts[0] for m in modules() if len(m.parts) > 1}
    assert packages - set(table) == set(), "add a row for each sub-package to docs/architecture.md"


@pytest.mark.parametrize("module", modules(), ids=str)
def test_every_module_is_named_in_the_architecture_page(module: Path) -> None:
    assert named(module, rows()), (
        f"gpushare/{module} is not named in docs/architecture.md: add it to the row of "
        f"gpushare/{module.parts[0] + '/' if len(module.parts) > 1 else ''} with what it holds")


def test_the_check_catches_a_module_left_out() -> None:
    table = rows()
    assert not named(Path("core/not_a_module.py"), table)
    assert not named(Path("planner/solve/not_a_stage.py"), table)
    assert not named(Path("no_such_package/x.py"), table)
