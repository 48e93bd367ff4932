"""`gpushare pack`'s written output: a plan turned into an environment file section (--env-out: pools with
placeholder hosts, new profiles) or, for `--fleet ENV`, the reviewed patch to an existing environment (hosts that
change profile, new profiles, pools for added GPUs)."""

from __future__ import annotations

import math
from typing import Any

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.files import yaml_text
from gpushare.core.words import counted
from gpushare.planner.model import GpuConfig
from gpushare.planner.pack import PackPlan, PlannedGpu, name_profiles

HOST_GPUS = 8  # GPUs per planned host in --env-out
PLANNED_KUBERNETES = "1.33"


def _dns(text: str, limit: int = 63) -> str:
    out = "".join(ch if ch.isalnum() else "-" for ch in text.casefold())
    while "--" in out:
        out = out.replace("--", "-")
    return out.strip("-")[:limit].rstrip("-")


def env_section(plan: PackPlan) -> dict[str, Any]:
    """Pools and new profiles as an environment file section; host names and addresses are placeholders."""
    problem = plan.problem
    section: dict[str, Any] = {}
    if problem.cluster is None:
        mps = any(g.config.kind == "mps" for g in plan.gpus)
        # The cluster's real minor is unknown here: the newest one gpushare's schemas are checked against.
        section["clusters"] = [{"name": "planned", "kind": "bare-metal", "kubernetes_version": PLANNED_KUBERNETES,
                                "mig_strategy": "mixed", "cdi": True}]
        if mps:
            section["clusters"].append({"name": "planned-mps", "kind": "bare-metal",
                                        "kubernetes_version": PLANNED_KUBERNETES, "mig_strategy": "single",
                                        "cdi": True})
    elif problem.cluster.kind != "bare-metal":
        raise GpushareError(Problem(
            f"environment {problem.environment} has no bare-metal cluster for the planned pools",
            fix="add a bare-metal cluster, or write the pools' cloud blocks by hand from `gpushare pack --json`"))
    used = {g.profile for g in plan.gpus}
    profiles = [doc for name, doc in plan.new_profiles.items() if name in used]
    if profiles:
        section["profiles"] = profiles
    pools = []
    names: set[str] = set()
    for pool in plan.pools():
        model = plan.problem.models[pool["model"]]
        base = _dns(f"plan-{model.slug}-{pool['profile'].removeprefix('plan-')}", 55)
        name, k = base, 2
        while name in names:
            name = f"{base}-{k}"
            k += 1
        names.add(name)
        if problem.cluster is not None:
            cluster = problem.cluster.name
        else:
            cluster = "planned-mps" if pool["sharing"] == "mps" else "planned"
        hosts = []
        left = pool["gpus"]
        for j in range(math.ceil(left / HOST_GPUS)):
            host = f"{name}-{j + 1:02d}"
            hosts.append({"name": host, "address": host, "gpu_count": min(HOST_GPUS, left)})
            left -= HOST_GPUS
        listed = ", ".join(pool["workloads"][:8]) + (", ..." if len(pool["workloads"]) > 8 else "")
        pools.append({
            "name": name, "cluster": cluster, "purpose": pool["purpose"], "gpu_model": model.name,
            "profile": pool["profile"],
            "description": f"{counted(pool['gpus'], 'GPU')} for {counted(pool['workload_replicas'], 'replica')} "
                           f"of {listed}",
            "hosts": hosts,
        })
    section["pools"] = pools
    return section


def env_section_yaml(plan: PackPlan, demand_file: str | None = None) -> str:
    where = f"environments/{plan.problem.environment}.yaml" if plan.problem.environment else "an environment file"
    header = [
        f"# Planned by `gpushare pack`{f' from {demand_file}' if demand_file else ''}: "
        f"{counted(plan.gpus_used, 'GPU')} (lower bound {plan.lower_bound:g}) for "
        f"{counted(plan.baseline_gpus, 'workload replica')}.",
        f"# Pools and new profiles to merge into {where}. Host names and addresses are placeholders",
        "# (gpu_count per host follows the plan): replace them with the real hosts before `gpushare validate`.",
    ]
    return "\n".join(header) + "\n" + yaml_text(env_section(plan))


# ---------------------------------------------------------------- the fleet patch (--fleet)


def _profile_for(plan: PackPlan, config: GpuConfig) -> str:
    """The sharing profile a re-planned host gets: the one the plan's GPUs of that configuration use, else an
    existing one that resolves to it, else a new `plan-*` one."""
    for gpu in plan.gpus:
        if gpu.config.key == config.key:
            return gpu.profile
    if config.profile_name is not None:
        return config.profile_name
    probe = PlannedGpu(config, [])
    extra = PackPlan(plan.problem, [probe], 0.0, 0.0, 0.0, False, False, "", 0.0, {})
    extra.new_profiles = plan.new_profiles  # shared: the new profile is the plan's
    name_profiles(extra)
    return probe.profile


def fleet_patch(plan: PackPlan) -> dict[str, Any]:
    """The reviewed change to the environment file: hosts that get another profile (each a drain), new profiles,
    and pools for GPUs added (placeholder hosts, as --env-out writes them)."""
    changes = plan.changes
    assert changes is not None
    problem = plan.problem
    hosts = [{"pool": host.pool, "host": host.name, "profile": _profile_for(plan, problem.configs[g]),
              "was": host.profile, "gpus": host.gpus} for host, g in changes.moves]
    patch: dict[str, Any] = {"hosts": hosts}
    added: list[PlannedGpu] = []
    for g, count in sorted(changes.added.items()):
        config = problem.configs[g]
        added += [PlannedGpu(config, [], _profile_for(plan, config)) for _ in range(count)]
    used = {h["profile"] for h in hosts} | {gpu.profile for gpu in added}
    profiles = [doc for name, doc in plan.new_profiles.items() if name in used]
    if profiles:
        patch["profiles"] = profiles
    if added:
        extra = PackPlan(problem, added, 0.0, 0.0, 0.0, False, False, "", 0.0, {})
        patch["pools"] = env_section(extra)["pools"]
    return patch


def fleet_patch_yaml(plan: PackPlan, demand_file: str | None = None) -> str:
    changes = plan.changes
    assert changes is not None
    env = plan.problem.environment
    header = [
        f"# Re-planned by `gpushare pack --fleet {env}`{f' from {demand_file}' if demand_file else ''}: "
        f"{counted(changes.gpus_reconfigured, 'GPU')} reconfigured on {counted(len(changes.nodes_drained), 'host')} "
        "(each drained), "
        f"{changes.gpus_added} added, {changes.gpus_freed} left idle.",
        f"# Review, then apply to environments/{env}.yaml: set each listed host's profile (add `profile:` to the "
        "host), add the profiles, and merge the pools (their hosts are placeholders).",
    ]
    return "\n".join(header) + "\n" + yaml_text(fleet_patch(plan))
