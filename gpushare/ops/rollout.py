"""Phased rollout of an environment: canary batches of bare-metal hosts with health gates, a journal to resume from,
and rollback to the last revision that succeeded.

The order is DESIGN's: `pulumi up` first adds the new sharing configs while keeping those nodes still use; then the
Ansible-managed hosts batch by batch (canary first), each batch one ansible-runner call of playbooks/site.yml with
`--limit`, followed by its health gates (playbooks/verify.yml, which runs `dcgmi diag -r 1`, and, with a kubeconfig,
the device plugin advertising each node's resources); finally `pulumi up` prunes the configs no node uses. The first
failing host stops the rollout after its batch: failed nodes stay cordoned and labelled, later batches untouched.

Every step appends one event to a journal (JSON lines) that carries the Git revision and a snapshot of the
environment it rolled out, so an interrupted rollout resumes without repeating finished hosts, and a rollback can
re-apply the last revision that succeeded to exactly the hosts that changed since."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.files import read_text
from gpushare.core.paths import default_profiles_dir, project_root
from gpushare.core.resolve import ResolvedFleet

DEFAULT_BATCHES = "1,50%,100%"
ROLLOUT_STATE_LABEL = "gpushare.io/rollout-state"

Kind = Literal["rollout", "rollback"]


# ---------------------------------------------------------------- batches


def parse_batches(text: str) -> list[int | float]:
    """`1,50%,100%` -> [1, 0.5, 1.0]: host counts, or shares of all hosts (as Ansible's `serial`)."""
    sizes: list[int | float] = []
    for part in [p.strip() for p in text.split(",")]:
        bad = Problem(f"--batches {text!r}: {part!r} is not a host count or a percentage", path="--batches",
                      fix="give batch sizes like 1,50%,100%: positive host counts or percentages up to 100%")
        if part.endswith("%"):
            try:
                pct = float(part[:-1])
            except ValueError:
                raise GpushareError(bad, exit_code=2) from None
            if not 0 < pct <= 100:
                raise GpushareError(bad, exit_code=2)
            sizes.append(pct / 100)
        else:
            try:
                count = int(part)
            except ValueError:
                raise GpushareError(bad, exit_code=2) from None
            if count < 1:
                raise GpushareError(bad, exit_code=2)
            sizes.append(count)
    return sizes


def plan_batches(hosts: list[str], sizes: list[int | float]) -> list[list[str]]:
    """Hosts in batches the way Ansible's `serial` cuts them: a share is of all hosts (rounded down, at least one),
    and the last size repeats until every host has a batch."""
    out: list[list[str]] = []
    start = 0
    for i in range(len(hosts)):
        if start >= len(hosts):
            break
        size = sizes[min(i, len(sizes) - 1)]
        count = size if isinstance(size, int) else max(1, int(len(hosts) * size))
        out.append(hosts[start:start + count])
        start += count
    return out


# ---------------------------------------------------------------- snapshots


@dataclass(frozen=True)
class Snapshot:
    """The files a revision of an environment resolves from: enough to re-apply it without Git."""

    name: str  # the environment file's name
    text: str
    profiles: dict[str, str]
    group_vars: dict[str, str]

    @classmethod
    def of(cls, env_file: Path) -> Snapshot:
        profiles_dir = default_profiles_dir(env_file)
        group_vars = env_file.parent / "group_vars"
        return cls(
            name=env_file.name, text=env_file.read_text(),
            profiles={p.name: p.read_text() for p in sorted(profiles_dir.glob("*.yaml"))},
            group_vars={str(p.relative_to(group_vars)): p.read_text() for p in sorted(group_vars.rglob("*"))
                        if p.is_file()} if group_vars.is_dir() else {},
        )

    @classmethod
    def from_git(cls, root: Path, revision: str, env_file: Path) -> Snapshot:
        """The environment file and profiles as Git has them at `revision` (site settings as they are now)."""
        current = cls.of(env_file)
        profiles_dir = default_profiles_dir(env_file).resolve()
        if not env_file.resolve().is_relative_to(root.resolve()) or not profiles_dir.is_relative_to(root.resolve()):
            raise GpushareError(Problem(f"{env_file} is not in the Git work tree at {root}", path="--previous",
                                        fix="give --previous only for environment files kept in the repository"),
                                exit_code=2)

        def git(*args: str) -> str:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60)
            if done.returncode != 0:
                raise GpushareError(Problem(f"git {' '.join(args)}: {done.stderr.strip()}", path="--previous",
                                            fix="give a commit of this repository that has the environment file"),
                                    exit_code=2)
            return done.stdout

        env_rel = env_file.resolve().relative_to(root.resolve()).as_posix()
        prof_rel = profiles_dir.relative_to(root.resolve()).as_posix()
        names = [n for n in git("ls-tree", "--name-only", f"{revision}:{prof_rel}").split() if n.endswith(".yaml")]
        return cls(name=env_file.name, text=git("show", f"{revision}:{env_rel}"),
                   profiles={n: git("show", f"{revision}:{prof_rel}/{n}") for n in names},
                   group_vars=current.group_vars)

    @property
    def fingerprint(self) -> str:
        """What resolution depends on (site settings in group_vars excluded)."""
        digest = hashlib.sha256(self.text.encode())
        for name, text in sorted(self.profiles.items()):
            digest.update(f"\0{name}\0{text}".encode())
        return digest.hexdigest()[:16]

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "text": self.text, "profiles": self.profiles, "group_vars": self.group_vars}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Snapshot:
        return cls(name=data["name"], text=data["text"], profiles=dict(data["profiles"]),
                   group_vars=dict(data.get("group_vars", {})))

    def materialize(self, directory: Path) -> Path:
        """environments/<name> (an inventory the plugin recognises) beside profiles/; returns the environment file."""
        shutil.rmtree(directory, ignore_errors=True)
        (directory / "profiles").mkdir(parents=True)
        for name, text in self.profiles.items():
            (directory / "profiles" / name).write_text(text)
        env_dir = directory / "environments"
        env_dir.mkdir()
        for rel, text in self.group_vars.items():
            target = env_dir / "group_vars" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        path = env_dir / self.name
        path.write_text(self.text)
        return path


