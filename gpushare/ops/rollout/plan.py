"""The plan of a rollout, a resume or a rollback: its batches and steps, worked out from the environment file and the
journal before anything runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.paths import default_profiles_dir, project_root
from gpushare.core.resolve import ResolvedFleet, resolve
from gpushare.ops.rollout.batches import ansible_hosts, parse_batches, plan_batches
from gpushare.ops.rollout.journal import Journal, RolloutRecord
from gpushare.ops.rollout.snapshot import Snapshot, git_revision
from gpushare.render.fleet import render_fleet

Kind = Literal["rollout", "rollback"]
# What each batch runs, with `--limit` to its hosts, and then its health gates.
BATCH_PLAYBOOK = "rollout.yml"
GATE_PLAYBOOK = "verify.yml"
KEEP_CONFIGS_KEY = "gpushare:keepDevicePluginConfigs"


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


def stack_file(environment: str) -> Path:
    return project_root() / f"Pulumi.{environment}.yaml"


def kept_configs(previous: ResolvedFleet | None, target: ResolvedFleet, directory: Path) -> list[dict[str, str]]:
    """Device-plugin configs that nodes still on `previous` use and `target` no longer renders, written as the
    files `gpushare:keepDevicePluginConfigs` names (the Pulumi program checks each file against its name)."""
    if previous is None:
        return []

    gone = sorted(set(previous.device_plugin_configs) - set(target.device_plugin_configs))
    if not gone:
        return []
    files = render_fleet(previous).files
    directory.mkdir(parents=True, exist_ok=True)
    root = project_root().resolve()
    out = []
    for name in gone:
        path = directory / f"{name}.yaml"
        path.write_text(files[f"device-plugin/{name}.yaml"])
        where = path.resolve()
        out.append({"name": name, "file": str(where.relative_to(root) if where.is_relative_to(root) else where)})
    return out


def pulumi_steps(environment: str, kept: list[dict[str, str]], kind: Kind, target_revision: str | None
                 ) -> tuple[Step, Step]:
    """The Pulumi steps around the host batches, with the exact commands a person would type."""
    stack = environment
    add: list[str] = []
    for i, entry in enumerate(kept):
        add.append(f"pulumi config set --path -s {stack} '{KEEP_CONFIGS_KEY}[{i}].name' {entry['name']}")
        add.append(f"pulumi config set --path -s {stack} '{KEEP_CONFIGS_KEY}[{i}].file' {entry['file']}")
    add.append(f"pulumi up -s {stack}")
    prune = ([f"pulumi config rm -s {stack} {KEEP_CONFIGS_KEY}"] if kept else []) + [f"pulumi up -s {stack}"]
    why = None if stack_file(environment).exists() else f"no Pulumi stack for {environment} (Pulumi.{environment}.yaml)"
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


def batch_steps(batches: list[list[str]], done: set[str], kubeconfig: bool) -> list[Step]:
    gates = ["verify", "dcgm"] + (["device-plugin"] if kubeconfig else [])
    out = []
    for i, hosts in enumerate(batches, 1):
        todo = [h for h in hosts if h not in done]
        out.append(Step("batch", {"batch": i, "hosts": hosts, "run": todo, "playbook": BATCH_PLAYBOOK,
                                  "limit": ",".join(todo), "gates": gates}))
    return out


def _resolve_snapshot(snapshot: Snapshot, work: Path) -> tuple[Path, ResolvedFleet]:
    """The snapshot written out under work/revisions/<fingerprint> and resolved from there."""
    path = snapshot.materialize(work / "revisions" / snapshot.fingerprint)
    return path, resolve(path)


@dataclass
class _Inputs:
    """What every kind of plan starts from."""

    env_file: Path
    fleet: ResolvedFleet
    journal: Journal
    sizes: list[int | float]
    kubeconfig: bool
    records: list[RolloutRecord]
    current: Snapshot
    revision: str
    dirty: bool
    scratch: Path | None = None  # a dry run's throwaway folder: it writes nothing beside the journal

    @property
    def environment(self) -> str:
        return self.fleet.environment

    @property
    def work(self) -> Path:
        # Kept configs and materialized revisions live beside the journal.
        return self.scratch if self.scratch is not None else self.journal.path.parent


def plan_rollout(env_file: Path, fleet: ResolvedFleet, journal: Journal, batches_text: str, kind: Kind = "rollout",
                 resume: bool = False, kubeconfig: bool = False, previous: str | None = None,
                 scratch: Path | None = None) -> RolloutPlan:
    """What a rollout (or rollback, or resume) would do, from the environment file and the journal. With
    `scratch` (a dry run) the revisions it resolves and the configs it keeps are written there, not beside the
    journal."""
    revision, dirty = git_revision(project_root(), [env_file, default_profiles_dir(env_file)])
    given = _Inputs(env_file, fleet, journal, parse_batches(batches_text), kubeconfig,
                    journal.records(fleet.environment), Snapshot.of(env_file), revision, dirty, scratch)
    if resume:
        return _plan_resume(given)
    if kind == "rollback":
        return _plan_rollback(given)
    return _plan_forward(given, previous)


def _plan_resume(given: _Inputs) -> RolloutPlan:
    records, environment = given.records, given.environment
    unfinished = records[-1] if records and records[-1].status != "succeeded" else None
    if unfinished is None:
        raise GpushareError(Problem(
            f"nothing to resume: the journal has no unfinished rollout of {environment}",
            file=str(given.journal.path), fix="start a rollout without --resume"), exit_code=1)
    snap = unfinished.snapshot
    if unfinished.kind == "rollout" and snap.fingerprint != given.current.fingerprint:
        raise GpushareError(Problem(
            f"{given.env_file.name} or its profiles changed since rollout {unfinished.id} started (revision "
            f"{unfinished.revision}); resuming would mix two revisions",
            file=str(given.env_file), fix="start a new rollout without --resume (finished hosts are converged again, "
            "which changes nothing on them), or restore the files of that revision"), exit_code=1)
    path, target = _resolve_snapshot(snap, given.work)
    done = unfinished.passed_hosts
    first, last = _stored_pulumi_steps(unfinished)
    steps = [Step("check", {"description": "gpushare check passed when the rollout started", "skip": "done"}),
             _mark_done(first, unfinished.step_done(first.step)),
             *batch_steps(unfinished.batches, done, given.kubeconfig),
             _mark_done(last, unfinished.step_done(last.step))]
    return RolloutPlan(kind="rollback" if unfinished.kind == "rollback" else "rollout",
                       environment=environment, env_file=path, fleet=target, snapshot=snap,
                       revision=unfinished.revision, dirty=bool(unfinished.start.get("dirty")),
                       batches=unfinished.batches, done_hosts=done, steps=steps, resumes=unfinished,
                       target_revision=unfinished.start.get("target_revision"))


def _last_good_before_latest(given: _Inputs) -> RolloutRecord:
    """The rollout to go back to: the last one that succeeded before the latest rollout, with other contents."""
    records = given.records
    latest = next((r for r in reversed(records) if r.kind == "rollout"), None)
    before = records[:records.index(latest)] if latest is not None else records
    candidates = [r for r in before if r.status == "succeeded"
                  and (latest is None or r.snapshot.fingerprint != latest.snapshot.fingerprint)]
    if not candidates:
        raise GpushareError(Problem(
            f"the journal has no succeeded rollout of {given.environment} before the latest one, so there is no "
            "revision to roll back to", file=str(given.journal.path),
            fix="fix the failing hosts and resume the rollout (--resume) instead"), exit_code=1)
    return candidates[-1]


def _plan_rollback(given: _Inputs) -> RolloutPlan:
    last_ok = _last_good_before_latest(given)
    later = given.records[given.records.index(last_ok) + 1:]
    changed: set[str] = set().union(*(r.changed_hosts for r in later)) if later else set()
    path, target = _resolve_snapshot(last_ok.snapshot, given.work)
    order = ansible_hosts(target)
    hosts = [h for h in order if h in changed]
    notes = []
    gone = sorted(changed - set(order))
    if gone:
        notes.append(f"hosts no longer in revision {last_ok.revision}: {', '.join(gone)} (left as they are)")
    if not hosts:
        notes.append(f"no host changed since revision {last_ok.revision} succeeded: nothing to roll back")
    batches = plan_batches(hosts, given.sizes)
    # Configs the hosts use now (the working tree's, or a failed rollout's) stay while they roll back.
    # Rolling back, the target's configs must exist beside today's: keep the target's that today lacks.
    kept = kept_configs(target, given.fleet, given.work / "kept")
    first, last = pulumi_steps(given.environment, kept, "rollback", last_ok.revision)
    steps = [Step("check", {"description": "gpushare check of the revision rolled back to (warns only)"}),
             first, *batch_steps(batches, set(), given.kubeconfig), last]
    return RolloutPlan(kind="rollback", environment=given.environment, env_file=path, fleet=target,
                       snapshot=last_ok.snapshot, revision=given.revision, dirty=given.dirty, batches=batches,
                       done_hosts=set(), steps=steps, target_revision=last_ok.revision, notes=notes)


def _previous_fleet(given: _Inputs, previous: str | None) -> ResolvedFleet | None:
    """What the fleet runs now: a given Git revision, else the journal's last succeeded rollout."""
    if previous is not None:
        return _resolve_snapshot(Snapshot.from_git(project_root(), previous, given.env_file), given.work)[1]
    succeeded = [r for r in given.records if r.status == "succeeded"]
    return _resolve_snapshot(succeeded[-1].snapshot, given.work)[1] if succeeded else None


