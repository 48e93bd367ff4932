"""Aliases are bounded by what they expand to: a "billion laughs" document (here in a stack's
gpushare:operatorValues) is refused at once with its line, in well under the memory it would take; anchors and
aliases of ordinary size still read."""

from __future__ import annotations

import resource
import time
from pathlib import Path

import pytest

from gpushare.core.errors import GpushareError
from gpushare.core.files import parse_yaml
from gpushare.core.stacks import stack_config


def _bomb(levels: int = 9) -> str:
    lines = ["    a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"    a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_in_stack_settings_is_refused_quickly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gpushare.yaml").write_text("apiVersion: gpushare.io/v1\nkind: Workspace\n")
    stack = tmp_path / "Pulumi.dev.yaml"
    stack.write_text("config:\n  gpushare:environment: environments/dev.yaml\n  gpushare:operatorValues:\n"
                     + _bomb())
    monkeypatch.setenv("GPUSHARE_ROOT", str(tmp_path))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    with pytest.raises(GpushareError) as err:
        stack_config("dev")
    assert time.monotonic() - started < 2
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # KiB: nothing was expanded
    problem = err.value.problems[0]
    assert problem.file == str(stack) and problem.line is not None and "expand to more than" in problem.message


def test_an_alias_that_contains_itself_is_refused() -> None:
    with pytest.raises(GpushareError) as err:
        parse_yaml("values: &a [1, *a]\n", "x.yaml")
    assert "without end" in str(err.value)


def test_ordinary_anchors_and_aliases_still_read() -> None:
    data = parse_yaml("base: &b {replicas: 2, rename: false}\none: *b\ntwo: *b\n" + _bomb(4).replace("    ", ""),
                      "x.yaml")
    assert data["one"] == data["two"] == {"replicas": 2, "rename": False} and len(data["a4"]) == 10
