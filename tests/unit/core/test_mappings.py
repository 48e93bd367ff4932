"""dig: nested reads that give the default, never an AttributeError, where a level is absent, null or not a
mapping, and otherwise read exactly as chained `.get()`s do."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.core.mappings import dig

OBJ = {"metadata": {"name": "a", "labels": None, "annotations": {"x": ""}},
       "spec": {"taints": [{"key": "k"}], "hard": "4", "zero": 0, "off": False, "none": None}}


def test_a_present_value_is_read_as_get_reads_it() -> None:
    assert dig(OBJ, "metadata", "name") == "a"
    assert dig(OBJ, "spec", "taints") == [{"key": "k"}]
    assert dig(OBJ, "metadata", "annotations", "x", default="d") == ""  # falsy values are values
    assert dig(OBJ, "spec", "zero", default=1) == 0
    assert dig(OBJ, "spec", "off", default=True) is False
    assert dig(OBJ, "spec", "none", default="d") is None  # as {"none": None}.get("none", "d")
    assert dig(OBJ) is OBJ


def test_an_absent_key_gives_the_default() -> None:
    assert dig(OBJ, "status", "phase") is None
    assert dig(OBJ, "metadata", "namespace", default="") == ""
    assert dig({}, "a", default=[]) == []


@pytest.mark.parametrize("between", [None, "", 0, False, [], "text", 3, ["a", "b"], ("a",), {"a"}])
def test_a_level_that_is_not_a_mapping_gives_the_default(between: Any) -> None:
    """Chained `(x.get(k) or {}).get(...)` gives {} for a falsy level but fails on a non-empty list or string; dig
    gives the default for every one, so a bad file is reported where it is judged, not as a crash."""
    data = {"spec": between}
    assert dig(data, "spec", "hard") is None
    assert dig(data, "spec", "hard", "nvidia.com/gpu", default="d") == "d"
    assert dig(OBJ, "metadata", "labels", "tenant") is None  # labels: null
    assert dig(OBJ, "spec", "hard", "cpu", default=0) == 0  # hard is a string


@pytest.mark.parametrize("top", [None, [], "text", 0])
def test_a_top_that_is_not_a_mapping_gives_the_default(top: Any) -> None:
    assert dig(top, "metadata", default="d") == "d"
