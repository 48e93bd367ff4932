"""Rules over the resolved fleet's sharing: the environment judged is the one named, oversubscription and replicas
stay within the environment's limits, only allowed profiles run, shared replicas are renamed and refuse requests
above one, and MIG runs only where its placements are exact."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from gpushare.core.resolve import environment_stem
from gpushare.policy.registry import Context, Finding, rule, shared_nodes, shared_replicas


@rule("environment-identity", "mandatory",
      "The environment checked is the one the CLI or the Pulumi stack names: the file it loads is named after it "
      "and says the same `name:`, so no environment is judged by another's limits; the stack that deploys it "
      "deploys that same file.",
      "point the stack's gpushare:environment at environments/<stack>.yaml, and keep each file's name: equal to its "
      "file name")
def _identity(ctx: Context) -> Iterator[Finding]:
    fleet = ctx.fleet
    if fleet.environment != ctx.name:
        yield (f"environment {ctx.name}",
               f"{ctx.name} loads {fleet.source}, which is environment {fleet.environment!r}; it is judged with "
               f"{ctx.name}'s limits")
    stem = environment_stem(Path(fleet.source))
    if stem != fleet.environment:
        yield (f"environment {ctx.name}",
               f"{fleet.source} says name: {fleet.environment!r} but its file name says {stem!r}")
    if ctx.deployed is not None and ctx.deployed.resolve() != Path(fleet.source).resolve():
        yield (f"environment {ctx.name}",
               f"Pulumi.{ctx.name}.yaml deploys {ctx.deployed}, but the file judged here is {fleet.source}: "
               "what passes this check is not what `pulumi up` applies")


@rule("oversubscription-limit", "mandatory",
      "The environment-wide oversubscription ratio (schedulable GPU resources / hardware units) stays within "
      "the environment's limit.",
      "lower time-slicing or MPS replicas, or raise max_oversubscription in policies/guardrails.yaml with "
      "utilization evidence from `gpushare capacity`")
def _oversubscription(ctx: Context) -> Iterator[Finding]:
    limit = ctx.limits.max_oversubscription
    t = ctx.fleet.totals
    if t.oversubscription > limit:
        shared = sorted({p.name for p in ctx.fleet.pools if p.totals.oversubscription > 1})
        yield (f"environment {ctx.name}",
               f"oversubscription {t.oversubscription:.2f} ({t.advertised_total} schedulable / {t.hardware_units} "
               f"hardware units) is above the limit {limit:.2f}; shared pools: {', '.join(shared)}")


@rule("shared-replicas-limit", "mandatory",
      "Time-slicing and MPS replicas per shared unit stay within the limit for the unit's memory class.",
      "lower the profile's replicas, or move the pool to GPUs (or MIG instances) of a larger memory class")
def _replicas_limit(ctx: Context) -> Iterator[Finding]:
    seen: set[tuple[str, str]] = set()
    for node in shared_nodes(ctx.fleet):
        replicas = shared_replicas(ctx.fleet, node)
        units = ([(node.gpu_model.name, node.gpu_model.memory_gib)] if node.mig_layout is None else
                 [(f"{node.gpu_model.name} {p}", node.gpu_model.profiles[p].memory_gib or 0.0)
                  for p in node.mig_layout])
        for unit, memory in units:
            cls = ctx.guardrails.memory_class(memory)
            limit = ctx.limits.max_shared_replicas[cls]
            if replicas > limit and (node.pool, unit) not in seen:
                seen.add((node.pool, unit))
                yield (f"pool {node.pool}",
                       f"profile {node.profile} shares each {unit} ({memory:g} GiB, class {cls}) {replicas} ways; "
                       f"{ctx.name} allows {limit}")


@rule("profile-allowed", "mandatory",
      "Pools use only the sharing profiles the environment allows.",
      "use an allowed profile, or add it to allowed_profiles in policies/guardrails.yaml after review")
def _profile_allowed(ctx: Context) -> Iterator[Finding]:
    for node in ctx.fleet.nodes:
        if not ctx.limits.allows_profile(node.profile):
            yield (f"pool {node.pool}" + ("" if node.count != 1 or node.address is None else f", host {node.name}"),
                   f"profile {node.profile} is not allowed in {ctx.name} "
                   f"(allowed: {', '.join(ctx.limits.allowed_profiles)})")


@rule("shared-replicas-renamed", "mandatory",
      "Wherever GPU replicas are shared through the device plugin, they are advertised as <resource>.shared "
      "(renameByDefault), so quotas and admission can tell them from exclusive GPUs.",
      "set rename_by_default: true in the profile's time_slicing or mps block")
def _renamed(ctx: Context) -> Iterator[Finding]:
    done: set[str] = set()
    for node in shared_nodes(ctx.fleet):
        if node.managed_by == "gke" or node.profile in done:
            continue  # GKE's own plugin cannot rename; its pools are tainted instead
        profile = ctx.fleet.profiles[node.profile]
        block = profile.mps if node.sharing == "mps" else profile.time_slicing
        if not block.rename_by_default:
            done.add(node.profile)
            yield f"profile {node.profile}", f"profile {node.profile} (pool {node.pool}) shares replicas without " \
                                             "rename_by_default: they are advertised as nvidia.com/gpu"


@rule("fail-requests-greater-than-one", "mandatory",
      "Where the environment requires it, time-slicing refuses pods asking for more than one replica (they would "
      "get no more compute, only starve others).",
      "set fail_requests_greater_than_one: true in the profile's time_slicing block")
def _fail_requests(ctx: Context) -> Iterator[Finding]:
    if not ctx.limits.require_fail_requests_greater_than_one:
        return
    done: set[str] = set()
    for node in shared_nodes(ctx.fleet):
        if node.sharing == "mps" or node.profile in done:
            continue
        if not ctx.fleet.profiles[node.profile].time_slicing.fail_requests_greater_than_one:
            done.add(node.profile)
            yield f"profile {node.profile}", f"time-slicing profile {node.profile} (pool {node.pool}) allows " \
                                             f"requests above one replica in {ctx.name}"


@rule("exact-mig-placements", "mandatory",
      "Where the environment requires it, MIG layouts run only on GPU models whose placements in the catalog "
      "come from real driver output (placement_confidence exact), unless waived.",
      "confirm the model's placements with scripts/gpu_check.py on a real GPU, or waive with a reason and expiry")
def _exact_placements(ctx: Context) -> Iterator[Finding]:
    if not ctx.limits.require_exact_mig_placements:
        return
    seen: set[tuple[str, str]] = set()
    for node in ctx.fleet.nodes:
        model = node.gpu_model
        if node.mig_layout and not model.placements_exact and (node.pool, model.name) not in seen:
            seen.add((node.pool, model.name))
            yield (f"pool {node.pool}",
                   f"MIG on {model.name}, whose placements are {model.placement_confidence} in the catalog")
