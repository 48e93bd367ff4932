"""The rollout journal: append-only JSON lines, one event per step, and what they say about each rollout."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.reading import read_text
from gpushare.ops.rollout.snapshot import Snapshot

# The largest journal read. A start line holds the environment's snapshot (this repository's prod: 7 KB) and each
# host adds two lines (~0.4 KB): 300 rollouts of a 100 KB environment with 200 hosts each are about 54 MB.
MAX_JOURNAL_BYTES = 64 * 1024 * 1024


def _file_name(text: str) -> str:
    """A name the snapshot writes under its own folder: never a path out of it (the journal may be hand-edited)."""
    if not text or text in (".", "..") or "/" in text or "\\" in text or "\0" in text:
        raise ValueError(f"{text[:80]!r} is not a plain file name")
    return text


def _relative_path(text: str) -> str:
    parts = text.split("/")
    if text.startswith("/") or any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in parts):
        raise ValueError(f"{text[:80]!r} is not a relative path inside group_vars/")
    return text


class _Line(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class _Snapshot(_Line):
    name: Annotated[str, AfterValidator(_file_name)]
    text: str
    profiles: dict[Annotated[str, AfterValidator(_file_name)], str]
    group_vars: dict[Annotated[str, AfterValidator(_relative_path)], str] = Field(default_factory=dict)


class _Step(_Line):
    step: str


class _Start(_Line):
    event: Literal["start"]
    rollout: str
    env: str
    kind: Literal["rollout", "rollback"] = "rollout"
    revision: str = "unknown"
    dirty: bool = False
    target_revision: str | None = None
    batches: list[list[str]]
    steps: list[_Step] = Field(default_factory=list)
    snapshot: _Snapshot


class _Event(_Line):
    event: str
    rollout: str | None = None


class _Host(_Event):
    host: str
    status: str
    changed: int | bool = 0  # Ansible's count of changed tasks


class _End(_Event):
    status: str


class _Node(_Event):
    host: str
    cordoned: bool


class _StepEvent(_Event):
    step: str
    status: str


_MODELS: dict[str, type[_Line]] = {"start": _Start, "host": _Host, "end": _End, "node": _Node, "step": _StepEvent}


class Journal:
    """Append-only JSON lines, one event per step; each line is flushed to disk before the next step starts."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, event: dict[str, Any]) -> dict[str, Any]:
        now = time.time()
        record = {"t": round(now, 3), "time": datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds"),
                  **event}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return record

    def events(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        text = read_text(self.path, "journal", MAX_JOURNAL_BYTES)
        lines = text.splitlines()
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                if i == len(lines) and not text.endswith("\n"):
                    break  # a line cut short by an interruption: the step it describes did not finish
                raise GpushareError(Problem(f"line {i} is not JSON", file=str(self.path), line=i,
                                            fix="repair or remove the line; the journal is append-only JSON lines"),
                                    exit_code=2) from None
            except RecursionError:
                raise GpushareError(Problem(f"line {i} is nested deeper than any journal event", file=str(self.path),
                                            line=i, fix="repair or remove the line"), exit_code=2) from None
            out.append(self._checked(event, i))
        return out

    def _checked(self, event: Any, line: int) -> dict[str, Any]:
        """A journal event with the fields the rollout reads, of their types; else a located error."""
        if not isinstance(event, dict):
            raise GpushareError(Problem(f"line {line} is a JSON {type(event).__name__}, not an event object",
                                        file=str(self.path), line=line, fix="repair or remove the line; every "
                                        "line is one JSON object written by gpushare rollout"), exit_code=2)
        model = _MODELS.get(str(event.get("event")), _Event)
        try:
            model.model_validate(event)
        except ValidationError as exc:
            item = exc.errors()[0]
            parts = [str(p) for p in item["loc"] if not str(p).startswith("function-") and p != "[key]"]
            where = "".join(f"[{p}]" if i and ("." in p or "/" in p or p.isdigit()) else (f".{p}" if i else p)
                            for i, p in enumerate(parts))
            raise GpushareError(Problem(f"{item['msg']} (event {str(event.get('event'))[:40]!r})",
                                        file=str(self.path), line=line, path=where or None,
                                        fix="repair the line as gpushare rollout wrote it, or remove it (a rollout "
                                            "without its start line cannot be resumed or rolled back to)"),
                                exit_code=2) from None
        return event

    def records(self, environment: str) -> list[RolloutRecord]:
        by_id: dict[str, RolloutRecord] = {}
        order: list[RolloutRecord] = []
        for ev in self.events():
            if ev.get("event") == "start" and ev.get("env") == environment:
                rec = RolloutRecord(ev)
                by_id[rec.id] = rec
                order.append(rec)
            elif ev.get("rollout") in by_id:
                by_id[ev["rollout"]].add(ev)
        return order


@dataclass
class RolloutRecord:
    """What the journal says about one rollout (or rollback)."""

    start: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return str(self.start["rollout"])

    @property
    def kind(self) -> str:
        return str(self.start.get("kind", "rollout"))

    @property
    def revision(self) -> str:
        return str(self.start.get("revision", "unknown"))

    @property
    def snapshot(self) -> Snapshot:
        return Snapshot.from_dict(self.start["snapshot"])

    @property
    def batches(self) -> list[list[str]]:
        return [list(b) for b in self.start["batches"]]

    def add(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    @property
    def status(self) -> str:
        """succeeded / failed / stopped (an `end` event), or interrupted (none)."""
        ends = [e for e in self.events if e.get("event") == "end"]
        return str(ends[-1]["status"]) if ends else "interrupted"

    def host_status(self) -> dict[str, str]:
        """The last status per host: converging, passed or failed."""
        return {e["host"]: e["status"] for e in self.events if e.get("event") == "host"}

    @property
    def passed_hosts(self) -> set[str]:
        return {h for h, s in self.host_status().items() if s == "passed"}

    @property
    def changed_hosts(self) -> set[str]:
        """Hosts this rollout changed: Ansible reported changes, or the host failed or never finished (its state is
        unknown, so it counts as changed)."""
        unfinished = {host for host, status in self.host_status().items() if status != "passed"}
        reported = {e["host"] for e in self.events if e.get("event") == "host" and e.get("changed")}
        return unfinished | reported

    def cordoned_by_rollout(self) -> set[str]:
        out: set[str] = set()
        for e in self.events:
            if e.get("event") == "node":
                (out.add if e.get("cordoned") else out.discard)(e["host"])
        return out

    def step_done(self, step: str) -> bool:
        return any(e.get("event") == "step" and e.get("step") == step and e.get("status") == "done"
                   for e in self.events)
