"""Capacity's third stage: the recommendations as a patch of the environment file (and new profile files) for
review, never applied. Every change kept resolves, passes the exact MIG check and adds no guardrail violation,
alone and together with the others."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare.core.errors import GpushareError
from gpushare.core.guardrails import Guardrails
from gpushare.core.mig import format_layout, layout_from_counts
from gpushare.core.paths import default_profiles_dir, find_workspace, patch_path, project_root
from gpushare.core.resolve import ResolvedFleet, ResolvedPool, resolve, resolve_env
from gpushare.core.words import counted
from gpushare.ops.capacity.recommendations import FLOAT_SLACK, Recommendation, _resource
from gpushare.ops.patch import Proposal, dump_yaml, keep_untouched_lines, roundtrip_yaml
from gpushare.policy.evaluate import evaluate
from gpushare.policy.registry import Context


def shared_description(kind: str, replicas: int, source: str) -> str:
    """A proposed profile's description, said from its own replica count: never the description of the profile it
    was made from, whose words ("Two light inference services per GPU") count that one's replicas."""
    if kind == "mps":
        what = (f"{replicas} MPS clients per GPU, each limited to 1/{replicas} of its memory and SMs. "
                "Memory-partitioned, not fault-isolated: one client's fatal error can take down the others.")
    elif kind == "mig-time-slicing":
        what = (f"{replicas} pods take turns on each MIG instance. Pods sharing one instance are not isolated from "
                "each other; trusted tenants only.")
    else:
        what = f"{replicas} pods take turns on each GPU. No memory or fault isolation: trusted tenants only."
    return f"{what} Proposed by gpushare capacity from {source}."


def _profile_for_replicas(fleet: ResolvedFleet, guardrails: Guardrails, pool: ResolvedPool, replicas: int,
                          new_profiles: dict[str, dict[str, Any]]) -> tuple[str | None, str]:
    """An existing profile like the pool's with `replicas`, or a new one where the environment allows any."""
    import re

    limits = guardrails.environment(fleet.environment)
    current = fleet.profiles[pool.profile]
    if replicas == 1:
        found = [n for n, p in fleet.profiles.items() if p.kind == "exclusive" and limits.allows_profile(n)]
        return (found[0], "") if found else (None, "no allowed exclusive profile")
    block = "mps" if current.kind == "mps" else "time_slicing"
    want = getattr(current, block).model_copy(update={"replicas": replicas})
    for name, profile in sorted(fleet.profiles.items()):
        if profile.kind == current.kind and getattr(profile, block) == want and limits.allows_profile(name):
            return name, ""
    if "*" not in limits.allowed_profiles:
        return None, (f"no allowed {current.kind} profile with {replicas} replicas in {fleet.environment}: prove one "
                      "in the promotion source first")
    data = current.model_dump(mode="json", exclude_defaults=True)
    data.update({block: {**data.get(block, {}), "replicas": replicas}})
    data["description"] = shared_description(current.kind, replicas, f"{current.name} "
                                             f"({getattr(current, block).replicas} replicas)")
    for name, made in new_profiles.items():  # another pool of this patch already proposes the same profile
        if {**made, "name": ""} == {**data, "name": ""}:
            return name, ""
    name = _new_profile_name(fleet, re.sub(r"\d+$", str(replicas), current.name) if re.search(r"\d+$", current.name)
                             else f"{current.name}-{replicas}", new_profiles)
    new_profiles[name] = {**data, "name": name}
    return name, ""


def _dropped(rec: Recommendation) -> set[str]:
    """MIG resources a pool stops advertising under its recommendation."""
    if rec.mig_layout_proposed is None:
        return set()
    return {_resource(p, rec.mig_resource_suffix) for p in rec.mig_layout_now or {} if p not in rec.mig_layout_proposed}


