from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "profiles"
ENVIRONMENTS = ROOT / "environments"


@pytest.fixture
def dev_data() -> dict[str, Any]:
    """The shipped dev environment as plain data, to mutate into bad input."""
    return copy.deepcopy(yaml.safe_load((ENVIRONMENTS / "dev.yaml").read_text()))


@pytest.fixture
def write_env(tmp_path: Path) -> Callable[[dict[str, Any]], Path]:
    def write(data: dict[str, Any], name: str | None = None) -> Path:
        # An environment file is named after its environment (resolve refuses a mismatch).
        path = tmp_path / (name or (f"{data['name']}.yaml" if isinstance(data.get("name"), str) else "env.yaml"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write
