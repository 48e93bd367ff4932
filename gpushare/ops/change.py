"""What a change does against its base (`gpushare check --base REF`): the guardrail rules that newly fail or newly
pass, the waivers added, removed, renewed or expiring soon, and what changes per pool and node (profile,
replicas, advertised resources, oversubscription).

The base is evaluated as `check` evaluates the working tree: its environments, profiles, policies (guardrails,
waivers) and stack files are read at REF through Git (gpushare.core.revision; nothing is checked out), written to
a scratch copy of the workspace, resolved by the same resolver and judged by the same rules, with the Pulumi
program's offline plan where `check` collects one."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path
from typing import Any

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.paths import WORKSPACE_MARKER, environment_path, project_root
from gpushare.core.reading import parse_yaml
from gpushare.core.resolve import ResolvedFleet, ResolvedNode, ResolvedPool
from gpushare.core.revision import Revision
from gpushare.core.spec import SHARED_KINDS
from gpushare.ops.preview import plan_resources
from gpushare.policy.context import context_for
from gpushare.policy.evaluate import Report, evaluate
from gpushare.policy.registry import Context, Violation
from gpushare.policy.waivers import WAIVER_RULES, Waiver, load_waivers

# No expiry warning existed before: a waiver that ends within this many days of the day judged (--today) is listed
# as expiring, so the review that could renew it (or fix what it waives) starts before check fails on it.
EXPIRING_DAYS = 14


@dataclass
class Checked:
    """One side of the comparison: what `check` found and what it judged."""

    context: Context
    report: Report
    waivers: list[Waiver]


def check_once(env: str, waivers: Path | None, today: date, offline_plan: bool, base: str | None = None,
               no_waivers: bool = False) -> Checked:
    """`gpushare check` over the workspace GPUSHARE_ROOT (or the working directory) names; `no_waivers`: judge
    without any waivers file."""
    plan = plan_resources(env) if offline_plan else None
    ctx = context_for(env, plan, base=base)
    if no_waivers:
        return Checked(ctx, evaluate(ctx, [], today), [])
    waiver_list, waiver_file = load_waivers(waivers, ctx.guardrails)
    return Checked(ctx, evaluate(ctx, waiver_list, today, waiver_file), waiver_list)


# ---------------------------------------------------------------- the base, as Git has it


@contextlib.contextmanager
def _workspace_root(root: Path) -> Iterator[None]:
    """Every reader of the workspace (environments, profiles, policies, stacks, the program) reads `root`."""
    before = os.environ.get("GPUSHARE_ROOT")
    os.environ["GPUSHARE_ROOT"] = str(root)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("GPUSHARE_ROOT", None)
        else:
            os.environ["GPUSHARE_ROOT"] = before


def _inside(root_rel: str, rel: str) -> str:
    return rel if root_rel in ("", ".") else f"{root_rel}/{rel}"


def _program_paths(revision: Revision, root_rel: str) -> list[str]:
    """What `pulumi up` runs, as Pulumi.yaml at the base names it: its `main` launcher (infra/__main__.py)."""
    text = revision.read(_inside(root_rel, "Pulumi.yaml"))
    if text is None:
        return []
    try:
        data = parse_yaml(text, "Pulumi.yaml")
    except GpushareError:
        return []
    main = str(data.get("main", ".") if isinstance(data, dict) else ".").strip("/") or "."
    if main.endswith(".py"):
        return [main]
    return [f"{main}/__main__.py" if main != "." else "__main__.py"]


@dataclass
class _BaseInputs:
    env: str | None  # the --env argument that names the environment in the scratch workspace; None: absent at REF
    waivers: Path | None  # --waivers there (None: the default file)
    no_waivers: bool  # the --waivers file given did not exist at REF


def _materialise(revision: Revision, env: str, waivers: Path | None, dest: Path, with_program: bool
                 ) -> _BaseInputs:
    """Write the workspace's files as they are at the base into `dest`, laid out as in the working tree."""
    root = project_root()
    root_rel = revision.relative(root)
    if root_rel is None:
        raise GpushareError(Problem(f"the workspace {root} is not inside the Git work tree {revision.top}",
                                    path="--base", fix="run check in the workspace's own Git checkout"), exit_code=2)

    def copy(rel: str) -> int:
        return revision.copy(_inside(root_rel, rel), dest / rel)

    if not copy(WORKSPACE_MARKER):
        shutil.copyfile(root / WORKSPACE_MARKER, dest / WORKSPACE_MARKER)
    for folder in ("environments", "profiles", "policies"):
        copy(folder)
    for name in revision.names(root_rel if root_rel not in ("", ".") else "."):
        if name == "Pulumi.yaml" or (name.startswith("Pulumi.") and name.endswith(".yaml")):
            copy(name)
    if with_program:
        for rel in _program_paths(revision, root_rel):
            copy(rel)

    env_file = environment_path(env)
    by_name = not (env.endswith((".yaml", ".yml")) or os.sep in env)
    env_rel = env_file.absolute().relative_to(root.absolute()).as_posix() if by_name else _within(env_file, root)
    if not by_name:
        copy(env_rel)
        beside = Path(env_rel).parent.parent / "profiles"
        if beside.as_posix() not in (".", "profiles") and not (dest / beside).exists():
            copy(beside.as_posix())
    env_arg = (env if by_name else str(dest / env_rel)) if (dest / env_rel).is_file() else None

    if waivers is None:
        return _BaseInputs(env_arg, None, False)
    in_repository = revision.relative(waivers)
    if in_repository is None:  # a file outside the repository is not under review: the same on both sides
        return _BaseInputs(env_arg, waivers, False)
    try:
        target = dest / _within(waivers, root)
    except GpushareError:
        target = dest / ".base" / "waivers.yaml"
    if not revision.copy(in_repository, target):
        return _BaseInputs(env_arg, None, True)
    return _BaseInputs(env_arg, target, False)


