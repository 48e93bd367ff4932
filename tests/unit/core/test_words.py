"""Counts in messages (core/words.py): one GPU, two GPUs, and no `1 GPUs` left in the messages that count."""

from __future__ import annotations

import re

import pytest

from gpushare.core.words import counted
from tests.conftest import ROOT


@pytest.mark.parametrize(("n", "noun", "plural", "text"), [
    (1, "GPU", "", "1 GPU"), (2, "GPU", "", "2 GPUs"), (0, "node", "", "0 nodes"),
    (1, "workload replica", "", "1 workload replica"), (3, "copy", "copies", "3 copies"),
    (1, "copy", "copies", "1 copy"),
])
def test_counted(n: int, noun: str, plural: str, text: str) -> None:
    assert counted(n, noun, plural) == text


# `{expression} GPUs` (or nodes, hosts) in an f-string: a count that reads "1 GPUs" when the expression is 1. The
# places where it cannot be 1, or is not a count, are listed with their reason.
COUNT_NOUN = re.compile(r"\{[^{}]*\} (GPUs|nodes|hosts)\b")
CANNOT_BE_ONE = {
    "gpushare/cli/adopt.py": 2,  # `N on all M nodes` and `N on M nodes: a, ...`: only where more than one node
    "gpushare/cli/pack.py": 1,  # `lower bound {x:g} GPUs`: a fractional bound
    "gpushare/cli/preview.py": 1,  # `{min}..{max} nodes`: a range
    "gpushare/cli/capacity.py": 1,  # the chart's `{now}→{proposed} GPUs`: two counts
    "gpushare/core/dra_facts.py": 1,  # `{model.name} GPUs`: a GPU model's name, not a count
}


def test_no_message_counts_a_plural_noun_without_counted() -> None:
    found: dict[str, int] = {}
    for path in sorted((ROOT / "gpushare").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if "ansible_collections" in rel:  # the collection's modules run on hosts without gpushare's package
            continue
        hits = len(COUNT_NOUN.findall(path.read_text()))
        if hits:
            found[rel] = hits
    assert found == CANNOT_BE_ONE, "use gpushare.core.words.counted for counts that can be 1"
