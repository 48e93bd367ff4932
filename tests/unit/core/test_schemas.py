"""The field reference (gpushare.core.schemas) in docs/environments.md is current and has every field of every
model."""

from __future__ import annotations

from tests.conftest import (
    ROOT,
)


def test_the_field_reference_in_environments_md_is_current() -> None:
    from scripts.field_reference import with_reference

    page = (ROOT / "docs" / "environments.md").read_text()
    assert with_reference(page) == page, "docs/environments.md is out of date: run python scripts/field_reference.py"


def test_the_field_reference_has_every_field_of_every_model() -> None:
    from pydantic import BaseModel

    from gpushare.core import spec
    from gpushare.core.schemas import field_reference

    tables = {section.split("\n", 1)[0]: section for section in field_reference().split("### ")[1:]}
    models = {name: cls for name, cls in vars(spec).items()
              if isinstance(cls, type) and issubclass(cls, BaseModel) and name in tables}
    assert {"Environment", "Cluster", "Pool", "Host", "CloudNodes", "Tenant", "Defaults", "MigSpec"} <= set(models)
    for name, model in models.items():
        for field, info in model.model_fields.items():
            shown = info.alias or field
            row = next((line for line in tables[name].splitlines() if line.startswith(f"| `{shown}` |")), None)
            assert row is not None, (name, shown)
            if info.description:
                assert info.description.split(";")[0] in row.replace("\\|", "|"), (name, shown)
