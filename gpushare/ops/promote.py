"""`gpushare promote --from pilot --to prod`: carry the source environment's settings over to the target as a patch,
and refuse until the source's Prometheus shows that they ran long enough and well.

The proposal is the target file with the source's pool profiles (same-named pools of the same GPU model), pool-level
driver branches, defaults.driver_branch and defaults.toolkit_version. What the proposed target would run is the
list of items every gate is about; each item has a name that is the same in every environment for the same content:
- a profile: its content-hashed device-plugin config name (node label nvidia.com/device-plugin.config), or on
  GKE-managed pools, which have none, the gpushare.io/profile label;
- a MIG layout: its content-hashed mig-parted config name (gpushare.io/mig-config on Ansible hosts,
  nvidia.com/mig.config on operator-managed pools), in state success;
- a driver branch per GPU model: dcgm-exporter's DCGM_FI_DRIVER_VERSION and modelName labels;
- the toolkit version: gpushare.io/toolkit-version, which Ansible sets after its toolkit role installed it.

Gates (thresholds in policies/guardrails.yaml `promotion:`), all on the source environment's nodes (kube_node_labels
with gpushare.io/environment):
- run-time: each item ran without a gap for min_days, ending at `at` (a range query over 2 x min_days);
- xid, ecc, mig-reconfiguration: no new XID (except ignored_xids), no uncorrectable ECC error or failed row remap,
  no failed MIG reconfiguration over the last min_days;
- utilization-uplift: the shared pools' mean GPU utilization, weighted by GPUs, over utilization_baseline;
- queue-wait-p95: the p95 Kueue admission wait of the source's tenant queues;
- guardrails: the proposed target passes the mandatory policy rules (with waivers), as `gpushare check` does.
Missing data is no evidence, and no evidence fails. Nothing is applied and environments/ is never written."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from gpushare.core.coverage import coverage_gaps, duration_text, gaps_text, utc
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.guardrails import Guardrails, duration_seconds, guardrails_path
from gpushare.core.labels import (
    DEVICE_PLUGIN_CONFIG_LABEL,
    MIG_CONFIG_LABEL,
    MIG_STATE_LABEL,
    OPERATOR_MIG_CONFIG_LABEL,
    TOOLKIT_VERSION_LABEL,
)
from gpushare.core.paths import default_profiles_dir, patch_path
from gpushare.core.resolve import ResolvedFleet, ResolvedNode, ResolvedPool, resolve
from gpushare.ops.patch import Proposal, dump_yaml, roundtrip_yaml
from gpushare.ops.prometheus import Prometheus, finite_times
from gpushare.policy.evaluate import evaluate
from gpushare.policy.registry import Context
from gpushare.policy.waivers import load_waivers
from gpushare.render.monitoring import expressions as r
from gpushare.render.monitoring.promql import HOST_LABEL, HOST_LABELS, alternatives, dcgm_host, ksm_label

DAY = 86400


@dataclass
class Gate:
    gate: str
    item: str
    measured: str
    required: str
    passed: bool
    detail: str = ""
    applies: bool = True  # False: nothing can be measured for this item, and that is not a failure (said in detail)

    def as_dict(self) -> dict[str, Any]:
        return {"gate": self.gate, "item": self.item, "measured": self.measured, "required": self.required,
                "passed": self.passed, "detail": self.detail}


@dataclass
class Change:
    path: str
    old: Any
    new: Any

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "from": self.old, "to": self.new}


@dataclass
class Promotion:
    source: ResolvedFleet
    target: ResolvedFleet
    candidate: ResolvedFleet  # the target as the patch would make it
    candidate_file: Path  # a temporary copy; never the target's own file
    changes: list[Change] = field(default_factory=list)
    proposal: Proposal = field(default_factory=Proposal)


# ---------------------------------------------------------------- which promotions exist


def check_promotion(guardrails: Guardrails, source: str, target: str) -> None:
    """`--to` must name `--from` as its promote_from in policies/guardrails.yaml."""
    file = str(guardrails_path())
    if target not in guardrails.environments:
        raise GpushareError(Problem(f"no environment {target!r} in the guardrails", file=file,
                                    path=f"environments.{target}",
                                    fix=f"use one of: {', '.join(guardrails.environments)}"), exit_code=2)
    if source == target:
        raise GpushareError(Problem(f"--from and --to both name {target}", fix="promote from one environment to "
                                    "another, e.g. --from pilot --to prod"), exit_code=2)
    if source not in guardrails.environments:
        raise GpushareError(Problem(f"no environment {source!r} in the guardrails", file=file,
                                    path=f"environments.{source}",
                                    fix=f"use one of: {', '.join(guardrails.environments)}"), exit_code=2)
    declared = guardrails.environments[target].promote_from
    if declared != source:
        sources = [t for t, g in guardrails.environments.items() if g.promote_from == source]
        fix = (f"promote {source} to {', '.join(sources)}" if sources else
               f"set environments.{target}.promote_from: {source} if {target} should take {source}'s settings")
        what = f"promote_from is {declared}" if declared else "has no promote_from"
        raise GpushareError(Problem(f"{target} {what}, so it is not promoted from {source}", file=file,
                                    path=f"environments.{target}.promote_from", fix=fix), exit_code=2)


# ---------------------------------------------------------------- the proposal


def _models(pool: ResolvedPool) -> set[str]:
    return {n.gpu_model.name for n in pool.nodes}


def propose(source: ResolvedFleet, target: ResolvedFleet, workdir: Path) -> Promotion:
    """The target file with the source's settings carried over (round-trip YAML, comments kept), resolved from a copy
    under `workdir`; the target's own file is only read."""
    y = roundtrip_yaml()
    original = target.source.read_text()
    doc = y.load(original)
    changes: list[Change] = []

    def carry(container: Any, key: str, new: Any, path: str) -> None:
        old = container.get(key)
        if old == new:
            return
        if new is None:
            del container[key]
        else:
            container[key] = new
        changes.append(Change(path, old, new))

    source_pools = {p.name: p for p in source.pools}
    source_specs = {p.name: p for p in source.env.pools}
    for entry in doc.get("pools") or []:
        theirs = source_pools.get(entry["name"])
        ours = next((p for p in target.pools if p.name == entry["name"]), None)
        if theirs is None or ours is None or _models(theirs) != _models(ours):
            continue
        carry(entry, "profile", theirs.profile, f"pools.{entry['name']}.profile")
        spec = source_specs[entry["name"]]
        if entry.get("cloud") is not None and spec.cloud is not None:
            carry(entry["cloud"], "driver_branch", spec.cloud.driver_branch,
                  f"pools.{entry['name']}.cloud.driver_branch")
    defaults = doc["defaults"]
    carry(defaults, "driver_branch", source.env.defaults.driver_branch, "defaults.driver_branch")
    carry(defaults, "toolkit_version", source.env.defaults.toolkit_version, "defaults.toolkit_version")

    text = dump_yaml(y, doc) if changes else original
    candidate_file = workdir / "environments" / target.source.name
    candidate_file.parent.mkdir(parents=True, exist_ok=True)
    candidate_file.write_text(text)
    try:
        candidate = resolve(candidate_file, default_profiles_dir(target.source))
    except GpushareError as err:
        raise GpushareError([Problem(f"the proposed {target.environment} (with {source.environment}'s settings) does "
                                     f"not resolve: {p.message}", path=p.path, fix=p.fix) for p in err.problems]
                            ) from None
    proposal = Proposal()
    if changes:
        proposal.files[patch_path(target.source)] = (original, text)
    return Promotion(source, target, candidate, candidate_file, changes, proposal)