def git_revision(root: Path, paths: Iterable[Path] = ()) -> tuple[str, bool]:
    """HEAD's commit and whether the given files differ from it ("unknown" outside a Git work tree)."""
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown", False
    inside = [str(p) for p in paths if p.resolve().is_relative_to(root.resolve())]
    dirty = False
    if inside:
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", *inside],
                                capture_output=True, text=True, timeout=30)
        dirty = bool(status.stdout.strip())
    return rev, dirty


# ---------------------------------------------------------------- journal


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
        out: dict[str, str] = {}
        for e in self.events:
            if e.get("event") == "host":
                out[e["host"]] = e["status"]
        return out

    @property
    def passed_hosts(self) -> set[str]:
        return {h for h, s in self.host_status().items() if s == "passed"}

    @property
    def changed_hosts(self) -> set[str]:
        """Hosts this rollout changed: Ansible reported changes, or the host failed or never finished (its state is
        unknown, so it counts as changed)."""
        out: set[str] = set()
        for host, status in self.host_status().items():
            if status != "passed":
                out.add(host)
        for e in self.events:
            if e.get("event") == "host" and e.get("changed"):
                out.add(e["host"])
        return out

    def cordoned_by_rollout(self) -> set[str]:
        out: set[str] = set()
        for e in self.events:
            if e.get("event") == "node":
                (out.add if e.get("cordoned") else out.discard)(e["host"])
        return out

    def step_done(self, step: str) -> bool:
        return any(e.get("event") == "step" and e.get("step") == step and e.get("status") == "done"
                   for e in self.events)


# ---------------------------------------------------------------- the plan


@dataclass
class Step:
    step: str  # check | pulumi-add | batch | pulumi-prune | git-revert
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, **self.detail}


@dataclass
class RolloutPlan:
    kind: Kind
    environment: str
    env_file: Path  # the file Ansible's inventory reads (a materialized snapshot for rollbacks and resumes)
    fleet: ResolvedFleet
    snapshot: Snapshot
    revision: str
    dirty: bool
    batches: list[list[str]]
    done_hosts: set[str]
    steps: list[Step]
    resumes: RolloutRecord | None = None
    target_revision: str | None = None  # a rollback's revision
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "environment": self.environment, "revision": self.revision, "dirty": self.dirty,
            "resumes": self.resumes.id if self.resumes else None, "target_revision": self.target_revision,
            "batches": [{"hosts": b, "done": sorted(set(b) & self.done_hosts)} for b in self.batches],
            "steps": [s.as_dict() for s in self.steps], "notes": self.notes,
        }


