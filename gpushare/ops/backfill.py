"""`gpushare capacity --backfill-rules`: what gpushare's recording rules would have recorded over history older than
the rules, as TSDB blocks for a Prometheus server gpushare may write to.

`promtool tsdb create-blocks-from rules` evaluates rules through the running server's query API (it reads the raw
history in two-hour range queries, under the server's own limits) and writes blocks to a folder; the server serves
them once they sit in its data folder (it loads new blocks about once a minute). A rule it evaluates cannot read a
series another rule of the same run records, and gpushare's rules chain (unit -> GPU -> pool), so the rules run in
passes by dependency level: each pass only once the levels before it are in the server. Each pass covers the window
up to where the live rules' own series begin. Blocks are moved (never deleted, never overwritten) into
`--data-dir` when given; otherwise each pass's folder is left with the exact steps to move it and run again.
Plain Prometheus only: Thanos and Mimir take history differently, and gpushare checks only their PromQL API."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.files import Unwritable, check_output_dir, make_parents, remove_made, yaml_text
from gpushare.core.guardrails import Guardrails, duration_seconds, load_guardrails
from gpushare.core.resolve import ResolvedFleet, resolve_env
from gpushare.ops.prometheus import QUERY_SECONDS, Prometheus, read_steps, window_steps
from gpushare.render.monitoring import prometheus_rule_groups
from gpushare.render.monitoring.promql import metric_names

LOAD_WAIT_SECONDS = 150.0  # Prometheus loads blocks found in its data folder once a minute
PROMTOOL_TIMEOUT = 6 * 3600


def backfill_groups(fleet: ResolvedFleet, guardrails: Guardrails) -> list[dict[str, Any]]:
    """The recording rules as they run live, rendered per cluster (each cluster's pools split demand only among
    themselves), in one group: every cluster's rules, each distinct rule once."""
    seen: set[str] = set()
    rules: list[dict[str, Any]] = []
    interval = "1m"
    for cluster in fleet.clusters:
        for group in prometheus_rule_groups(fleet, guardrails, cluster=cluster):
            interval = str(group.get("interval", interval))
            for rule in group["rules"]:
                key = json.dumps(rule, sort_keys=True)
                if "record" in rule and key not in seen:
                    seen.add(key)
                    rules.append(rule)
    return [{"name": "gpushare.recording", "interval": interval, "rules": rules}]