# ---------------------------------------------------------------- what the target would run


@dataclass(frozen=True)
class Item:
    kind: str  # profile, MIG layout, driver branch, toolkit version
    name: str
    pools: tuple[str, ...]
    expr: str | None  # present (any value) at a step while the source runs the item; None: nothing to measure
    note: str = ""

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name}\n(pools: {', '.join(self.pools)})"


def _q(value: str) -> str:
    return json.dumps(value)  # a PromQL double-quoted string


def _env_matcher(environment: str) -> str:
    return f"{ksm_label(r.ENVIRONMENT_LABEL)}={_q(environment)}"


def _labelled(environment: str, step: str, *matchers: str) -> str:
    return f"max_over_time(kube_node_labels{{{', '.join([_env_matcher(environment), *matchers])}}}[{step}])"


def items(candidate: ResolvedFleet, source: str, step: str) -> list[Item]:
    """Every profile, MIG layout, driver branch per GPU model and toolkit version the proposed target runs, with the
    series that shows the source running it (kube_node_labels and DCGM of the source's nodes)."""
    found: dict[tuple[str, str], tuple[list[str], str | None, str]] = {}

    def add(kind: str, name: str, pool: str, expr: str | None, note: str = "") -> None:
        pools, _, _ = found.setdefault((kind, name), ([], expr, note))
        if pool not in pools:
            pools.append(pool)

    def label(key: str, value: str) -> str:
        return f"{ksm_label(key)}={_q(value)}"

    nodes = candidate.nodes
    for n in nodes:
        if n.device_plugin_config:
            add("profile", f"{n.profile} ({n.device_plugin_config})", n.pool,
                f"max({_labelled(source, step, label(DEVICE_PLUGIN_CONFIG_LABEL, n.device_plugin_config))})")
        else:  # GKE's own plugin: the profile compiles to the node pool's sharing config
            add("profile", n.profile, n.pool,
                f"max({_labelled(source, step, label(r.PROFILE_LABEL, n.profile))})")
    for n in nodes:
        if n.mig_config and n.mig_config in candidate.mig_configs:
            ansible = _labelled(source, step, label(MIG_CONFIG_LABEL, n.mig_config), label(MIG_STATE_LABEL, "success"))
            operator = _labelled(source, step, label(OPERATOR_MIG_CONFIG_LABEL, n.mig_config),
                                 label(r.OPERATOR_MIG_STATE_LABEL, "success"))
            add("MIG layout", n.mig_config, n.pool, f"max({ansible} or {operator})")
    measured_drivers = {(n.gpu_model.name, n.driver_branch) for n in nodes if n.managed_by != "gke"}
    for n in nodes:
        name = f"R{n.driver_branch} on {n.gpu_model.name}"
        if n.managed_by == "gke" and (n.gpu_model.name, n.driver_branch) not in measured_drivers:
            add("driver branch", name, n.pool, None,
                "GKE installs the driver on GKE-managed pools (the stack's driver_version) and runs no dcgm-exporter "
                "there: no evidence exists, and the branch is not gpushare's to promote")
            continue
        if n.managed_by == "gke":
            continue
        dcgm = (f"max by ({HOST_LABELS}) (max_over_time(DCGM_FI_DEV_GPU_TEMP{{DCGM_FI_DRIVER_VERSION=~"
                f"{_q(f'{n.driver_branch}[.].*')}, modelName={_q(n.gpu_model.name)}}}[{step}]))")
        expr = f"max(\n  {r.to_node(dcgm)}\n  and on (node) max by (node) ({_labelled(source, step)})\n)"
        add("driver branch", name, n.pool, expr)
    version = candidate.env.defaults.toolkit_version
    hosts = [n for n in nodes if n.managed_by == "ansible"]
    others = sorted({n.pool for n in nodes if n.managed_by != "ansible"})
    elsewhere = (f"; pools {', '.join(others)} (GPU Operator or GKE) bring their own toolkit and show no version"
                 if others else "")
    if hosts:
        expr = f"max({_labelled(source, step, label(TOOLKIT_VERSION_LABEL, version))})"
        for n in hosts:
            add("toolkit version", version, n.pool, expr, f"Ansible-managed hosts{elsewhere}")
    else:
        for pool in others:
            add("toolkit version", version, pool, None,
                f"no Ansible-managed hosts in {candidate.environment}: its GPU Operator or GKE pools bring their own "
                "toolkit, so there is no toolkit evidence and none is needed")
    return [Item(kind, name, tuple(pools), expr, note) for (kind, name), (pools, expr, note) in found.items()]