def state_dir(environment: str) -> Path:
    return project_root() / ".gpushare" / "rollouts" / environment


def ansible_hosts(fleet: ResolvedFleet) -> list[str]:
    """Bare-metal hosts in environment order (pools, then hosts): the first is the canary."""
    return [n.name for n in fleet.nodes if n.managed_by == "ansible"]


def stack_file(environment: str) -> Path:
    return project_root() / f"Pulumi.{environment}.yaml"


def kept_configs(previous: ResolvedFleet | None, target: ResolvedFleet, directory: Path) -> list[dict[str, str]]:
    """Device-plugin configs that nodes still on `previous` use and `target` no longer renders, written as the
    files `gpushare:keepDevicePluginConfigs` names (the Pulumi program checks each file against its name)."""
    if previous is None:
        return []
    from gpushare.render.fleet import render_fleet

    gone = sorted(set(previous.device_plugin_configs) - set(target.device_plugin_configs))
    if not gone:
        return []
    files = render_fleet(previous).files
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for name in gone:
        path = directory / f"{name}.yaml"
        path.write_text(files[f"device-plugin/{name}.yaml"])
        root = project_root().resolve()
        where = path.resolve()
        out.append({"name": name, "file": str(where.relative_to(root) if where.is_relative_to(root) else where)})
    return out


def pulumi_steps(environment: str, kept: list[dict[str, str]], kind: Kind, target_revision: str | None
                 ) -> tuple[Step, Step]:
    """The Pulumi steps around the host batches, with the exact commands a person would type."""
    stack = environment
    key = "gpushare:keepDevicePluginConfigs"
    add: list[str] = []
    for i, entry in enumerate(kept):
        add.append(f"pulumi config set --path -s {stack} '{key}[{i}].name' {entry['name']}")
        add.append(f"pulumi config set --path -s {stack} '{key}[{i}].file' {entry['file']}")
    add.append(f"pulumi up -s {stack}")
    prune = ([f"pulumi config rm -s {stack} {key}"] if kept else []) + [f"pulumi up -s {stack}"]
    exists = stack_file(environment).exists()
    why = None if exists else f"no Pulumi stack for {environment} (Pulumi.{environment}.yaml)"
    first = Step("pulumi-add", {
        "description": "add the new sharing configs, keeping those nodes still use" + (
            f" ({', '.join(e['name'] for e in kept)})" if kept else ""),
        "stack": stack, "keep": kept, "commands": add, "skip": why})
    if kind == "rollback":
        last = Step("git-revert", {
            "description": f"make environments/{environment}.yaml equal revision {target_revision} in Git (revert "
                           "the change and merge it), then prune the kept configs with Pulumi",
            "stack": stack, "commands": prune, "skip": why, "manual": True})
    else:
        last = Step("pulumi-prune", {"description": "prune the sharing configs no node uses", "stack": stack,
                                     "commands": prune, "keep": kept, "skip": why})
    return first, last


def _batch_steps(batches: list[list[str]], done: set[str], kubeconfig: bool) -> list[Step]:
    gates = ["verify", "dcgm"] + (["device-plugin"] if kubeconfig else [])
    out = []
    for i, hosts in enumerate(batches, 1):
        todo = [h for h in hosts if h not in done]
        out.append(Step("batch", {"batch": i, "hosts": hosts, "run": todo, "playbook": "playbooks/site.yml",
                                  "limit": ",".join(todo), "gates": gates}))
    return out


def _resolve_snapshot(snapshot: Snapshot, work: Path) -> tuple[Path, ResolvedFleet]:
    """The snapshot written out under work/revisions/<fingerprint> and resolved from there."""
    from gpushare.core.resolve import resolve

    path = snapshot.materialize(work / "revisions" / snapshot.fingerprint)
    return path, resolve(path)