def _within(path: Path, root: Path) -> str:
    try:
        return Path(os.path.normpath(path.absolute())).relative_to(Path(os.path.normpath(root.absolute()))).as_posix()
    except ValueError:
        raise GpushareError(Problem(f"--env {path} lies outside the workspace {root}, so Git cannot show it at the "
                                    "base", path="--base", fix="keep the environment file in the workspace (e.g. "
                                    "environments/), or leave --base out"), exit_code=2) from None


def _scrub(text: str, scratch: Path) -> str:
    """Paths of the scratch copy, as the workspace's own relative paths."""
    return text.replace(f"{scratch}{os.sep}", "").replace(str(scratch), ".")


def check_base(revision: Revision, env: str, waivers: Path | None, today: date, offline_plan: bool
               ) -> tuple[Checked | None, list[str]]:
    """`check` at the base: what it found (None where the environment did not exist there) and, where the base could
    not be judged, why (its problems, located in the base's own files)."""
    scratch = Path(tempfile.mkdtemp(prefix="gpushare-base-"))
    try:
        inputs = _materialise(revision, env, waivers, scratch, offline_plan)
        if inputs.env is None:
            return None, []
        with _workspace_root(scratch):
            try:
                checked = check_once(inputs.env, inputs.waivers, today, offline_plan, no_waivers=inputs.no_waivers)
            except GpushareError as err:
                return None, [_scrub(str(p), scratch) for p in err.problems]

        def scrubbed(v: Violation) -> Violation:
            return replace(v, where=_scrub(v.where, scratch), message=_scrub(v.message, scratch))

        report = checked.report
        report.violations = [scrubbed(v) for v in report.violations]
        report.waived = [(scrubbed(v), w) for v, w in report.waived]
        return checked, []
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ---------------------------------------------------------------- the comparison


def _key(v: Violation) -> tuple[str, str]:
    # A waiver's own violations are located by its index in the file, which moves as waivers are added.
    return (v.rule, v.message if v.rule in WAIVER_RULES else v.where)


def _statuses(checked: Checked) -> dict[tuple[str, str], str]:
    out = {_key(v): "waived" for v, _ in checked.report.waived}
    out.update({_key(v): "fail" for v in checked.report.violations})
    return out


def _violation(v: Violation, **extra: str) -> dict[str, str]:
    return {"rule": v.rule, "level": v.level, "where": v.where, "message": v.message, **extra}


def rule_changes(now: Checked, base: Checked | None) -> dict[str, list[dict[str, str]]]:
    """Violations (rule and where) that fail now and did not at the base, and the reverse; each with what the
    other side says of it (`pass`, `waived`, or `absent` where the environment did not exist at the base)."""
    was = _statuses(base) if base is not None else {}
    is_ = _statuses(now)
    failing = [_violation(v, base="absent" if base is None else was.get(_key(v), "pass"))
               for v in now.report.violations if was.get(_key(v)) != "fail"]
    passing = [_violation(v, now=is_.get(_key(v), "pass"))
               for v in (base.report.violations if base is not None else []) if is_.get(_key(v)) != "fail"]
    return {"newly_failing": failing, "newly_passing": passing}


def _waiver(w: Waiver, today: date | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"rule": w.rule, "environment": w.environment, "where": w.where, "reason": w.reason,
                           "expires": w.expires.isoformat(), "approved_by": w.approved_by}
    if today is not None:
        out["days_left"] = (w.expires - today).days
    return out


def waiver_changes(now: Checked, base: Checked | None, today: date) -> dict[str, Any]:
    """The environment's waivers added, removed and changed (same rule and where, another reason, expiry or
    approver), and those that expire within EXPIRING_DAYS of `today` (not yet expired: those fail as
    waiver-expired)."""
    env = now.context.name

    def mine(checked: Checked | None) -> dict[tuple[str, str], Waiver]:
        return {(w.rule, w.where): w for w in (checked.waivers if checked else []) if w.environment == env}

    was, is_ = mine(base), mine(now)
    changed = [{"rule": k[0], "where": k[1], "base": _waiver(was[k]), "now": _waiver(is_[k])}
               for k in is_ if k in was and _waiver(is_[k]) != _waiver(was[k])]
    expiring = [_waiver(w, today) for w in is_.values() if 0 <= (w.expires - today).days <= EXPIRING_DAYS]
    return {"added": [_waiver(w) for k, w in is_.items() if k not in was],
            "removed": [_waiver(w) for k, w in was.items() if k not in is_],
            "changed": changed, "expiring": expiring, "expiring_within_days": EXPIRING_DAYS}


