"""Every table-printing command at 80 columns: nothing runs past the width, no rule id, gate, name or label key is
cut mid-word or swallowed as Rich markup, and one finding stays a short block instead of a tall cell."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.cells import cell_len
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.cli.adopt import print_drift
from gpushare.cli.preview import MAX_SIBLINGS
from gpushare.cli.showback import _table
from gpushare.core.resolve import resolve_env
from gpushare.core.words import name_order
from gpushare.ops.brownfield.drift import Drift, DriftReport
from gpushare.ops.preview import run_preview
from gpushare.ops.showback import Idle, Row, ShowbackReport
from gpushare.policy.rules import RULES
from tests.conftest import ROOT

runner = CliRunner()
NARROW = {"COLUMNS": "80"}


def lines_of(text: str) -> list[str]:
    return text.splitlines()


def assert_fits(text: str, width: int = 80) -> None:
    too_wide = [line for line in lines_of(text) if cell_len(line) > width]
    assert not too_wide, too_wide


def assert_whole(text: str, *words: str) -> None:
    """Each word appears unbroken on one line (a token of its own, not folded across two lines)."""
    tokens = {t for line in lines_of(text) for t in re.split(r"[\s│┃|]+", line)}
    missing = [w for w in words if not any(w == t or w in t for t in tokens)]
    assert not missing, missing


def test_check_at_80_columns_keeps_rule_ids_whole_and_a_violation_short(dev_data: dict[str, Any],
                                                                          tmp_path: Path) -> None:
    dev_data["defaults"]["toolkit_version"] = "1.17.4"
    path = tmp_path / "dev.yaml"
    path.write_text(yaml.safe_dump(dev_data))
    result = runner.invoke(app, ["check", "--env", str(path), "--no-plan"], env=NARROW)
    assert result.exit_code == 1, result.output
    assert_fits(result.stdout)
    assert_whole(result.stdout, *RULES)
    lines = lines_of(result.stdout)
    start = next(i for i, line in enumerate(lines) if "toolkit-cve-floor" in line)
    block = lines[start:lines.index("", start)]
    assert "FAIL" in block[0] and len(block) <= 10, block
    assert any("CVE-2025-23266" in line for line in block)
    # Where the whole report fits unwrapped, it is one table.
    wide = runner.invoke(app, ["check", "--env", "dev", "--no-plan"], env={"COLUMNS": "250"})
    assert wide.exit_code == 0 and "┃ rule" in wide.stdout and "untrusted-tenants-hardware-isolated" in wide.stdout


def test_promote_at_80_columns(tmp_path: Path) -> None:
    result = runner.invoke(app, ["promote", "--from", "pilot", "--to", "prod", "--no-plan", "--patch",
                                 str(tmp_path / "p.patch")], env=NARROW)
    assert result.exit_code == 1, result.output
    assert_fits(result.stdout)
    assert_whole(result.stdout, "mig-reconfiguration", "utilization-uplift", "queue-wait-p95", "--prometheus")
    assert "not promoted: no --prometheus" in result.stdout


def test_pack_at_80_columns() -> None:
    result = runner.invoke(app, ["pack", "--demand", str(ROOT / "examples" / "demand" / "inference.yaml")],
                           env=NARROW)
    assert result.exit_code == 0, result.output
    assert_fits(result.stdout)
    assert_whole(result.stdout, "nightly-embeddings", "search-embedder", "(time-slicing", "x8)")
    assert "x H100 80GB HBM3" in result.stdout


def _showback_report() -> ShowbackReport:
    fleet = resolve_env("dev")
    rows = [Row("research-training-group", "h100-training", "NVIDIA H100 80GB HBM3", "exclusive", 120.0, None,
                360.0, 120.0),
            Row("partner-evaluation", "a100-inference", "NVIDIA A100-SXM4-80GB", "mig", 12.5, 3.25, 25.0, 14.0)]
    return ShowbackReport(fleet, "30d", 0.0, "raw", 200.0, 240.0, rows,
                          [Idle("l4-notebooks", "NVIDIA L4", 67.5, 40.5)], "EUR", ["a note on coverage"])


def test_showback_at_80_columns(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    report = _showback_report()
    _table(report.rows, report, "tenant")
    out = capsys.readouterr().out
    assert_fits(out)
    assert_whole(out, "research-training-group", "partner-evaluation", "A100-SXM4-80GB", "(idle)")
    assert "allocation only" in out  # a phrase kept on one line beside its key


@pytest.mark.parametrize("columns", ["80", "250"])
def test_drift_keeps_label_keys_in_brackets(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                            columns: str) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    report = DriftReport("brown", drift=[
        Drift("l4-01", "label", "labels[gpushare.io/pool]", "l4-inference", "(missing)"),
        Drift("a100-02", "mig-state", "labels[nvidia.com/mig.config.state]", "success", "[bold]failed")])
    print_drift(report)
    out = capsys.readouterr().out
    assert_fits(out, int(columns))
    for text in ("labels[gpushare.io/pool]", "labels[nvidia.com/mig.config.state]", "[bold]failed"):
        assert text in out, text
    assert "2 drift items" in out


def test_names_order_as_people_number_them() -> None:
    names = ["gpu-10", "gpu-2", "gpu-1", "a100-02", "l4-01", "gpu-10b", "gpu-10a", "h200", "gpu"]
    assert sorted(names, key=name_order) == ["a100-02", "gpu", "gpu-1", "gpu-2", "gpu-10", "gpu-10a", "gpu-10b",
                                             "h200", "l4-01"]


@pytest.mark.parametrize("verbose", [False, True], ids=["by-kind", "by-node"])
def test_drift_lists_nodes_in_number_order(capsys: pytest.CaptureFixture[str], verbose: bool) -> None:
    """gpu-2 before gpu-10, under each node (drift, and pending with --verbose) and in the pending kinds' lists."""
    nodes = ["gpu-10", "gpu-2", "gpu-1"]
    report = DriftReport("brown", drift=[Drift(n, "label", "labels[gpushare.io/pool]", "a", "b") for n in nodes],
                         pending=[Drift(n, "config", "labels[nvidia.com/device-plugin.config]", "a", "b")
                                  for n in nodes], nodes=12)
    print_drift(report, verbose=verbose)
    out = capsys.readouterr().out
    headings = re.findall(r"^(gpu-\d+): ", out, re.M)
    assert headings[:3] == ["gpu-1", "gpu-2", "gpu-10"], out
    if verbose:
        assert headings[3:] == ["gpu-1", "gpu-2", "gpu-10"], out
    else:
        assert "3 on 3 nodes: gpu-1, gpu-2, gpu-10" in out, out