def plan_rollout(env_file: Path, fleet: ResolvedFleet, journal: Journal, batches_text: str, kind: Kind = "rollout",
                 resume: bool = False, kubeconfig: bool = False, previous: str | None = None) -> RolloutPlan:
    """What a rollout (or rollback, or resume) would do, from the environment file and the journal."""
    environment = fleet.environment
    sizes = parse_batches(batches_text)
    records = journal.records(environment)
    work = journal.path.parent  # kept configs and materialized revisions live beside the journal
    current = Snapshot.of(env_file)
    revision, dirty = git_revision(project_root(), [env_file, default_profiles_dir(env_file)])
    succeeded = [r for r in records if r.status == "succeeded"]
    notes: list[str] = []

    if resume:
        unfinished = records[-1] if records and records[-1].status != "succeeded" else None
        if unfinished is None:
            raise GpushareError(Problem(
                f"nothing to resume: the journal has no unfinished rollout of {environment}",
                file=str(journal.path), fix="start a rollout without --resume"), exit_code=1)
        snap = unfinished.snapshot
        if unfinished.kind == "rollout" and snap.fingerprint != current.fingerprint:
            raise GpushareError(Problem(
                f"{env_file.name} or its profiles changed since rollout {unfinished.id} started (revision "
                f"{unfinished.revision}); resuming would mix two revisions",
                file=str(env_file), fix="start a new rollout without --resume (finished hosts are converged again, "
                "which changes nothing on them), or restore the files of that revision"), exit_code=1)
        path, target = _resolve_snapshot(snap, work)
        done = unfinished.passed_hosts
        first, last = _stored_pulumi_steps(unfinished)
        steps = [Step("check", {"description": "gpushare check passed when the rollout started", "skip": "done"})]
        steps.append(_mark_done(first, unfinished.step_done(first.step)))
        steps += _batch_steps(unfinished.batches, done, kubeconfig)
        steps.append(_mark_done(last, unfinished.step_done(last.step)))
        return RolloutPlan(kind="rollback" if unfinished.kind == "rollback" else "rollout",
                           environment=environment, env_file=path, fleet=target, snapshot=snap,
                           revision=unfinished.revision, dirty=bool(unfinished.start.get("dirty")),
                           batches=unfinished.batches, done_hosts=done, steps=steps, resumes=unfinished,
                           target_revision=unfinished.start.get("target_revision"), notes=notes)

    previous_fleet: ResolvedFleet | None = None
    if previous is not None:
        snap_prev = Snapshot.from_git(project_root(), previous, env_file)
        _, previous_fleet = _resolve_snapshot(snap_prev, work)
    elif succeeded:
        last_ok = succeeded[-1]
        _, previous_fleet = _resolve_snapshot(last_ok.snapshot, work)

    if kind == "rollback":
        # The revision to go back to: the last one that succeeded before the latest rollout, with other contents.
        latest = next((r for r in reversed(records) if r.kind == "rollout"), None)
        before = records[:records.index(latest)] if latest is not None else records
        candidates = [r for r in before if r.status == "succeeded"
                      and (latest is None or r.snapshot.fingerprint != latest.snapshot.fingerprint)]
        if not candidates:
            raise GpushareError(Problem(
                f"the journal has no succeeded rollout of {environment} before the latest one, so there is no "
                "revision to roll back to", file=str(journal.path),
                fix="fix the failing hosts and resume the rollout (--resume) instead"), exit_code=1)
        last_ok = candidates[-1]
        later = records[records.index(last_ok) + 1:]
        changed: set[str] = set().union(*(r.changed_hosts for r in later)) if later else set()
        snap = last_ok.snapshot
        path, target = _resolve_snapshot(snap, work)
        order = ansible_hosts(target)
        hosts = [h for h in order if h in changed]
        gone = sorted(changed - set(order))
        if gone:
            notes.append(f"hosts no longer in revision {last_ok.revision}: {', '.join(gone)} (left as they are)")
        if not hosts:
            notes.append(f"no host changed since revision {last_ok.revision} succeeded: nothing to roll back")
        batches = plan_batches(hosts, sizes)
        # Configs the hosts use now (the working tree's, or a failed rollout's) stay while they roll back.
        # Rolling back, the target's configs must exist beside today's: keep the target's that today lacks.
        kept = kept_configs(target, fleet, work / "kept")
        first, last = pulumi_steps(environment, kept, "rollback", last_ok.revision)
        steps = [Step("check", {"description": "gpushare check of the revision rolled back to (warns only)"}),
                 first, *_batch_steps(batches, set(), kubeconfig), last]
        return RolloutPlan(kind="rollback", environment=environment, env_file=path, fleet=target, snapshot=snap,
                           revision=revision, dirty=dirty, batches=batches, done_hosts=set(), steps=steps,
                           target_revision=last_ok.revision, notes=notes)

    if records and records[-1].status != "succeeded":
        notes.append(f"rollout {records[-1].id} did not finish ({records[-1].status}); this one replaces it "
                     "(use --resume to continue it instead, or --rollback)")
    batches = plan_batches(ansible_hosts(fleet), sizes)
    kept = kept_configs(previous_fleet, fleet, work / "kept")
    if previous_fleet is None:
        notes.append("no succeeded rollout in the journal and no --previous: device-plugin configs that hosts use "
                     "now and this revision drops are not kept, so hosts in later batches could lose theirs at the "
                     "first `pulumi up`; give --previous <the Git revision the fleet runs> unless this is the "
                     "fleet's first rollout")
    first, last = pulumi_steps(environment, kept, "rollout", None)
    steps = [Step("check", {"description": "gpushare check: every guardrail rule, with the offline plan"}),
             first, *_batch_steps(batches, set(), kubeconfig), last]
    return RolloutPlan(kind="rollout", environment=environment, env_file=env_file, fleet=fleet, snapshot=current,
                       revision=revision, dirty=dirty, batches=batches, done_hosts=set(), steps=steps, notes=notes)


