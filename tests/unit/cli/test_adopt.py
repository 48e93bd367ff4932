"""`gpushare drift`'s text at 80 columns: the summary (counts by kind, nodes) comes first, then the drift grouped
under its node, then the pending changes folded to one line per kind, or every one under its node with --verbose;
every line fits and no value is cut mid-word. The JSON is the same with and without --verbose."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.cells import cell_len
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.cli.adopt import print_drift
from gpushare.core.resolve import resolve_env
from gpushare.ops.brownfield.drift import Drift, DriftReport
from tests.unit.ops.brownfield.helpers import CLUSTERS, ENV, cli

Imported = Callable[[str], tuple[Path, dict[str, Any]]]
runner = CliRunner()
NARROW = {"COLUMNS": "80"}
FIXTURE = "timeslicing-mig"  # 4 drift items on 2 of its 6 nodes, pending on all 6


def text_of(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["drift", "--env", ENV, "--from", str(CLUSTERS / FIXTURE), *args], env=NARROW)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout


def json_of(*args: str) -> dict[str, Any]:
    code, out = cli("drift", "--env", ENV, "--from", str(CLUSTERS / FIXTURE), *args)
    assert code == (0 if out["ok"] else 1)
    return out


def summary_of(out: str) -> str:
    """The lines before the first blank one, as one line."""
    lines = out.splitlines()
    return " ".join(" ".join(lines[:lines.index("") if "" in lines else len(lines)]).split())


def entries_by_node(out: str, section: str) -> list[tuple[str, str, str]]:
    """(node, kind, field) of each entry printed in `section` ("drift" or "pending"): an entry is an indented line
    `kind  field ...` under a heading line `node: ...` at the margin."""
    found: list[tuple[str, str, str]] = []
    current, node = None, None
    for line in out.splitlines():
        if line and not line.startswith(" "):
            head = line.split()[0]
            if head.startswith(("drift", "pending")):
                current, node = head.rstrip(":,"), None
            elif current is not None:
                node = head.rstrip(":")
        elif current == section and node is not None and re.match(r"  \S", line):
            kind, field = line.split()[:2]
            found.append((node, kind, field))
    return found


def assert_fits_whole(out: str, entries: list[dict[str, str]]) -> None:
    too_wide = [line for line in out.splitlines() if cell_len(line) > 80]
    assert not too_wide, too_wide
    tokens = {t for line in out.splitlines() for t in line.split()}
    words = {w for d in entries for value in d.values() for w in value.split()}
    split = sorted(w for w in words if not any(w in t for t in tokens))
    assert not split, split


def test_the_summary_comes_first_with_counts_by_kind_and_nodes(imported: Imported) -> None:
    imported(FIXTURE)
    report = json_of()
    code, out = text_of()
    assert code == 1
    first, summary = out.splitlines()[0], summary_of(out)
    drift_nodes = {d["node"] for d in report["drift"]}
    pending_nodes = {d["node"] for d in report["pending"]}
    compared = len([n for n in resolve_env(ENV).nodes if n.address is not None])
    assert first.startswith(f"{ENV}: {len(report['drift'])} drift items on {len(drift_nodes)} nodes, "
                            f"{len(report['pending'])} pending on {len(pending_nodes)} nodes"), first
    assert f"({compared} nodes compared)" in summary
    for section in ("drift", "pending"):
        counts = Counter(d["kind"] for d in report[section])
        kinds = re.search(rf"\b{section}: ((?:[a-z-]+ \d+,? ?)+)", summary)
        assert kinds is not None, summary
        assert dict(re.findall(r"([a-z-]+) (\d+)", kinds.group(1))) == {k: str(n) for k, n in counts.items()}


def test_drift_is_grouped_under_its_node_and_pending_folded_by_kind(imported: Imported) -> None:
    imported(FIXTURE)
    report = json_of()
    _, out = text_of()
    assert_fits_whole(out, report["drift"])
    drift = entries_by_node(out, "drift")
    assert Counter(drift) == Counter((d["node"], d["kind"], d["field"]) for d in report["drift"])
    # One heading per node, its entries together and, within it, each kind's together.
    nodes = [n for n, _, _ in drift]
    assert nodes == sorted(nodes)
    for node in set(nodes):
        kinds = [k for n, k, _ in drift if n == node]
        assert all(kinds.index(k) == i or kinds[i - 1] == k for i, k in enumerate(kinds)), kinds
    assert not entries_by_node(out, "pending")
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("pending"))
    assert "--verbose" in lines[start]
    folded = [line for line in lines[start + 1:] if line.startswith("  ")]
    counts = Counter(d["kind"] for d in report["pending"])
    assert len(folded) == len(counts), folded
    compared = len([n for n in resolve_env(ENV).nodes if n.address is not None])
    for kind, count in counts.items():
        line = next(line for line in folded if line.split()[0] == f"{kind}:")
        touched = sorted({d["node"] for d in report["pending"] if d["kind"] == kind})
        if len(touched) == compared:  # every node: no names
            assert line.endswith(f" {count} on all {compared} nodes"), line
            continue
        assert re.search(rf"\b{count} on {len(touched)} nodes: ", line) or (len(touched) == 1 and
                                                                           f"{count} on {touched[0]}" in line)
        named = [w for w in re.findall(r"[\w.-]+", line.split(": ", 2)[-1]) if w in touched]
        assert named and (set(named) == set(touched) or line.endswith(f" and {len(touched) - len(named)} more"))
    assert len(lines) < 40, len(lines)


def test_verbose_lists_every_pending_entry_under_its_node(imported: Imported) -> None:
    imported(FIXTURE)
    report = json_of()
    code, out = text_of("--verbose")
    assert code == 1
    assert_fits_whole(out, report["drift"] + report["pending"])
    assert Counter(entries_by_node(out, "pending")) == Counter((d["node"], d["kind"], d["field"])
                                                               for d in report["pending"])
    assert Counter(entries_by_node(out, "drift")) == Counter((d["node"], d["kind"], d["field"])
                                                             for d in report["drift"])
    assert text_of("-v")[1] == out
    assert json_of("--verbose") == report  # --json is the same either way


def test_many_nodes_are_abbreviated_on_one_line(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    nodes = [f"gpu-node-{i:03d}" for i in range(40)]
    pending = [Drift(n, "label", "labels[gpushare.io/pool]", "l4-inference", "absent") for n in nodes]
    report = DriftReport("prod", pending=[*pending, Drift("gpu-node-007", "taint", "spec.taints[gpushare.io/"
                                                                "shared-gpu]", "gpushare.io/shared-gpu=true:"
                                                                "NoSchedule", "absent")])
    print_drift(report)
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "prod: no drift, 41 pending on 40 nodes"
    line = next(line for line in out.splitlines() if line.split()[:1] == ["label:"])
    shown = re.findall(r"gpu-node-\d+", line)
    assert 1 <= len(shown) < 40 and line.endswith(f" and {40 - len(shown)} more") and cell_len(line) <= 80
    assert "1 on gpu-node-007" in out
    print_drift(report, verbose=True)
    out = capsys.readouterr().out
    assert_fits_whole(out, [d.as_dict() for d in report.pending])
    assert Counter(entries_by_node(out, "pending")) == Counter((d.node, d.kind, d.field) for d in report.pending)


def test_a_clean_report_is_its_summary(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    print_drift(DriftReport("prod", nodes=3), verbose=True)
    assert capsys.readouterr().out == "prod: no drift, nothing pending (3 nodes compared)\n"
