"""The rollout journal: append-only JSON lines, one event per step, and what they say about each rollout."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.files import read_text
from gpushare.ops.rollout.snapshot import Snapshot


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
        lines = read_text(self.path, "journal").splitlines()
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                if i == len(lines):  # a line cut short by an interruption: the step it describes did not finish
                    break
                raise GpushareError(Problem(f"line {i} is not JSON", file=str(self.path),
                                            fix="repair or remove the line; the journal is append-only JSON lines"),
                                    exit_code=2) from None
        return out

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