def _stored_pulumi_steps(record: RolloutRecord) -> tuple[Step, Step]:
    stored = {s["step"]: s for s in record.start.get("steps", []) if s["step"] != "batch"}
    first = stored.get("pulumi-add", {"step": "pulumi-add"})
    last = stored.get("pulumi-prune") or stored.get("git-revert") or {"step": "pulumi-prune"}
    return (Step(first["step"], {k: v for k, v in first.items() if k != "step"}),
            Step(last["step"], {k: v for k, v in last.items() if k != "step"}))


def _mark_done(step: Step, done: bool) -> Step:
    if done:
        step.detail = {**step.detail, "skip": "done"}
    return step


# ---------------------------------------------------------------- backends


@dataclass
class HostOutcome:
    host: str
    ok: bool
    gate: str = ""  # which gate failed
    message: str = ""
    changed: int = 0


def _gate_of(task: str, default: str) -> str:
    return "dcgm" if task.startswith("DCGM |") else default


class AnsibleBackend:
    """playbooks/site.yml and verify.yml through ansible-runner, one call per batch with `--limit`."""

    def __init__(self, logs: Path, forks: int = 10, kubeconfig: Path | None = None,
                 on_task: Callable[[str, str], None] | None = None) -> None:
        self.logs = logs
        self.forks = forks
        self.kubeconfig = kubeconfig
        self.on_task = on_task
        self.calls = 0

    def run(self, playbook: str, inventory: Path, hosts: list[str], label: str, gate: str) -> dict[str, HostOutcome]:
        import ansible_runner

        root = project_root()
        self.calls += 1
        self.logs.mkdir(parents=True, exist_ok=True)
        env = {"ANSIBLE_CONFIG": os.environ.get("ANSIBLE_CONFIG", str(root / "ansible.cfg")),
               "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")])}
        extravars: dict[str, Any] = {}
        if self.kubeconfig is not None:
            extravars["gpushare_kubeconfig"] = str(self.kubeconfig)

        def handler(event: dict[str, Any]) -> bool:
            data = event.get("event_data", {})
            if self.on_task and event.get("event") in ("runner_on_start", "runner_on_ok", "runner_on_failed"):
                host, task = data.get("host"), data.get("task")
                if host and task:
                    self.on_task(host, task)
            return True

        with tempfile.TemporaryDirectory(prefix="gpushare-runner-") as private:
            result = ansible_runner.run(
                private_data_dir=private, project_dir=str(root), playbook=str(root / "playbooks" / playbook),
                inventory=str(inventory), limit=",".join(hosts), envvars=env, extravars=extravars, quiet=True,
                forks=self.forks, event_handler=handler)
            log = self.logs / f"{label}.log"
            log.write_text(result.stdout.read())
            events = list(result.events)
            stats = result.stats or {}  # read from the artifacts directory, so before it goes
        out: dict[str, HostOutcome] = {}
        for host in hosts:
            failed = int(stats.get("failures", {}).get(host, 0)) > 0 or int(stats.get("dark", {}).get(host, 0)) > 0
            seen = any(host in stats.get(k, {}) for k in ("ok", "failures", "dark", "skipped", "changed"))
            outcome = HostOutcome(host, ok=seen and not failed, changed=int(stats.get("changed", {}).get(host, 0)))
            if not seen:
                outcome.gate, outcome.message = gate, f"{playbook} did not run on {host} (log: {log})"
            for ev in events:
                data = ev.get("event_data", {})
                if data.get("host") != host or ev.get("event") not in ("runner_on_failed", "runner_on_unreachable"):
                    continue
                if data.get("ignore_errors") or ev.get("event") == "runner_on_failed" and data.get("rescued"):
                    continue
                res = data.get("res", {})
                task = str(data.get("task", ""))
                outcome.gate = _gate_of(task, gate)
                outcome.message = f"{task}: {res.get('msg') or res.get('stderr') or 'failed'}"
            if failed and not outcome.message:
                outcome.gate, outcome.message = gate, f"{playbook} failed on {host} (log: {log})"
            out[host] = outcome
        return out