def rule_levels(groups: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Recording rules by dependency depth: a level reads only series of the levels before it."""
    rules = [rule for g in groups for rule in g["rules"] if "record" in rule]
    recorded = {rule["record"] for rule in rules}
    depth: dict[str, int] = {}
    changed = True
    while changed:
        changed = False
        for rule in rules:
            deps = metric_names(rule["expr"]) & recorded
            d = 1 + max((depth.get(dep, 0) for dep in deps), default=-1)
            if depth.get(rule["record"], -1) < d:
                depth[rule["record"]] = d
                changed = True
    levels: list[list[dict[str, Any]]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for rule in rules:
        levels[depth[rule["record"]]].append(rule)
    return levels


@dataclass
class Pass:
    level: int
    rules: int
    state: str  # present | written | loaded | not loaded yet | waits for an earlier pass | nothing to record
    start: int = 0
    end: int = 0
    folder: str | None = None
    blocks: list[str] = field(default_factory=list)


@dataclass
class BackfillReport:
    environment: str
    start: int
    end: int
    passes: list[Pass]
    next_steps: list[str]

    @property
    def complete(self) -> bool:
        return all(p.state in ("present", "loaded", "nothing to record") for p in self.passes)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": True, "environment": self.environment, "start": self.start, "end": self.end,
                "complete": self.complete, "passes": [p.__dict__ for p in self.passes],
                "next_steps": self.next_steps}


def first_recorded(prom: Prometheus, records: set[str], window: str, step: str, at: float) -> int | None:
    """Unix seconds of the first step in the window at which any of `records` has a sample (None: none has)."""
    names = "|".join(sorted(records))
    expr = f'time() + 0 * count({{__name__=~"{names}"}})'
    seen = read_steps(prom, "recorded history", expr, window_steps(window, step, at))
    return min((int(min(values)) for values in seen.values() if values), default=None)


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        raise GpushareError(Problem("promtool is not installed or not on PATH",
                                    fix="install Prometheus's promtool (Debian/Ubuntu: apt install prometheus) "
                                        "of the same major version as the server"), exit_code=2)
    return found


def _check_data_dir(data_dir: Path) -> None:
    if not (data_dir / "wal").is_dir():
        raise GpushareError(Problem("--data-dir is not a Prometheus data folder (it has no wal/)", file=str(data_dir),
                                    fix="name the folder the server's --storage.tsdb.path names"), exit_code=2)


def _evaluate(rules: list[dict[str, Any]], level: int, interval: str, url: str, start: int, end: int,
              folder: Path) -> list[Path]:
    """One pass of promtool over the level's rules; returns the blocks it wrote. A pass that fails (promtool's
    error, a full disk) leaves nothing: its folder, and the folders above it this pass created (--backfill-rules
    itself on the first pass), are removed again."""
    made = make_parents(folder)  # the --backfill-rules folder and any above it that were missing
    try:
        folder.mkdir()
    except OSError as exc:
        remove_made(made)
        raise Unwritable(folder, exc) from None
    try:
        return _promtool_pass(rules, level, interval, url, start, end, folder)
    except BaseException as exc:
        shutil.rmtree(folder, ignore_errors=True)
        remove_made(made)
        if isinstance(exc, OSError):
            raise Unwritable(folder / "rules.yaml", exc) from None
        raise


def _promtool_pass(rules: list[dict[str, Any]], level: int, interval: str, url: str, start: int, end: int,
                   folder: Path) -> list[Path]:
    rule_file = folder / "rules.yaml"
    rule_file.write_text(yaml_text({"groups": [{"name": f"gpushare-level-{level}", "interval": interval,
                                                "rules": rules}]}), encoding="utf-8")
    blocks = folder / "blocks"
    try:
        result = subprocess.run([_promtool(), "tsdb", "create-blocks-from", "rules", f"--start={start}",
                                 f"--end={end}", f"--url={url}", f"--output-dir={blocks}",
                                 f"--eval-interval={duration_seconds(interval)}s", str(rule_file)],
                                capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise GpushareError(Problem(f"promtool did not finish pass {level + 1} within {PROMTOOL_TIMEOUT} s",
                                    fix="backfill a shorter --window at a time"), exit_code=2) from None
    if result.returncode != 0:
        said = (result.stderr or result.stdout)[-600:]
        if "no space left on device" in said.lower():
            raise GpushareError(Problem(
                f"promtool ran out of disk space writing pass {level + 1}'s blocks (the file system is full); the "
                f"pass's folder is removed: {said.strip()[-300:]}", file=str(folder),
                fix=f"free space on the file system of --backfill-rules (df -h {folder.parent}), or name a folder "
                    "on another one"), exit_code=2)
        raise GpushareError(Problem(f"promtool failed on pass {level + 1} (its folder is removed, so the same "
                                    f"command runs the pass again): {said}", file=str(folder),
                                    fix="check --prometheus, and that promtool's version matches the server's"),
                            exit_code=2)
    return sorted(p for p in blocks.iterdir() if p.is_dir()) if blocks.is_dir() else []


def _move(blocks: list[Path], data_dir: Path) -> None:
    clash = [b.name for b in blocks if (data_dir / b.name).exists()]
    if clash:
        raise GpushareError(Problem(f"--data-dir already holds block {clash[0]}", file=str(data_dir),
                                    fix="nothing was moved; check what wrote it"), exit_code=2)
    for block in blocks:
        shutil.move(str(block), str(data_dir / block.name))


def run_backfill(env: str, prometheus: str, window: str, end: float, out: Path, data_dir: Path | None = None,
                 progress: Callable[[str], None] = lambda what: None,
                 timeout: float = QUERY_SECONDS) -> BackfillReport:
    """Every pass whose inputs are in the server, in dependency order; stops at the first that must wait."""
    fleet = resolve_env(env)
    check_output_dir(out, [fleet.source], option="--backfill-rules")
    guardrails = load_guardrails()
    groups = backfill_groups(fleet, guardrails)
    interval = str(groups[0]["interval"])
    step = guardrails.capacity.step
    prom = Prometheus(prometheus, timeout=timeout)
    if data_dir is not None:
        _check_data_dir(data_dir)
    start = int(end - duration_seconds(window)) // 60 * 60
    passes: list[Pass] = []
    steps: list[str] = []
    blocked = False
    for level, rules in enumerate(rule_levels(groups)):
        records = {r["record"] for r in rules}
        if blocked:
            passes.append(Pass(level, len(rules), "waits for an earlier pass"))
            continue
        progress(f"pass {level + 1}: where do {len(records)} recorded series begin")
        first = first_recorded(prom, records, window, step, end)
        if first is not None and first <= _expected_first(prom, rules, window, step, end, start):
            passes.append(Pass(level, len(rules), "present"))
            continue
        stop = int(first - duration_seconds(step)) if first is not None else int(end)
        folder = out / f"level-{level}-{start}-{stop}"
        if folder.exists():
            raise GpushareError(Problem(f"{folder} exists: an earlier run wrote this pass", file=str(folder),
                                        fix="move its blocks/ into the server's data folder as that run said, "
                                            "or name another --backfill-rules folder"), exit_code=2)
        progress(f"pass {level + 1}: promtool evaluating {len(rules)} rules from "
                 f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(start))} UTC")
        blocks = _evaluate(rules, level, interval, prom.url, start, stop, folder)
        done = Pass(level, len(rules), "written", start, stop, str(folder), [b.name for b in blocks])
        passes.append(done)
        if not blocks:
            done.state = "nothing to record"
            continue
        if data_dir is None:
            steps.append(f"move every folder in {folder / 'blocks'} into the server's data folder "
                         f"(--storage.tsdb.path), e.g. mv {folder / 'blocks'}/* /prometheus/")
            steps.append("wait a minute for Prometheus to load them, then run the same command again for the "
                         "next pass")
            blocked = True
            continue
        _move(blocks, data_dir)
        done.state = _wait_loaded(prom, rules, window, step, end, start, progress, level)
        if done.state != "loaded":
            steps.append(f"pass {level + 1}'s blocks are in {data_dir} but the server has not loaded them yet: "
                         "run the same command again in a minute")
            blocked = True
    return BackfillReport(fleet.environment, start, int(end), passes, steps)


def _expected_first(prom: Prometheus, rules: list[dict[str, Any]], window: str, step: str, end: float,
                    start: int) -> int:
    """The latest a level's series may begin and still cover the window: where its inputs begin (or the window
    does), plus its longest range (a rate over 5m has nothing to say before 5m of input), plus one step."""
    inputs = set().union(*(metric_names(r["expr"]) for r in rules))
    begins = first_recorded(prom, inputs, window, step, end) if inputs else None
    longest = max((duration_seconds(d) for r in rules for d in re.findall(r"\[(\d+[smhdw])", r["expr"])), default=0)
    return max(start, begins or start) + longest + duration_seconds(step)


def _wait_loaded(prom: Prometheus, rules: list[dict[str, Any]], window: str, step: str, end: float, start: int,
                 progress: Callable[[str], None], level: int) -> str:
    records = {r["record"] for r in rules}
    deadline = time.monotonic() + LOAD_WAIT_SECONDS
    expected = _expected_first(prom, rules, window, step, end, start)
    while True:
        first = first_recorded(prom, records, window, step, end)
        if first is not None and first <= expected:
            return "loaded"
        if time.monotonic() >= deadline:
            return "not loaded yet"
        progress(f"pass {level + 1}: waiting for Prometheus to load the moved blocks")
        time.sleep(5)