# ---------------------------------------------------------------- run time

# Samples more than this many steps apart have a missing one between them, which ends a continuous run.
GAP_STEPS = 1.5


def continuous_run(times: list[float], at: float, step: int) -> tuple[float, float | None]:
    """(seconds the series has been present without a gap of more than one step up to `at`, when the run started);
    (0, None) where it is not present at `at`."""
    present = sorted(times)
    if not present or at - present[-1] > step / 2:
        return 0.0, None
    first = present[-1]
    for t in reversed(present[:-1]):
        if first - t > step * GAP_STEPS:
            break
        first = t
    return at - first, first


def _days(seconds: float) -> str:
    """A run time in days; under a day in the unit that reads best (never "0.0 d")."""
    return f"{seconds / DAY:.1f} d" if seconds >= DAY or seconds <= 0 else duration_text(seconds)


def run_time_gates(prom: Prometheus, found: list[Item], guardrails: Guardrails, at: float) -> list[Gate]:
    policy = guardrails.promotion
    step = duration_seconds(policy.step)
    points = math.ceil(2 * policy.min_days * DAY / step)
    start = at - points * step
    required = f">= {policy.min_days} d"
    gates = []
    for item in found:
        if item.expr is None:
            gates.append(Gate("run-time", item.label, "-", required, True, item.note, applies=False))
            continue
        found_times = finite_times(prom, f"run time of {item.kind} {item.name}", item.expr, start, at, step)
        times = sorted({t for ts in found_times.values() for t in ts})
        run, since = continuous_run(times, at, step)
        measured = _days(run) + (" or more" if since is not None and since - start < step / 2 else "")
        if since is None:
            detail = ("no evidence: not running on any source node at --at" if not times else
                      f"stopped running {_days(at - max(times))} before --at")
        else:
            detail = f"running without a gap since {utc(since)}"
        if item.note:
            detail += f" ({item.note})"
        gates.append(Gate("run-time", item.label, measured, required, run >= policy.min_days * DAY - step / 2,
                          detail))
    return gates