class Kube:
    """kubectl with the user's kubeconfig (and each cluster's context), as the roles call it."""

    def __init__(self, kubeconfig: Path, kubectl: str = "kubectl") -> None:
        self.kubeconfig = kubeconfig
        self.kubectl = kubectl

    def _run(self, context: str | None, *args: str) -> str:
        cmd = [self.kubectl, f"--kubeconfig={self.kubeconfig}"]
        if context:
            cmd.append(f"--context={context}")
        try:
            done = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise GpushareError(Problem(f"kubectl {' '.join(args)} failed: {exc}",
                                        fix="install kubectl on PATH and check --kubeconfig"), exit_code=2) from None
        if done.returncode != 0:
            raise GpushareError(Problem(f"kubectl {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}",
                                        fix="check --kubeconfig and that the node exists"), exit_code=2)
        return done.stdout

    def node(self, context: str | None, name: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self._run(context, "get", "node", name, "-o", "json"))
        return doc

    def cordon(self, context: str | None, name: str) -> None:
        self._run(context, "cordon", name)

    def uncordon(self, context: str | None, name: str) -> None:
        self._run(context, "uncordon", name)

    def label(self, context: str | None, name: str, labels: dict[str, str]) -> None:
        self._run(context, "label", "node", name, *[f"{k}={v}" for k, v in labels.items()], "--overwrite")


def advertised_mismatch(expected: dict[str, int], node: dict[str, Any]) -> list[str]:
    """Differences between what the fleet says a node advertises and the node's allocatable resources."""
    allocatable = node.get("status", {}).get("allocatable", {})
    out = []
    for resource, count in sorted(expected.items()):
        have = allocatable.get(resource)
        if have is None or int(str(have)) != count:
            out.append(f"{resource}: {have if have is not None else 'absent'} (expected {count})")
    return out


class PulumiRunner:
    """Pulumi through its Automation API when the CLI is installed; otherwise the exact commands for a person."""

    def __init__(self, confirm: Callable[[Step], bool], on_output: Callable[[str], None] | None = None) -> None:
        self.confirm = confirm
        self.on_output = on_output

    @staticmethod
    def available() -> bool:
        return shutil.which("pulumi") is not None

    def run(self, step: Step) -> tuple[str, str]:
        """(status, detail): done, skipped, or waiting (a person must run the commands first)."""
        if step.detail.get("skip"):
            return "skipped", str(step.detail["skip"])
        if not self.available():
            if self.confirm(step):
                return "done", "confirmed: " + "; ".join(step.detail["commands"])
            return "waiting", "the Pulumi CLI is not installed"
        from pulumi import automation as auto

        stack = auto.select_stack(stack_name=step.detail["stack"], work_dir=str(project_root()))
        key = "gpushare:keepDevicePluginConfigs"
        if step.step == "pulumi-add" and step.detail.get("keep"):
            for i, entry in enumerate(step.detail["keep"]):
                stack.set_config(f"{key}[{i}].name", auto.ConfigValue(value=entry["name"]), path=True)
                stack.set_config(f"{key}[{i}].file", auto.ConfigValue(value=entry["file"]), path=True)
        if step.step == "pulumi-prune" and step.detail.get("keep"):
            stack.remove_config(key)
        result = stack.up(on_output=self.on_output, message=f"gpushare rollout: {step.step}")
        return "done", f"pulumi up: {result.summary.result} ({json.dumps(result.summary.resource_changes or {})})"