def test_preview_at_80_columns_wraps_at_words_and_shortens_long_names() -> None:
    result = runner.invoke(app, ["preview", "--env", "dev"], env=NARROW)
    assert result.exit_code == 0, result.output
    assert_fits(result.stdout)
    out = result.stdout
    # A name too long even without its parent's name breaks after a hyphen: join such lines back.
    lines = [re.sub(r"^[│├└─ ]+", "", line) for line in lines_of(out)]
    joined = re.sub(r"-\n", "-", "\n".join(lines))
    tokens = {t for line in joined.splitlines() for t in line.split()}
    listed: dict[tuple[str | None, str], int] = {}
    plan = run_preview("dev").plan
    assert plan is not None
    for resource in plan.resources:
        key = (resource.parent, resource.type)
        listed[key] = listed.get(key, 0) + 1
        if listed[key] > MAX_SIBLINGS:
            continue  # counted, not listed
        name = resource.name
        # Whole, or with its parent's name dropped (`…-rest`): never folded across two lines.
        assert name in tokens or any(t.startswith("…-") and name.endswith(t[1:]) for t in tokens), name
    assert "Helm chart rendering" in " ".join(out.split())


# ---------------------------------------------------------------- help at 80 columns


def _command_paths() -> list[tuple[str, ...]]:
    """Every command and subcommand of the app, found by walking it (a command added later is covered too)."""
    import typer

    def walk(command: Any, path: tuple[str, ...]) -> list[tuple[str, ...]]:
        subcommands = getattr(command, "commands", {})
        return [path, *(p for name, sub in subcommands.items() if not sub.hidden for p in walk(sub, (*path, name)))]

    return walk(typer.main.get_command(app), ())


def _command_at(path: tuple[str, ...]) -> Any:
    import typer

    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return command


def _help_texts(command: Any) -> list[str]:
    """What the app says about a command: its help, its options' help, and its subcommands' help."""
    texts = [command.help or ""] + [p.help for p in command.params if getattr(p, "help", None) and not p.hidden]
    return texts + [sub.help or "" for sub in getattr(command, "commands", {}).values() if not sub.hidden]