def _edit_pool(fleet: ResolvedFleet, guardrails: Guardrails, doc: Any, rec: Recommendation, pool: ResolvedPool,
               new_profiles: dict[str, dict[str, Any]]) -> tuple[str | None, list[str], int, bool]:
    """Apply one pool's recommendation (not its tenants' quotas) to the round-trip document: (why not or None, notes,
    the pool's GPUs as the document now says, whether the document really changed)."""
    limits = guardrails.environment(fleet.environment)
    entry = next(p for p in doc["pools"] if p["name"] == pool.name)
    notes: list[str] = []
    gpus = rec.gpus_now
    edited = False
    if rec.replicas_proposed is not None and rec.replicas_proposed != rec.replicas_now:
        name, why = _profile_for_replicas(fleet, guardrails, pool, rec.replicas_proposed, new_profiles)
        if name is None:
            return why, notes, gpus, edited
        entry["profile"], edited = name, True
    if rec.mig_layout_proposed is not None:
        if "*" not in limits.allowed_profiles:
            return (f"a new MIG layout needs a new profile, which {fleet.environment} allows only after its promotion "
                    "source runs it"), notes, gpus, edited
        model = pool.nodes[0].gpu_model
        name = _new_profile_name(fleet, f"{pool.name}-mig"[:30].rstrip("-"), new_profiles)
        new_profiles[name] = {"name": name, "kind": pool.sharing,
                              "description": f"Layout proposed by gpushare capacity for pool {pool.name}.",
                              "mig": {"layouts": {model.name: format_layout(layout_from_counts(
                                  rec.mig_layout_proposed))}}}
        if pool.sharing == "mig-time-slicing":  # the same replicas per instance: never more for memory-bound work
            new_profiles[name]["time_slicing"] = fleet.profiles[pool.profile].time_slicing.model_dump(mode="json")
        entry["profile"], edited = name, True
    if rec.gpus_proposed is not None and rec.gpus_proposed != rec.gpus_now:
        gpus, resized = _resize(pool, entry, rec, notes)
        edited = edited or resized
    return None, notes, gpus, edited


def _resize(pool: ResolvedPool, entry: Any, rec: Recommendation, notes: list[str]) -> tuple[int, bool]:
    """Resize the pool's entry toward rec.gpus_proposed: (the GPUs it now has, whether the entry changed)."""
    assert rec.gpus_proposed is not None
    if pool.cloud is not None:
        per_node = pool.cloud.gpus_per_node
        nodes = max(math.ceil(rec.gpus_proposed / per_node), pool.cloud.min_node_count or 0)
        if pool.cloud.max_node_count:
            nodes = min(nodes, pool.cloud.max_node_count)
        if nodes * per_node != rec.gpus_proposed:
            notes.append(f"{counted(nodes, 'node')} of {counted(per_node, 'GPU')} (the pool's node counts and whole "
                         f"nodes): {counted(nodes * per_node, 'GPU')} rather than {rec.gpus_proposed}")
        changed = entry["cloud"].get("node_count") != nodes
        entry["cloud"]["node_count"] = nodes
        return nodes * per_node, changed
    if rec.gpus_proposed > rec.gpus_now:
        notes.append("bare-metal pools grow by adding hosts: add hosts with "
                     f"{counted(rec.gpus_proposed - rec.gpus_now, 'GPU')} in all to the environment")
        return rec.gpus_now, False
    hosts, gpus = entry["hosts"], rec.gpus_now
    freed = rec.gpus_now - rec.gpus_proposed
    while len(hosts) > 1 and hosts[-1]["gpu_count"] <= freed:
        freed -= hosts[-1]["gpu_count"]
        gpus -= hosts[-1]["gpu_count"]
        notes.append(f"host {hosts[-1]['name']} leaves the pool ({counted(hosts[-1]['gpu_count'], 'GPU')} freed)")
        del hosts[-1]
    if freed:
        notes.append(f"{freed} more GPU(s) could go, but only whole hosts leave a bare-metal pool")
    return gpus, gpus != rec.gpus_now


def _new_profile_name(fleet: ResolvedFleet, stem: str, new_profiles: dict[str, dict[str, Any]]) -> str:
    """A profile name (and file name) that no profile in the fleet or its profiles folder, nor this patch, uses yet."""
    folder = default_profiles_dir(fleet.source.resolve())
    taken = set(fleet.profiles) | set(new_profiles) | {p.stem for p in folder.glob("*.yaml")}
    name, n = stem, 1
    while name in taken:
        n += 1
        name = f"{stem[:27].rstrip('-')}-{n}"
    return name