# ---------------------------------------------------------------- health of the source over the window


def _dcgm_pools(source: ResolvedFleet) -> list[ResolvedPool]:
    """Pools whose GPUs export DCGM (GKE-managed pools run no dcgm-exporter)."""
    return [p for p in source.pools if any(n.managed_by != "gke" for n in p.nodes)]


def _expected_nodes(pool: ResolvedPool, which: list[ResolvedNode]) -> int:
    if pool.cloud is not None:
        return max(1, min(pool.cloud.node_count, pool.cloud.min_node_count or pool.cloud.node_count)) if which else 0
    return sum(n.count for n in which)


class _Window:
    """PromQL pieces over the source environment's nodes and the window [at - min_days, at]."""

    def __init__(self, source: ResolvedFleet, guardrails: Guardrails, at: float) -> None:
        self.source = source
        self.at = at
        self.window = f"{guardrails.promotion.min_days}d"
        self.step = guardrails.promotion.step
        self.nodes = f"max by (node) ({_labelled(source.environment, self.window)})"
        pools = r.node_pool_expr(_env_matcher(source.environment))
        self.node_pool = f"max_over_time(({pools})[{self.window}:{self.step}])"

    def on_nodes(self, expr: str) -> str:
        """A DCGM expression keyed by hostname (or the older exporters' Hostname), kept on the source's nodes."""
        return f"(\n  {r.to_node(expr)}\n) and on (node) {self.nodes}"

    def reporting(self, prom: Prometheus, name: str, by_node: str, expected: dict[str, int],
                  min_coverage: float) -> list[str]:
        """The gaps in the evidence: pools with fewer nodes than expected, and nodes that reported in less than
        min_coverage of the window's steps (each gap named with its dates). `by_node` is keyed by node and asks
        whether the node reported within one step."""
        step = duration_seconds(self.step)
        points = duration_seconds(self.window) // step
        start = self.at - (points - 1) * step
        pools = {str(s["metric"].get("node")): str(s["metric"].get("pool"))
                 for s in prom.query("nodes of the source", f"max by (node, pool) ({self.node_pool})", self.at)}
        times: dict[str, dict[str, list[float]]] = {}
        reported = finite_times(prom, f"{name} coverage", f"max by (node) (\n  {by_node}\n)", start, self.at, step)
        for labels, present in reported.items():
            node = str(dict(labels).get("node"))
            if node in pools:
                times.setdefault(pools[node], {})[node] = sorted(present)
        gaps = []
        for pool, want in sorted(expected.items()):
            nodes = times.get(pool, {})
            if want and len(nodes) < want:
                hosts = [n.name for p in self.source.pools if p.name == pool and p.cloud is None for n in p.nodes]
                silent = [h for h in hosts if h not in nodes]
                gaps.append(f"pool {pool}: {len(nodes)} of {want} node(s) report {name}" +
                            (f" (no data all window: {', '.join(silent[:5])})" if silent else ""))
            for node, present in sorted(nodes.items()):
                share = len(present) / points
                if share < min_coverage:
                    missing = coverage_gaps(present, start, self.at, step)
                    gaps.append(f"{node} ({pool}) reported {name} in {share:.0%} of the window (promotion.min_coverage "
                                f"{min_coverage:.0%}): " + gaps_text(missing))
        return gaps


