"""The rollout journal (gpushare.ops.rollout.journal): a cut last line is tolerated, a broken middle is not. A
hand-edited or damaged journal: lines of the wrong shape or missing fields are errors naming the line, snapshot names
never lead out of the journal's folder, a journal of a few hundred rollouts still reads, and `rollout --resume
--dry-run` writes nothing (not even the revision it resolves)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core.errors import GpushareError
from gpushare.core.paths import environment_path
from gpushare.core.reading import MAX_BYTES
from gpushare.ops.rollout.journal import Journal
from gpushare.ops.rollout.snapshot import Snapshot

# ---------------------------------------------------------------- journal and snapshots


def test_journal_tolerates_a_cut_last_line_but_not_a_broken_middle(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl")
    journal.append({"event": "start", "rollout": "r1", "env": "dev", "batches": [],
                    "snapshot": {"name": "dev.yaml", "text": "", "profiles": {}}})
    journal.append({"event": "end", "rollout": "r1", "status": "failed"})
    with journal.path.open("a") as handle:
        handle.write('{"event": "ho')
    assert [e["event"] for e in journal.events()] == ["start", "end"]
    lines = journal.path.read_text().splitlines()
    journal.path.write_text("\n".join([lines[0], "not json", lines[1]]) + "\n")
    with pytest.raises(GpushareError) as err:
        journal.events()
    assert err.value.problems[0].file == str(journal.path) and "line 2" in err.value.problems[0].message

# ---------------------------------------------------------------- a hand-edited or damaged journal


runner = CliRunner()


def _start(rollout: str = "dev-1", env: str = "dev", **extra: Any) -> dict[str, Any]:
    snapshot = Snapshot.of(environment_path(env)).as_dict()  # the unit tests' frozen workspace
    return {"event": "start", "rollout": rollout, "kind": "rollout", "env": env, "revision": "abc", "dirty": False,
            "batches": [["dev-gpu-01"]], "steps": [{"step": "pulumi-add"}, {"step": "pulumi-prune"}],
            "snapshot": snapshot, **extra}


def _write(path: Path, *events: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((e if isinstance(e, str) else json.dumps(e)) + "\n" for e in events))
    return path


def test_a_journal_gpushare_wrote_reads(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    journal.append(_start())
    journal.append({"event": "host", "rollout": "dev-1", "batch": 1, "host": "dev-gpu-01", "status": "passed",
                    "changed": True})
    journal.append({"event": "end", "rollout": "dev-1", "status": "succeeded", "reason": ""})
    (record,) = journal.records("dev")
    assert record.status == "succeeded" and record.changed_hosts == {"dev-gpu-01"}


@pytest.mark.parametrize(("what", "line", "said"), [
    ("a list, not an object", [1, 2], "not an event object"),
    ("a start without its snapshot", {k: v for k, v in _start().items() if k != "snapshot"}, "snapshot"),
    ("batches as text", _start(batches="dev-gpu-01"), "batches"),
    ("a host status that is a number", {"event": "host", "rollout": "dev-1", "host": "h", "status": 3}, "status"),
    ("a node event without cordoned", {"event": "node", "rollout": "dev-1", "host": "h"}, "cordoned"),
    ("an end without its status", {"event": "end", "rollout": "dev-1"}, "status"),
    ("a rollout id that is a number", {"event": "step", "rollout": 7, "step": "x", "status": "done"}, "rollout"),
    ("nested very deeply", "[" * 100_000 + "]" * 100_000, "nested"),
])
def test_a_line_of_the_wrong_shape_is_an_error_naming_the_line(tmp_path: Path, what: str, line: Any,
                                                               said: str) -> None:
    path = _write(tmp_path / "journal.jsonl", _start(), line, {"event": "end", "rollout": "dev-1",
                                                                "status": "failed"})
    with pytest.raises(GpushareError) as err:
        Journal(path).records("dev")
    problem = err.value.problems[0]
    assert err.value.exit_code == 2 and problem.line == 2 and problem.file == str(path), problem
    assert said in f"{problem.path} {problem.message}" and problem.fix, problem


@pytest.mark.parametrize(("field", "value"), [
    ("name", "../../outside.yaml"),
    ("profiles", {"../outside.yaml": "x"}),
    ("profiles", {"/tmp/outside.yaml": "x"}),
    ("group_vars", {"../../../outside.yml": "x"}),
    ("group_vars", {"/etc/outside.yml": "x"}),
])
def test_rollback_never_writes_a_snapshot_file_outside_the_journals_folder(tmp_path: Path, field: str,
                                                                           value: Any) -> None:
    start = _start()
    start["snapshot"][field] = value
    work = tmp_path / "state"
    path = _write(work / "journal.jsonl", start, {"event": "end", "rollout": "dev-1", "status": "failed"})
    result = runner.invoke(app, ["rollout", "--env", "dev", "--resume", "--dry-run", "--journal", str(path)])
    assert result.exit_code == 2, result.output
    assert "journal.jsonl:1: snapshot." in result.output and "not a" in result.output, result.output
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["journal.jsonl", "state"]


def test_snapshot_materialize_refuses_a_name_out_of_its_folder(tmp_path: Path) -> None:
    snap = Snapshot(name="dev.yaml", text="", profiles={"../../x.yaml": ""}, group_vars={})
    with pytest.raises(GpushareError):
        snap.materialize(tmp_path / "a" / "b")
    assert not (tmp_path / "x.yaml").exists()


def test_resume_dry_run_writes_nothing(tmp_path: Path) -> None:
    work = tmp_path / "state"
    path = _write(work / "journal.jsonl", _start(),
                  {"event": "end", "rollout": "dev-1", "status": "failed", "reason": "host failed"})
    before = path.read_bytes()
    result = runner.invoke(app, ["rollout", "--env", "dev", "--resume", "--dry-run", "--journal", str(path)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in work.iterdir()) == ["journal.jsonl"] and path.read_bytes() == before


def test_a_journal_of_a_few_hundred_rollouts_reads(tmp_path: Path) -> None:
    """300 rollouts of prod, each with its snapshot and two events for each of 40 hosts: above the 4 MiB of a
    workspace file, which the journal was once held to."""
    events: list[Any] = []
    for i in range(300):
        rid = f"prod-{i}"
        events.append(_start(rid, "prod"))
        for h in range(40):
            for status in ("converging", "passed"):
                events.append({"event": "host", "rollout": rid, "batch": 1, "host": f"prod-gpu-{h:02d}",
                               "status": status, "changed": True})
        events.append({"event": "end", "rollout": rid, "status": "succeeded", "reason": ""})
    path = _write(tmp_path / "journal.jsonl", *events)
    assert path.stat().st_size > MAX_BYTES
    records = Journal(path).records("prod")
    assert len(records) == 300 and all(r.status == "succeeded" for r in records)