def _move_quotas(fleet: ResolvedFleet, doc: Any, applied: list[Recommendation]) -> None:
    """Tenants' quotas on a MIG resource that no pool of their clusters advertises any more (after every applied
    change) move to the smaller instances that replace it, in proportion to the instances each pool replaced."""
    by_pool = {rc.pool: rc for rc in applied}
    for tenant in doc.get("tenants", []):
        clusters = set(tenant.get("clusters") or fleet.clusters)
        pools = [p for p in fleet.pools if p.cluster in clusters]

        def still(res: str, pools: list[ResolvedPool] = pools) -> bool:
            return any(res in p.totals.advertised and res not in _dropped(by_pool[p.name]) if p.name in by_pool
                       else res in p.totals.advertised for p in pools)

        for key in ("quota", "borrowing_limit"):
            quota = tenant.get(key) or {}
            added: dict[str, float] = {}
            for old_res in [k for k in list(quota) if k.startswith("nvidia.com/mig-") and not still(k)]:
                moves = [((_resource(rc.mig_replacements[old][0], rc.mig_resource_suffix), rc.mig_replacements[old][1]),
                          (rc.mig_layout_now or {}).get(old, 0) * n)
                         for rc in applied if fleet.pool(rc.pool).cluster in clusters
                         for old in rc.mig_replacements if _resource(old, rc.mig_resource_suffix) == old_res
                         for n in [fleet.pool(rc.pool).totals.physical_gpus]]
                if not moves:
                    continue
                total, amount = sum(w for _, w in moves) or 1, quota.pop(old_res)
                for (new_res, factor), weight in moves:
                    added[new_res] = added.get(new_res, 0.0) + amount * factor * weight / total
            for new_res, amount in added.items():
                quota[new_res] = quota.get(new_res, 0) + math.ceil(amount - FLOAT_SLACK)


def _groups(fleet: ResolvedFleet, recs: list[Recommendation]) -> list[list[Recommendation]]:
    """Changes that must move together: pools of one cluster that stop advertising the same MIG resource (the
    quotas on it move only when all of them do). Every other change is a group of its own."""
    groups: list[list[Recommendation]] = []
    for rc in recs:
        key = {(fleet.pool(rc.pool).cluster, res) for res in _dropped(rc)}
        joined = [g for g in groups if key & {(fleet.pool(o.pool).cluster, res) for o in g for res in _dropped(o)}]
        merged = [rc] + [o for g in joined for o in g]
        groups = [g for g in groups if g not in joined] + [sorted(merged, key=recs.index)]
    return sorted(groups, key=lambda g: recs.index(g[0]))


def relieves(rc: Recommendation) -> bool:
    """The change gives work that waits or saturates more: GPUs, larger MIG instances, fewer replicas per GPU."""
    return (rc.mig_grows or (rc.gpus_proposed or 0) > rc.gpus_now
            or (rc.replicas_proposed or 0) < (rc.replicas_now or 0))


def _value_first(group: list[Recommendation], freed: int) -> tuple[bool, float]:
    """The order groups are combined in, most value first: relief for pools that queue or saturate (longest waits
    first) before savings (most GPUs the patch frees first: whole hosts only on bare metal). A later group that breaks
    the combination is the one withheld."""
    relief = any(relieves(rc) for rc in group)
    return not relief, -max(rc.pressure for rc in group) if relief else -freed


@dataclass
class _Attempt:
    text: str
    new_profiles: dict[str, dict[str, Any]]
    notes: dict[str, list[str]]
    gpus: dict[str, int]
    why: dict[str, str]  # pool -> why its group cannot be applied (empty: the whole attempt holds)
    edited: dict[str, bool] = field(default_factory=dict)  # pool -> whether its edit changes the files