def _health_gate(gate: str, item: str, findings: list[str], gaps: list[str], required: str) -> Gate:
    if findings:
        return Gate(gate, item, f"{len(findings)} found", required, False,
                    "; ".join(findings[:10]) + (f" and {len(findings) - 10} more" if len(findings) > 10 else ""))
    if gaps:
        return Gate(gate, item, "no evidence", required, False, "; ".join(gaps))
    return Gate(gate, item, "none", required, True, "every expected node reported throughout the window")


def health_gates(prom: Prometheus, source: ResolvedFleet, guardrails: Guardrails, at: float) -> list[Gate]:
    policy = guardrails.promotion
    w = _Window(source, guardrails, at)
    window, step = w.window, w.step
    dcgm_expected = {p.name: _expected_nodes(p, [n for n in p.nodes if n.managed_by != "gke"]) for p in source.pools}
    where = f"{source.environment}, last {window}"
    gates = []

    def by_node(metric: str) -> str:
        return r.to_node(f"max by ({HOST_LABELS}) (max_over_time({metric}[{step}]))")

    # XIDs: the gauge holds the last XID (new where it changed), the exporter's counter counts them by xid.
    xid = "DCGM_FI_DEV_XID_ERRORS"
    kept = f"({xid} != 0)"
    if policy.ignored_xids:
        kept += " unless (" + " or ".join(f"{xid} == {x}" for x in sorted(policy.ignored_xids)) + ")"
    changed = f"changes({xid}[{2 * duration_seconds(step)}s]) > 0"
    gauge = w.on_nodes(f"max by ({HOST_LABELS}, UUID) (max_over_time(({kept} and {changed})[{window}:{step}]))")
    ignored = f'{{xid!~"{alternatives(map(str, policy.ignored_xids))}"}}' if policy.ignored_xids else ""
    # Summed after the spellings are merged: a GPU whose exporter was upgraded in the window counts all its XIDs.
    counter = w.on_nodes(f"sum by ({HOST_LABEL}, UUID, xid) "
                         f"({dcgm_host(f'increase(DCGM_EXP_XID_ERRORS_COUNT{ignored}[{window}])')}) > 0")
    findings = [f"XID {_num(s)} on {s['metric'].get('UUID')} of {s['metric'].get('node')}"
                for s in prom.query("new XIDs", gauge, at)]
    findings += [f"XID {s['metric'].get('xid')} x{_num(s)} on {s['metric'].get('UUID')} of {s['metric'].get('node')}"
                 for s in prom.query("XID counts", counter, at)]
    gaps = w.reporting(prom, xid, by_node(xid), dcgm_expected, policy.min_coverage)
    ignoring = f" (ignoring {', '.join(map(str, policy.ignored_xids))})" if policy.ignored_xids else ""
    gates.append(_health_gate("xid", f"XID errors on {where}{ignoring}", findings, gaps, "none"))

    # ECC: uncorrectable (double-bit) errors, and GPUs out of spare rows.
    dbe = w.on_nodes(f"max by ({HOST_LABELS}, UUID) (increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[{window}])) > 0")
    remap = w.on_nodes(f"max by ({HOST_LABELS}, UUID) (max_over_time(DCGM_FI_DEV_ROW_REMAP_FAILURE[{window}])) > 0")
    findings = [f"{_num(s)} double-bit ECC errors on {s['metric'].get('UUID')} of {s['metric'].get('node')}"
                for s in prom.query("ECC double-bit errors", dbe, at)]
    findings += [f"row remapping failed on {s['metric'].get('UUID')} of {s['metric'].get('node')}"
                 for s in prom.query("row remap failures", remap, at)]
    gaps = w.reporting(prom, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", by_node("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
                       dcgm_expected, policy.min_coverage)
    gates.append(_health_gate("ecc", f"ECC errors on {where}", findings, gaps, "none"))

    # MIG reconfiguration: a failed state label on any of the source's nodes during the window.
    states = [(MIG_STATE_LABEL, "Ansible"), (r.OPERATOR_MIG_STATE_LABEL, "mig-manager")]

    def state(value: str) -> str:
        return " or ".join(_labelled(source.environment, window, f"{ksm_label(lab)}{value}") for lab, _ in states)

    def state_now(value: str) -> str:
        return " or ".join(_labelled(source.environment, step, f"{ksm_label(lab)}{value}") for lab, _ in states)

    mig_expected = {p.name: _expected_nodes(p, [n for n in p.nodes if n.mig_config and n.managed_by != "gke"])
                    for p in source.pools}
    if not any(mig_expected.values()):
        gates.append(Gate("mig-reconfiguration", f"MIG reconfigurations on {where}", "-", "none failed", True,
                          f"no MIG-capable GPUs that gpushare configures in {source.environment}", applies=False))
    else:
        failed_expr = "max by (node) (" + state('="failed"') + ")"
        any_state = "max by (node) (" + state_now('!=""') + ")"
        failed = [str(s["metric"].get("node")) for s in prom.query("failed MIG reconfigurations", failed_expr, at)]
        gaps = w.reporting(prom, "a MIG state label", any_state, mig_expected, policy.min_coverage)
        gates.append(_health_gate("mig-reconfiguration", f"MIG reconfigurations on {where}",
                                  [f"failed on {n}" for n in sorted(failed)], gaps, "none failed"))

    gates.append(utilization_gate(prom, source, guardrails, w, at))
    gates.append(queue_gate(prom, source, guardrails, w, at))
    return gates