def _replicas(fleet: ResolvedFleet, node: ResolvedNode) -> int | None:
    if node.sharing not in SHARED_KINDS:
        return None
    profile = fleet.profiles[node.profile]
    block = profile.mps if node.sharing == "mps" else profile.time_slicing
    return int(block.replicas) if block is not None else None


def _ratio(advertised: Mapping[str, int], units: int) -> float:
    return round(sum(advertised.values()) / units, 3) if units else 0.0


def pool_fields(fleet: ResolvedFleet, pool: ResolvedPool) -> dict[str, Any]:
    replicas = sorted({r for n in pool.nodes if (r := _replicas(fleet, n)) is not None})
    return {"cluster": pool.cluster, "profile": pool.profile, "sharing": pool.sharing,
            "gpu_model": ", ".join(sorted({n.gpu_model.name for n in pool.nodes})) or None,
            "gpus": pool.totals.physical_gpus, "replicas": replicas[0] if len(replicas) == 1 else (replicas or None),
            "hardware_units": pool.totals.hardware_units, "advertised": dict(sorted(pool.totals.advertised.items())),
            "oversubscription": pool.totals.oversubscription}


def node_fields(fleet: ResolvedFleet, node: ResolvedNode) -> dict[str, Any]:
    return {"pool": node.pool, "gpu_model": node.gpu_model.name, "gpus": node.gpus_per_node * node.count,
            "profile": node.profile, "sharing": node.sharing, "replicas": _replicas(fleet, node),
            "mig_layout": node.mig_layout, "advertised": dict(sorted(node.advertised.items())),
            "oversubscription": _ratio(node.advertised, node.hardware_units)}


def _compare(was: Mapping[str, Mapping[str, Any]], is_: Mapping[str, Mapping[str, Any]], key: str
             ) -> list[dict[str, Any]]:
    """Per object: added, removed, or changed with the fields that differ, each as {"base", "now"}."""
    out: list[dict[str, Any]] = []
    for name in [*is_, *(n for n in was if n not in is_)]:
        before, after = was.get(name), is_.get(name)
        fields = sorted(set(before or {}) | set(after or {}), key=list((after or before or {}).keys()).index)
        diff = {f: {"base": (before or {}).get(f), "now": (after or {}).get(f)} for f in fields
                if before is None or after is None or before.get(f) != after.get(f)}
        if diff:
            change = "added" if before is None else "removed" if after is None else "changed"
            out.append({key: name, "change": change, "fields": diff})
    return out


def fleet_changes(now: ResolvedFleet, base: ResolvedFleet | None) -> dict[str, Any]:
    """Per pool and per node (added, removed, changed: the fields that differ), and the environment's totals."""
    def pools(fleet: ResolvedFleet | None) -> dict[str, dict[str, Any]]:
        return {p.name: pool_fields(fleet, p) for p in fleet.pools} if fleet else {}

    def nodes(fleet: ResolvedFleet | None) -> dict[str, dict[str, Any]]:
        return {n.name: node_fields(fleet, n) for n in fleet.nodes} if fleet else {}

    def totals(fleet: ResolvedFleet | None) -> dict[str, Any]:
        if fleet is None:
            return {}
        t = fleet.totals
        return {"gpus": t.physical_gpus, "hardware_units": t.hardware_units,
                "advertised": dict(sorted(t.advertised.items())), "oversubscription": t.oversubscription}

    was, is_ = totals(base), totals(now)
    return {"totals": {f: {"base": was.get(f), "now": is_[f]} for f in is_ if was.get(f) != is_[f]},
            "pools": _compare(pools(base), pools(now), "pool"),
            "nodes": _compare(nodes(base), nodes(now), "node")}


def compare(now: Checked, revision: Revision, env: str, waivers: Path | None, today: date, offline_plan: bool
            ) -> dict[str, Any]:
    """The `base` section of `check --base REF`: `{"ref", "commit", "environment_at_base", "errors", "rules":
    {"newly_failing", "newly_passing"}, "waivers": {"added", "removed", "changed", "expiring",
    "expiring_within_days"}, "totals", "pools", "nodes"}`."""
    base, errors = check_base(revision, env, waivers, today, offline_plan)
    out: dict[str, Any] = {"ref": revision.ref, "commit": revision.commit,
                           "environment_at_base": base is not None or bool(errors), "errors": errors}
    if errors:  # the base could not be judged: nothing to compare with
        return {**out, "rules": None, "waivers": None, "totals": {}, "pools": [], "nodes": []}
    return {**out, "rules": rule_changes(now, base), "waivers": waiver_changes(now, base, today),
            **fleet_changes(now.context.fleet, base.context.fleet if base else None)}