def propose(fleet: ResolvedFleet, guardrails: Guardrails, recs: list[Recommendation]) -> Proposal:
    """The environment change as files (never written over the originals). Each pool's change (or group of changes
    that must move together) is checked alone, then the groups that hold alone are combined one at a time, and a
    group that breaks the combination is withheld with its reason: every change kept resolves (the exact MIG check
    included) and adds no guardrail violation, alone and together."""
    import tempfile
    from datetime import date

    source = fleet.source.resolve()
    root = find_workspace(source.parent) or project_root()  # the profiles' paths too are named from there
    rel_env = patch_path(source, root)
    profiles_dir = default_profiles_dir(source)
    rel_profiles = patch_path(profiles_dir, root)
    original = source.read_text()
    limits = guardrails.environment(fleet.environment)
    promotion = resolve_env(limits.promote_from) if limits.promote_from else None

    def violations(candidate: ResolvedFleet) -> set[tuple[str, str]]:
        ctx = Context(fleet=candidate, guardrails=guardrails, promotion_source=promotion)
        report = evaluate(ctx, [], date.today())
        return {(v.rule, v.message) for v in report.violations if v.level == "mandatory"}

    baseline = violations(fleet)

    def attempt(groups: list[list[Recommendation]]) -> _Attempt:
        y = roundtrip_yaml()
        doc = y.load(original)
        out = _Attempt("", {}, {}, {}, {})
        applied = []
        for group in groups:
            for rc in group:
                why, out.notes[rc.pool], out.gpus[rc.pool], out.edited[rc.pool] = _edit_pool(
                    fleet, guardrails, doc, rc, fleet.pool(rc.pool), out.new_profiles)
                if why:
                    out.why.update({o.pool: why if o is rc else f"moves together with pool {rc.pool}: {why}"
                                    for o in group})
            applied += group
        if out.why:
            return out
        _move_quotas(fleet, doc, applied)
        out.text = keep_untouched_lines(original, dump_yaml(y, y.load(original)), dump_yaml(y, doc))
        with tempfile.TemporaryDirectory(prefix="gpushare-capacity-") as tmp:
            tmp_profiles = Path(tmp) / "profiles"
            tmp_profiles.mkdir()
            for path in profiles_dir.glob("*.yaml"):
                (tmp_profiles / path.name).write_text(path.read_text())
            for name, data in out.new_profiles.items():
                (tmp_profiles / f"{name}.yaml").write_text(dump_yaml(roundtrip_yaml(), data))
            env_file = Path(tmp) / "environments" / source.name
            env_file.parent.mkdir()
            env_file.write_text(out.text)
            try:
                candidate = resolve(env_file, tmp_profiles)
            except GpushareError as err:
                # Name the files as the reviewer knows them, never the temporary copies.
                text = str(err.problems[0]).replace(str(env_file), rel_env).replace(str(tmp_profiles), rel_profiles)
                out.why = {rc.pool: f"the change does not resolve: {text}" for rc in applied}
                return out
        added = violations(candidate) - baseline
        if added:
            why = "guardrails: " + "; ".join(f"{rule}: {m}" for rule, m in sorted(added))
            out.why = {rc.pool: why for rc in applied}
        return out

    proposal = Proposal()
    candidates = []
    for rc in (rc for rc in recs if rc.changes and not rc.gaps):
        why, notes, _, edited = _edit_pool(fleet, guardrails, roundtrip_yaml().load(original), rc, fleet.pool(rc.pool),
                                           {})
        if edited or why:
            candidates.append(rc)
        else:  # nothing to write: a bare-metal pool that should grow, or shrink by less than a host
            proposal.withheld[rc.pool] = "; ".join(notes) or "the change leaves the files as they are"
    alone = []
    for group in _groups(fleet, candidates):
        tried = attempt([group])
        proposal.withheld.update(tried.why)
        if not tried.why:
            alone.append((_value_first(group, sum(rc.gpus_now - tried.gpus[rc.pool] for rc in group)), group))
    kept: list[list[Recommendation]] = []
    for _, group in sorted(alone, key=lambda pair: pair[0]):
        tried = attempt(kept + [group])
        if tried.why:
            others = ", ".join(rc.pool for g in kept for rc in g)
            proposal.withheld.update({rc.pool: f"holds alone but not together with {others}: {tried.why[rc.pool]}"
                                      for rc in group})
        else:
            kept.append(group)
    if kept:
        final = attempt(kept)
        proposal.applied = [rc.pool for g in kept for rc in g]
        if final.text != original:
            proposal.files[rel_env] = (original, final.text)
        for name, data in final.new_profiles.items():
            proposal.files[f"{rel_profiles}/{name}.yaml"] = (None, dump_yaml(roundtrip_yaml(), data))
        for g in kept:
            for rc in g:
                rc.notes += final.notes[rc.pool]
                if rc.gpus_proposed is not None:
                    rc.gpus_proposed = final.gpus[rc.pool]  # what the patch writes: whole hosts, node count limits
    return proposal
