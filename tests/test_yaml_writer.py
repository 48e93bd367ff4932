"""gpushare.core.files.yaml_text: the one form of the YAML gpushare writes for people, and every writer using it."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gpushare.core.files import YAML_WIDTH, yaml_text

ROOT = Path(__file__).resolve().parents[1]


def test_multi_line_strings_are_literal_blocks_and_read_back_as_written() -> None:
    data = {"expr": "sum by (node) (\n  up\n)\n", "config": "a: 1\nb: 2", "one": "single line"}
    text = yaml_text(data)
    assert text == ("expr: |\n  sum by (node) (\n    up\n  )\n"
                    "config: |-\n  a: 1\n  b: 2\n"
                    "one: single line\n")
    assert yaml.safe_load(text) == data


def test_keys_keep_their_order_and_collections_are_block_style() -> None:
    data = {"zeta": 1, "alpha": {"y": [1, 2], "x": []}, "mid": True}
    text = yaml_text(data)
    assert text == "zeta: 1\nalpha:\n  y:\n  - 1\n  - 2\n  x: []\nmid: true\n"
    assert list(yaml.safe_load(text)) == ["zeta", "alpha", "mid"]


def test_long_text_breaks_at_the_first_space_past_the_width() -> None:
    words = [f"word{i:02d}" for i in range(60)]  # 7 characters and a space each
    text = yaml_text({"description": " ".join(words)})
    lines = text.splitlines()
    assert len(lines) > 1
    # A line ends with the word that crosses YAML_WIDTH: longer than the width, by less than a word and its space.
    assert all(YAML_WIDTH < len(line) <= YAML_WIDTH + 8 for line in lines[:-1]), [len(line) for line in lines]
    assert yaml.safe_load(text) == {"description": " ".join(words)}


def test_literal_blocks_are_never_broken() -> None:
    expr = "max by (hostname, UUID) (" + ", ".join(f"label_{i}" for i in range(40)) + ")\nor vector(0)"
    text = yaml_text({"expr": expr})
    assert text.splitlines()[1] == "  " + expr.splitlines()[0]
    assert yaml.safe_load(text)["expr"] == expr


def test_text_beyond_ascii_is_written_as_it_is() -> None:
    data = {"summary": "GPU at 85 °C", "name": "Übersicht — 日本"}
    text = yaml_text(data)
    assert "85 °C" in text and "Übersicht — 日本" in text and "\\x" not in text and "\\u" not in text
    assert yaml.safe_load(text) == data


def test_the_writers_that_were_separate_now_give_the_one_form() -> None:
    from gpushare.render.monitoring import rules_yaml
    from gpushare.render.templating import environment

    groups = [{"name": "g", "rules": [{"alert": "Hot", "expr": "a\n> 1", "annotations": {"summary": "at 90 °C"}}]}]
    assert rules_yaml(groups) == yaml_text(groups).rstrip("\n")
    config = {"version": "v1", "flags": {"migStrategy": "none"}, "note": "two\nlines"}
    rendered = environment().from_string("{{ data | to_yaml }}").render(data=config)
    assert rendered == yaml_text(config).rstrip("\n")


# Where gpushare still calls PyYAML's writer itself, and why (a Kubernetes controller's own configuration, embedded
# as a Helm value for Kueue to read, not a file for people).
NOT_FOR_PEOPLE = {"gpushare/program/components/tenancy.py"}


def test_no_other_yaml_writer_in_gpushare() -> None:
    found = []
    for path in sorted((ROOT / "gpushare").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "gpushare/core/files.py" or rel in NOT_FOR_PEOPLE or "/ansible_collections/" in rel:
            continue
        text = path.read_text(encoding="utf-8")
        if re.search(r"\byaml\.(?:safe_)?dump(?:_all)?\(|Dumper\b", text):
            found.append(rel)
    assert found == [], f"write YAML with gpushare.core.files.yaml_text: {found}"
