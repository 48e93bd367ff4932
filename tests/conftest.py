"""Shared fixtures. Unit tests run in the frozen workspace tests/fixtures/ and find pools, tenants and hosts by
name, so editing the shipped examples (environments/, profiles/, policies/) changes only the tests of those examples."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "tests" / "unit"  # the unit tests, whose folders mirror gpushare/
WORKSPACE = ROOT / "tests" / "fixtures"  # the frozen workspace unit tests run in
ENVIRONMENTS = WORKSPACE / "environments"  # frozen copies of dev, pilot and prod
PROFILES = WORKSPACE / "profiles"  # frozen copies of the profiles they use
SHIPPED_ENVIRONMENTS = ROOT / "environments"  # the examples users edit: only the shipped-example tests read them


def fixture_data(env: str) -> dict[str, Any]:
    """A frozen fixture environment as plain data, to mutate into bad input."""
    data: dict[str, Any] = yaml.safe_load((ENVIRONMENTS / f"{env}.yaml").read_text())
    return data


def _named(items: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [item for item in items if item.get("name") == name]
    if len(found) != 1:
        raise KeyError(f"{len(found)} {kind}s named {name!r}; have {[i.get('name') for i in items]}")
    return found[0]


def pool_named(d: dict[str, Any], name: str) -> dict[str, Any]:
    return _named(d["pools"], "pool", name)


def tenant_named(d: dict[str, Any], name: str) -> dict[str, Any]:
    return _named(d["tenants"], "tenant", name)


def cluster_named(d: dict[str, Any], name: str) -> dict[str, Any]:
    return _named(d["clusters"], "cluster", name)


def host_named(d: dict[str, Any], name: str) -> dict[str, Any]:
    """A host by name, whichever pool lists it."""
    return _named([h for p in d["pools"] for h in p.get("hosts") or []], "host", name)


@pytest.fixture(scope="module")
def frozen_workspace() -> Iterator[None]:
    """The frozen workspace as GPUSHARE_ROOT for a whole module: `--env dev`, stacks and guardrails come from it.
    Module scope, so that module-scoped fixtures (plans collected once) see it too. Every unit test (tests/unit/)
    runs in it; a module of another suite asks for it with
    `pytestmark = pytest.mark.usefixtures("frozen_workspace")`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GPUSHARE_ROOT", str(WORKSPACE))
        yield


@pytest.fixture(scope="module", autouse=True)
def unit_tests_in_the_frozen_workspace(request: pytest.FixtureRequest) -> None:
    """Every module under tests/unit/ runs in the frozen workspace."""
    if UNIT in request.path.parents:
        request.getfixturevalue("frozen_workspace")


@pytest.fixture
def shipped_workspace(monkeypatch: pytest.MonkeyPatch) -> Path:
    """For the tests of the shipped examples only: the repository's own workspace, whatever a user made of it."""
    monkeypatch.setenv("GPUSHARE_ROOT", str(ROOT))
    return ROOT


@pytest.fixture
def dev_data() -> dict[str, Any]:
    """The frozen dev environment as plain data, to mutate into bad input."""
    return copy.deepcopy(fixture_data("dev"))


@pytest.fixture
def write_env(tmp_path: Path) -> Callable[..., Path]:
    """Writes data as `environments/<name>.yaml` in a scratch workspace whose profiles are the frozen ones."""
    def write(data: dict[str, Any], name: str | None = None) -> Path:
        # An environment file is named after its environment (resolve refuses a mismatch).
        relative = Path(name or (f"{data['name']}.yaml" if isinstance(data.get("name"), str) else "env.yaml"))
        workspace = tmp_path / "workspace" / relative.parent
        path = workspace / "environments" / relative.name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not (workspace / "profiles").exists():
            (workspace / "profiles").symlink_to(PROFILES)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write
