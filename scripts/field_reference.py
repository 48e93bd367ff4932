"""Rewrite the field reference in docs/environments.md (between its markers) from the pydantic models, through the
JSON Schema editors get. Run it after changing a field in gpushare/core/spec/v1/ (environment.py, profiles.py);
tests/unit/core/test_schemas.py fails while the page is out of date."""

from __future__ import annotations

import sys
from pathlib import Path

from gpushare.core.schemas import REFERENCE_BEGIN, REFERENCE_END, field_reference

PAGE = Path(__file__).resolve().parents[1] / "docs" / "environments.md"


def with_reference(page: str) -> str:
    """The page with the text between its markers replaced by the current reference."""
    head, begin, rest = page.partition(REFERENCE_BEGIN)
    _, end, tail = rest.partition(REFERENCE_END)
    if not begin or not end:
        raise SystemExit(f"{PAGE}: the markers {REFERENCE_BEGIN!r} and {REFERENCE_END!r} are missing")
    return f"{head}{REFERENCE_BEGIN}\n\n{field_reference()}\n{REFERENCE_END}{tail}"


def main() -> int:
    page = PAGE.read_text()
    updated = with_reference(page)
    if updated != page:
        PAGE.write_text(updated)
        print(f"updated {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