def _num(sample: dict[str, Any]) -> str:
    """A count from increase() (an extrapolation: 1.00024 errors is one error), printed as a whole number."""
    value = float(sample["value"][1])
    return str(max(1, round(value))) if math.isfinite(value) and value > 0 else f"{value:g}"


def utilization_gate(prom: Prometheus, source: ResolvedFleet, guardrails: Guardrails, w: _Window, at: float) -> Gate:
    """Mean GPU utilization of the source's shared pools (weighted by their GPUs) over the baseline, from the same
    expressions as the recording rules."""
    policy = guardrails.promotion
    shared = [p for p in source.pools if p.sharing != "exclusive"]
    measured = [p for p in shared if p in _dcgm_pools(source)]
    required = f">= {policy.min_utilization_uplift:g}x {policy.utilization_baseline:.0%}"
    item = f"shared pools of {source.environment}, last {w.window}"
    unmeasured = [f"{p.name} (GKE-managed: no dcgm-exporter)" for p in shared if p not in measured]
    if not measured:
        return Gate("utilization-uplift", item, "no evidence", required, False,
                    f"{source.environment} has no shared pool that exports DCGM" +
                    (f"; not measured: {', '.join(unmeasured)}" if unmeasured else ""))
    node_pool = f"(\n{r.node_pool_expr(_env_matcher(source.environment))}\n)"
    gpu = r.gpu_utilization_expr(r.unit_utilization_expr(node_pool), r.compute_fractions_expr(measured))
    per_pool = f"avg by (pool) (\n{gpu}\n)"
    sub = f"[{w.window}:{w.step}]"
    means = {s["metric"].get("pool"): float(s["value"][1])
             for s in prom.query("utilization mean", f"avg_over_time(({per_pool}){sub})", at)}
    counts = {s["metric"].get("pool"): float(s["value"][1])
              for s in prom.query("utilization coverage", f"count_over_time(({per_pool}){sub})", at)}
    steps = duration_seconds(w.window) // duration_seconds(w.step)
    gaps, weighted, gpus = [], 0.0, 0
    for p in measured:
        coverage = counts.get(p.name, 0.0) / steps
        if p.name not in means or not math.isfinite(means[p.name]):
            gaps.append(f"pool {p.name}: no utilization series")
        elif coverage < guardrails.capacity.min_coverage:
            gaps.append(f"pool {p.name}: utilization for {coverage:.0%} of the window, below capacity.min_coverage "
                        f"({guardrails.capacity.min_coverage:.0%})")
        else:
            weighted += means[p.name] * p.totals.physical_gpus
            gpus += p.totals.physical_gpus
    parts = [f"{p.name} {means[p.name]:.0%}" for p in measured if p.name in means and math.isfinite(means[p.name])]
    detail = "; ".join(filter(None, [", ".join(parts), "; ".join(gaps),
                                     f"not measured: {', '.join(unmeasured)}" if unmeasured else ""]))
    if gaps:
        return Gate("utilization-uplift", item, "no evidence", required, False, detail)
    mean = weighted / gpus
    uplift = mean / policy.utilization_baseline
    return Gate("utilization-uplift", item, f"{uplift:.2f}x ({mean:.0%} busy)", required,
                uplift >= policy.min_utilization_uplift, f"{detail} (weighted by GPUs)")