@pytest.mark.parametrize("path", _command_paths(), ids=lambda p: " ".join(("gpushare", *p)))
def test_help_at_80_columns_is_whole(path: tuple[str, ...]) -> None:
    """No help text is cut with "…", folded mid-word or read as Rich markup (`pip install 'gpushare[mitogen]'`)."""
    result = runner.invoke(app, [*path, "--help"], env=NARROW)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert_fits(out)
    assert "…" not in out
    texts = _help_texts(_command_at(path))
    tokens = {t for line in lines_of(out) for t in re.split(r"[\s│┃|]+", line)}
    split = sorted({w for text in texts for w in text.split() if w not in tokens})
    assert not split, split
    flat = " ".join(out.split())
    lost = [b for text in texts for b in re.findall(r"\[[^\]]*\]", text) if " ".join(b.split()) not in flat]
    assert not lost, lost
    for param in _command_at(path).params:  # every option is listed
        if param.param_type_name == "option" and not param.hidden:
            assert any(o in tokens or f"{o}," in tokens for o in param.opts if o.startswith("--")), param.opts


def _capacity_report() -> Any:
    from gpushare.core.guardrails import load_guardrails
    from gpushare.ops.capacity import GIB, CapacityReport, MigEvidence, PoolEvidence, propose, recommend

    fleet = resolve_env("dev")
    g = load_guardrails()
    evidence = {p.name: PoolEvidence(p.name) for p in fleet.pools}
    evidence["l4-notebooks"] = PoolEvidence("l4-notebooks", coverage=1.0, utilization_mean=0.1, utilization_p95=0.15,
                                            allocated_mean=4, allocated_p95=4, replica_memory_p95_bytes=2 * GIB)
    evidence["a100-inference"] = PoolEvidence(
        "a100-inference", coverage=1.0, utilization_mean=0.05, utilization_p95=0.06,
        mig={p: MigEvidence(p, 1, 0.05, 3 * GIB, 1) for p in ("3g.40gb", "2g.20gb", "1g.10gb")})
    recs = recommend(fleet, g, evidence, "7d")
    return CapacityReport(fleet, "7d", 0.0, "raw", evidence, recs, propose(fleet, g, recs),
                          Path("build/capacity/dev.patch"), 0.5, 12)


def test_capacity_at_80_columns_keeps_every_word_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    report = _capacity_report()
    monkeypatch.setattr("gpushare.ops.capacity.run_capacity", lambda *args, **kwargs: report)
    result = runner.invoke(app, ["capacity", "--env", "dev", "--prometheus", "http://127.0.0.1:9"], env=NARROW)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert_fits(out)
    words = {"utilization", "a100-inference", "h100-training", "l4-notebooks", "time-slicing"}
    for r in report.recommendations:
        words |= {w for text in (*r.reasons, *r.evidence, *r.gaps, *r.notes) for w in text.split()}
    assert_whole(out, *words)
    # Where the whole report fits unwrapped, it is one table.
    wide = runner.invoke(app, ["capacity", "--env", "dev", "--prometheus", "http://127.0.0.1:9"],
                         env={"COLUMNS": "400"})
    assert wide.exit_code == 0 and "┃ pool" in wide.stdout


def test_rollout_dry_run_at_80_columns_keeps_commands_whole_and_copyable(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    kept = [{"name": "dev-l4-notebooks-notebooks-ts4", "file": ".gpushare/rollouts/dev/kept/"
             "dev-l4-notebooks-notebooks-ts4.yaml"}]
    monkeypatch.setattr("gpushare.ops.rollout.plan.kept_configs", lambda previous, target, directory: kept)
    args = ["rollout", "--env", "dev", "--dry-run", "--journal", str(tmp_path / "journal.jsonl")]
    doc = runner.invoke(app, [*args, "--json"])
    assert doc.exit_code == 0, doc.output
    commands = [c for step in json.loads(doc.stdout)["steps"] for c in step.get("commands", [])]
    assert any("'gpushare:keepDevicePluginConfigs[0].name'" in c for c in commands), commands
    result = runner.invoke(app, args, env=NARROW)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert_fits(out)
    assert_whole(out, *(w for c in commands for w in c.split()))
    # Each command runs as pasted: on one line, or continued with a trailing backslash.
    pasted = [" ".join(line.split()) for line in re.sub(r" \\\n\s*", " ", out).splitlines()]
    assert [c for c in commands if not any(line.endswith(c) for line in pasted)] == []