# ---------------------------------------------------------------- execution


@dataclass
class Progress:
    """Callbacks the command line turns into a Rich display (all optional)."""

    step: Callable[[Step, str], None] = lambda step, status: None
    batch: Callable[[int, list[str]], None] = lambda index, hosts: None
    host: Callable[[str, str], None] = lambda host, status: None


@dataclass
class Result:
    rollout: str
    status: str  # succeeded | failed | stopped
    reason: str
    hosts: dict[str, str]
    failures: list[HostOutcome]
    journal: Path

    def as_dict(self) -> dict[str, Any]:
        return {"rollout": self.rollout, "status": self.status, "reason": self.reason, "hosts": self.hosts,
                "failures": [f.__dict__ for f in self.failures], "journal": str(self.journal)}


def _context(fleet: ResolvedFleet, host: str) -> str | None:
    node = next(n for n in fleet.nodes if n.name == host)
    cluster = next((c for c in fleet.env.clusters if c.name == node.cluster), None)
    return cluster.kubeconfig_context if cluster is not None else None


def execute(plan: RolloutPlan, journal: Journal, ansible: AnsibleBackend, pulumi: PulumiRunner,
            kube: Kube | None, progress: Progress | None = None, gate_timeout: float = 300.0,
            poll_interval: float = 5.0) -> Result:
    """Run the plan's steps in order, journalling each; stop at the first failing host (after its batch)."""
    show = progress or Progress()
    fleet = plan.fleet
    if plan.resumes is not None:
        rollout_id = plan.resumes.id
        journal.append({"event": "resume", "rollout": rollout_id, "revision": plan.revision,
                        "skipping": sorted(plan.done_hosts)})
        cordoned = plan.resumes.cordoned_by_rollout()
    else:
        rollout_id = f"{plan.environment}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{plan.revision[:8]}"
        journal.append({"event": "start", "rollout": rollout_id, "kind": plan.kind, "env": plan.environment,
                        "revision": plan.revision, "dirty": plan.dirty, "fingerprint": plan.snapshot.fingerprint,
                        "target_revision": plan.target_revision, "batches": plan.batches,
                        "steps": [s.as_dict() for s in plan.steps], "snapshot": plan.snapshot.as_dict()})
        cordoned = set()
    hosts_state = {h: ("passed" if h in plan.done_hosts else "pending") for b in plan.batches for h in b}
    failures: list[HostOutcome] = []

    def finish(status: str, reason: str) -> Result:
        journal.append({"event": "end", "rollout": rollout_id, "status": status, "reason": reason})
        return Result(rollout_id, status, reason, hosts_state, failures, journal.path)

    def record_host(batch: int, host: str, status: str, **extra: Any) -> None:
        hosts_state[host] = status
        journal.append({"event": "host", "rollout": rollout_id, "batch": batch, "host": host, "status": status,
                        **extra})
        show.host(host, status)

    for step in plan.steps:
        if step.step == "check":
            show.step(step, "done")
            continue
        if step.step != "batch":
            if step.detail.get("skip") == "done":
                show.step(step, "done")
                continue
            if step.detail.get("manual"):  # advice for a reviewed change (a Git revert): shown, not awaited
                journal.append({"event": "step", "rollout": rollout_id, "step": step.step, "status": "manual",
                                "detail": step.detail.get("description", ""), "commands": step.detail["commands"]})
                show.step(step, "manual")
                continue
            show.step(step, "running")
            status, detail = pulumi.run(step)
            journal.append({"event": "step", "rollout": rollout_id, "step": step.step, "status": status,
                            "detail": detail})
            show.step(step, status)
            if status == "waiting":
                return finish("stopped", f"{step.step}: {detail}; run these, then resume with --resume "
                              f"--pulumi-confirmed: " + "; ".join(step.detail["commands"]))
            continue

        index, todo = step.detail["batch"], list(step.detail["run"])
        if not todo:
            continue
        show.batch(index, todo)
        for host in todo:
            record_host(index, host, "converging")
        outcomes = ansible.run("site.yml", plan.env_file, todo, f"{rollout_id}-batch{index}-site", "converge")
        healthy = [h for h in todo if outcomes[h].ok]
        bad = [outcomes[h] for h in todo if not outcomes[h].ok]
        if healthy:
            for host in healthy:
                show.host(host, "verifying")
            checked = ansible.run("verify.yml", plan.env_file, healthy, f"{rollout_id}-batch{index}-verify",
                                  "verify")
            for host in healthy:
                outcome = checked[host]
                journal.append({"event": "gate", "rollout": rollout_id, "batch": index, "host": host,
                                "gate": "verify+dcgm", "passed": outcome.ok, "detail": outcome.message})
                if not outcome.ok:
                    bad.append(outcome)
        if kube is not None:
            pending = [h for h in healthy if h not in {b.host for b in bad}]
            deadline = time.monotonic() + gate_timeout
            mismatches: dict[str, list[str]] = {}
            while pending:
                for host in list(pending):
                    node = next(n for n in fleet.nodes if n.name == host)
                    mismatches[host] = advertised_mismatch(node.advertised, kube.node(_context(fleet, host), host))
                    if not mismatches[host]:
                        pending.remove(host)
                        journal.append({"event": "gate", "rollout": rollout_id, "batch": index, "host": host,
                                        "gate": "device-plugin", "passed": True, "detail": ""})
                if not pending or time.monotonic() >= deadline:
                    break
                time.sleep(poll_interval)
            for host in pending:
                detail = "; ".join(mismatches[host])
                journal.append({"event": "gate", "rollout": rollout_id, "batch": index, "host": host,
                                "gate": "device-plugin", "passed": False, "detail": detail})
                bad.append(HostOutcome(host, False, "device-plugin",
                                       f"the device plugin does not advertise the expected resources after "
                                       f"{gate_timeout:g} s: {detail}"))
        failed = {b.host for b in bad}
        for outcome in bad:
            failures.append(outcome)
            record_host(index, outcome.host, "failed", gate=outcome.gate, message=outcome.message,
                        changed=outcomes[outcome.host].changed)
            if kube is not None:
                ctx = _context(fleet, outcome.host)
                kube.cordon(ctx, outcome.host)
                kube.label(ctx, outcome.host, {ROLLOUT_STATE_LABEL: "failed"})
                cordoned.add(outcome.host)
                journal.append({"event": "node", "rollout": rollout_id, "host": outcome.host, "cordoned": True,
                                "labels": {ROLLOUT_STATE_LABEL: "failed"}})
        for host in todo:
            if host in failed:
                continue
            if kube is not None:
                ctx = _context(fleet, host)
                kube.label(ctx, host, {ROLLOUT_STATE_LABEL: "success"})
                if host in cordoned:  # cordoned by an earlier run of this rollout; the gates pass now
                    kube.uncordon(ctx, host)
                    cordoned.discard(host)
                    journal.append({"event": "node", "rollout": rollout_id, "host": host, "cordoned": False,
                                    "labels": {ROLLOUT_STATE_LABEL: "success"}})
            record_host(index, host, "passed", changed=outcomes[host].changed)
        journal.append({"event": "batch", "rollout": rollout_id, "batch": index,
                        "status": "failed" if failed else "passed", "hosts": todo})
        if failed:
            untouched = [h for b in plan.batches[index:] for h in b]
            return finish("failed", f"batch {index}: {', '.join(sorted(failed))} failed its gates; the rollout "
                          f"stopped" + (f" before {', '.join(untouched)}" if untouched else ""))
    return finish("succeeded", f"{sum(s == 'passed' for s in hosts_state.values())} hosts passed every gate")