def _plan_forward(given: _Inputs, previous: str | None) -> RolloutPlan:
    previous_fleet = _previous_fleet(given, previous)
    records, notes = given.records, []
    if records and records[-1].status != "succeeded":
        notes.append(f"rollout {records[-1].id} did not finish ({records[-1].status}); this one replaces it "
                     "(use --resume to continue it instead, or --rollback)")
    batches = plan_batches(ansible_hosts(given.fleet), given.sizes)
    kept = kept_configs(previous_fleet, given.fleet, given.work / "kept")
    if previous_fleet is None:
        notes.append("no succeeded rollout in the journal and no --previous: device-plugin configs that hosts use "
                     "now and this revision drops are not kept, so hosts in later batches could lose theirs at the "
                     "first `pulumi up`; give --previous <the Git revision the fleet runs> unless this is the "
                     "fleet's first rollout")
    first, last = pulumi_steps(given.environment, kept, "rollout", None)
    steps = [Step("check", {"description": "gpushare check: every guardrail rule, with the offline plan"}),
             first, *batch_steps(batches, set(), given.kubeconfig), last]
    return RolloutPlan(kind="rollout", environment=given.environment, env_file=given.env_file, fleet=given.fleet,
                       snapshot=given.current, revision=given.revision, dirty=given.dirty, batches=batches,
                       done_hosts=set(), steps=steps, notes=notes)


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
