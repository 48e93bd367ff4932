"""The benchmarks' figures live in one place, benchmarks/README.md (docs/benchmarks.md says why): docs/benchmarks.md
quotes no figure of an earlier round or of nowhere, the README's "Current figures" table holds each benchmark's newest
measurement as the benchmark's own section gives it, and every other page that quotes a benchmark figure names
benchmarks/ and quotes what the newest round measured (to the precision the page gives: "3.3 s" stands for 3.33).

A section's current part is its text up to the first line that names an earlier date than its newest one: the rounds
before (kept for comparison, each under its date) do not count as current. The checks read numbers, not their
meaning: a page's figure that happens to equal another current number passes, so they catch figures of an earlier
round or of nowhere, not every misquote."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

README = ROOT / "benchmarks" / "README.md"
PAGE = ROOT / "docs" / "benchmarks.md"
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]  # the docs besides the one place
CURRENT = "Current figures"
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
_NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?"
NUMBER = re.compile(rf"(?<![\w.]){_NUMBER}(?![\w])")
# A measured figure on a page: a number or a range of two, then a unit of time, memory or share.
FIGURE = re.compile(rf"(?<![\w.])({_NUMBER})(?:\s?(?:-|to)\s?({_NUMBER}))?\s?(?:ms|s|min|h|MiB|GiB|%)(?![\w])")
SCRIPT = re.compile(r"benchmarks/[\w/]+\.py")


def tokens(text: str) -> set[str]:
    """Every date and number written in the text (numbers without their thousands commas)."""
    return set(DATE.findall(text)) | {n.replace(",", "") for n in NUMBER.findall(DATE.sub(" ", text))}


def sections(readme: str) -> dict[str, tuple[str, str]]:
    """The README's sections by title (the heading before its command): (heading, current part)."""
    parts = re.split(r"^## (.+)$", readme, flags=re.M)
    found = {}
    for heading, body in zip(parts[1::2], parts[2::2], strict=True):
        newest = max(DATE.findall(body), default="")
        lines = body.splitlines()
        title = heading.split(" (`")[0].strip()
        cut = next((i for i, line in enumerate(lines) if any(d < newest for d in DATE.findall(line))), len(lines))
        found[title] = (heading, body if title == CURRENT else "\n".join(lines[:cut]))
    return found


def current_text(readme: str) -> str:
    return "\n".join(body for _heading, body in sections(readme).values())


def current_rows(readme: str) -> dict[str, list[str]]:
    """The "Current figures" table: benchmark -> [measured, figures, target]."""
    rows = {}
    for line in sections(readme)[CURRENT][1].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 4 and DATE.fullmatch(cells[1]):
            rows[cells[0]] = cells[1:]
    return rows


def not_in_the_one_place(page: str, readme: str) -> set[str]:
    """What a page that points to the README (docs/benchmarks.md) quotes that the README's current figures lack."""
    return tokens(page) - tokens(current_text(readme))


def held(reference: str, figure: str) -> bool:
    """Whether some number of the reference, rounded to the figure's precision, is the figure."""
    places = len(figure.split(".")[1]) if "." in figure else 0
    value = float(figure)
    return any(abs(float(n) - value) <= 0.5 * 10 ** -places + 1e-9
               for n in tokens(reference) if not DATE.fullmatch(n))


def figures_not_held(text: str, readme: str) -> list[str]:
    """Figures a page's paragraphs about the benchmarks quote that the current part of the sections they cite (by
    script or by "title"; all sections where they cite none) does not hold."""
    by_title = sections(readme)
    wrong = []
    for paragraph in re.split(r"\n\s*\n", text):
        if not re.search(r"benchmark", paragraph, re.I):
            continue
        scripts = SCRIPT.findall(paragraph)
        cited = [body for title, (heading, body) in by_title.items()
                 if any(script in heading for script in scripts) or f'"{title}"' in paragraph]
        reference = "\n".join(cited) if cited else current_text(readme)
        wrong += [figure for match in FIGURE.finditer(paragraph) for figure in filter(None, match.groups())
                  if not held(reference, figure.replace(",", ""))]
    return wrong


def test_benchmarks_md_points_to_the_one_place_and_quotes_no_figure_it_lacks() -> None:
    page = PAGE.read_text()
    assert "../benchmarks/README.md#current-figures" in page
    assert not_in_the_one_place(page, README.read_text()) == set(), \
        "docs/benchmarks.md quotes figures benchmarks/README.md's current figures lack: link to them instead"


def test_current_figures_hold_each_benchmarks_newest_date_and_the_figures_of_its_section() -> None:
    readme = README.read_text()
    by_title, rows = sections(readme), current_rows(readme)
    assert set(rows) == set(by_title) - {CURRENT}, "every benchmark section has its row in the Current figures table"
    for name, (measured, figures, target) in rows.items():
        body = by_title[name][1]
        assert measured == max(DATE.findall(body)), f"{name}: its section has a newer measurement than {measured}"
        assert tokens(f"{figures} {target}") - tokens(body) == set(), \
            f"{name}: figures its section's newest round does not give"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_page_quoting_benchmark_figures_quotes_the_newest_round(page: Path) -> None:
    if page == PAGE:
        return  # held to the stricter test above
    assert figures_not_held(page.read_text(), README.read_text()) == [], \
        f"{page.name} quotes benchmark figures benchmarks/README.md's newest round does not hold: update or link"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_page_quoting_benchmark_figures_names_where_they_come_from(page: Path) -> None:
    """A figure next to "benchmark" names benchmarks/README.md or the benchmark's script."""
    unnamed = [paragraph[:80] for paragraph in re.split(r"\n\s*\n", page.read_text())
               if re.search(r"benchmark", paragraph, re.I) and FIGURE.search(paragraph)
               and "benchmarks/" not in paragraph]
    assert unnamed == []


def test_the_stale_figures_of_issue_37_would_be_caught() -> None:
    """What docs/benchmarks.md said before this test: the 2026-11-30 Ansible ratio, capacity's old peak memory."""
    readme = README.read_text()
    stale = ("| Ansible `site.yml` on test hosts (root) | `python benchmarks/ansible_site.py` | 1 host 52 s, 8 hosts "
             "198 s (ratio **3.78**) | 8 : 1 <= 3.0 |\n| Capacity | `python benchmarks/capacity.py [--raw]` | "
             "**2.9 s** end to end with the recording rules, 47 MiB peak | < 30 s, < 500 MiB |")
    assert {"3.78", "198", "47"} <= not_in_the_one_place(stale, readme)
    assert {"52", "198", "47"} <= set(figures_not_held(stale, readme))
    assert figures_not_held("The benchmark (benchmarks/ansible_site.py): 3.3 s per fresh host, 2.2 s converged.",
                            readme) == []
    assert figures_not_held("The benchmark (benchmarks/ansible_site.py): 6.8 s per fresh host, 4.1 s converged.",
                            readme) == ["6.8", "4.1"]  # the round of 2026-12-01


@pytest.mark.parametrize(("text", "figure", "expected"), [
    ("3.33 and 3.25", "3.3", True), ("24.8", "25", True), ("3.78", "3.7", False), ("47.6", "47", False),
    ("60-62 MiB", "62", True), ("10,000 GPUs", "10000", True)])
def test_a_figure_is_held_only_to_the_precision_the_page_gives(text: str, figure: str, expected: bool) -> None:
    assert held(text, figure) is expected