def queue_gate(prom: Prometheus, source: ResolvedFleet, guardrails: Guardrails, w: _Window, at: float) -> Gate:
    policy = guardrails.promotion
    queues = sorted({q for qs in r.pool_queues(source, guardrails, source.pools).values() for q in qs})
    required = f"<= {policy.max_queue_p95_seconds:g} s"
    item = f"Kueue admission wait of {source.environment}'s tenant queues, last {w.window}"
    if not queues:
        return Gate("queue-wait-p95", item, "-", required, True, f"{source.environment} has no tenant queues",
                    applies=False)
    expr = ("histogram_quantile(0.95, sum by (le) (increase("
            f'kueue_admission_wait_time_seconds_bucket{{cluster_queue=~"{alternatives(queues)}"}}[{w.window}])))')
    values = [float(s["value"][1]) for s in prom.query("queue wait p95", expr, at)]
    value = next((v for v in values if math.isfinite(v)), None)
    detail = f"queues {', '.join(queues)}"
    if value is None:
        return Gate("queue-wait-p95", item, "no evidence", required, False,
                    f"no admissions recorded in {detail} (Kueue installed with enablePrometheus: true and scraped?)")
    return Gate("queue-wait-p95", item, f"{value:.0f} s", required, value <= policy.max_queue_p95_seconds, detail)


# ---------------------------------------------------------------- without Prometheus, and the guardrails


def no_evidence_gates(found: list[Item], source: ResolvedFleet, guardrails: Guardrails) -> list[Gate]:
    """What cannot be checked without --prometheus: every such gate fails as no evidence."""
    policy = guardrails.promotion
    why = "no evidence: no --prometheus given"
    gates = [Gate("run-time", i.label, "-", f">= {policy.min_days} d", True, i.note, applies=False)
             if i.expr is None else Gate("run-time", i.label, "no evidence", f">= {policy.min_days} d", False, why)
             for i in found]
    where = f"{source.environment}, last {policy.min_days}d"
    gates += [
        Gate("xid", f"XID errors on {where}", "no evidence", "none", False, why),
        Gate("ecc", f"ECC errors on {where}", "no evidence", "none", False, why),
        Gate("mig-reconfiguration", f"MIG reconfigurations on {where}", "no evidence", "none failed", False, why),
        Gate("utilization-uplift", f"shared pools of {source.environment}, last {policy.min_days}d", "no evidence",
             f">= {policy.min_utilization_uplift:g}x {policy.utilization_baseline:.0%}", False, why),
        Gate("queue-wait-p95", f"Kueue admission wait of {source.environment}'s tenant queues", "no evidence",
             f"<= {policy.max_queue_p95_seconds:g} s", False, why),
    ]
    return gates


def guardrails_gate(promotion: Promotion, guardrails: Guardrails, today: date, plan: list[Any] | None,
                    plan_note: str = "") -> Gate:

    ctx = Context(fleet=promotion.candidate, guardrails=guardrails, plan=plan, promotion_source=promotion.source)
    waivers, waivers_file = load_waivers()
    report = evaluate(ctx, waivers, today, waivers_file)
    mandatory = [v for v in report.violations if v.level == "mandatory"]
    notes = [f"{v.rule}: {v.where}: {v.message}" for v in mandatory]
    if report.waived:
        notes.append(f"{len(report.waived)} waived")
    if report.skipped:
        notes.append(f"not run ({plan_note or 'no offline plan'}): {', '.join(report.skipped)}")
    return Gate("guardrails", f"policy rules on the proposed {promotion.target.environment}",
                f"{len(mandatory)} mandatory violation(s)", "0", not mandatory, "; ".join(notes))
