"""Runs a rollout plan: each step journalled before the next starts, batches behind their health gates, the first
failing host stopping the rollout after its batch."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpushare.core.dra import driver_facts, is_dra
from gpushare.core.resolve import ResolvedFleet, ResolvedNode
from gpushare.core.words import counted
from gpushare.ops.rollout.adapters import AnsibleRunner, HostOutcome, Kubectl, PulumiSteps
from gpushare.ops.rollout.journal import Journal
from gpushare.ops.rollout.plan import BATCH_PLAYBOOK, GATE_PLAYBOOK, RolloutPlan, Step
from gpushare.ops.timeouts import GATE_TIMEOUT

ROLLOUT_STATE_LABEL = "gpushare.io/rollout-state"
GATE_POLL_INTERVAL = 5.0  # seconds between two looks at the nodes a gate waits on


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


def advertised_mismatch(expected: dict[str, int], node: dict[str, Any]) -> list[str]:
    """Differences between what the fleet says a node advertises and the node's allocatable resources."""
    allocatable = node.get("status", {}).get("allocatable", {})
    out = []
    for resource, count in sorted(expected.items()):
        have = allocatable.get(resource)
        if have is None or int(str(have)) != count:
            out.append(f"{resource}: {have if have is not None else 'absent'} (expected {count})")
    return out


def _slice_attribute(device: dict[str, Any], driver: str, name: str) -> str | None:
    """A device attribute as the driver publishes it: unqualified (the driver's own domain) or `<driver>/<name>`."""
    attributes = device.get("attributes") or {}
    value = attributes.get(name, attributes.get(f"{driver}/{name}"))
    return None if not isinstance(value, dict) else value.get("string")


def published_mismatch(node: ResolvedNode, slices: list[dict[str, Any]]) -> list[str]:
    """On a DRA cluster: differences between the devices the fleet expects on a node and those the DRA driver
    publishes in the node's ResourceSlices (whole GPUs, or the MIG instances of a static layout). With dynamic MIG
    the driver makes instances per claim, so only the GPUs themselves are counted."""
    driver = driver_facts().driver_name
    counts: dict[str, int] = {}
    for item in slices:
        body = item.get("spec") or {}
        if body.get("driver") != driver or body.get("nodeName") != node.name:
            continue
        for device in body.get("devices") or []:
            kind = _slice_attribute(device, driver, "type")
            key = f"mig {_slice_attribute(device, driver, 'profile')}" if kind == "mig" else str(kind)
            counts[key] = counts.get(key, 0) + 1
    if node.mig_layout and node.mig_config is not None:  # a static layout: mig-parted made the instances
        expected = {f"mig {p}": n * node.gpus_per_node for p, n in node.mig_layout.items()}
    else:
        expected = {"gpu": node.gpus_per_node}
    return [f"{key.replace('mig ', 'MIG ')} devices: {counts.get(key, 0)} published (expected {n})"
            for key, n in sorted(expected.items()) if counts.get(key, 0) != n]


def _context(fleet: ResolvedFleet, host: str) -> str | None:
    node = next(n for n in fleet.nodes if n.name == host)
    cluster = next((c for c in fleet.env.clusters if c.name == node.cluster), None)
    return cluster.kubeconfig_context if cluster is not None else None


def execute(plan: RolloutPlan, journal: Journal, ansible: AnsibleRunner, pulumi: PulumiSteps,
            kube: Kubectl | None, progress: Progress | None = None, gate_timeout: float = GATE_TIMEOUT,
            poll_interval: float = GATE_POLL_INTERVAL) -> Result:
    """Run the plan's steps in order, journalling each; stop at the first failing host (after its batch)."""
    run = _Execution(plan, journal, ansible, pulumi, kube, progress or Progress(), gate_timeout, poll_interval)
    for step in plan.steps:
        stopped = run.batch(step) if step.step == "batch" else run.other_step(step)
        if stopped is not None:
            return stopped
    passed = sum(s == "passed" for s in run.hosts_state.values())
    return run.finish("succeeded", f"{counted(passed, 'host')} passed every gate")


class _Execution:
    """One run of a plan: the journal's rollout id, each host's state, and what this rollout cordoned."""

    def __init__(self, plan: RolloutPlan, journal: Journal, ansible: AnsibleRunner, pulumi: PulumiSteps,
                 kube: Kubectl | None, show: Progress, gate_timeout: float, poll_interval: float) -> None:
        self.plan, self.journal, self.ansible, self.pulumi, self.kube = plan, journal, ansible, pulumi, kube
        self.show, self.gate_timeout, self.poll_interval = show, gate_timeout, poll_interval
        self.hosts_state = {h: ("passed" if h in plan.done_hosts else "pending") for b in plan.batches for h in b}
        self.failures: list[HostOutcome] = []
        self.rollout_id, self.cordoned = self._start()

    def _start(self) -> tuple[str, set[str]]:
        plan = self.plan
        if plan.resumes is not None:
            self.journal.append({"event": "resume", "rollout": plan.resumes.id, "revision": plan.revision,
                                 "skipping": sorted(plan.done_hosts)})
            return plan.resumes.id, plan.resumes.cordoned_by_rollout()
        rollout_id = f"{plan.environment}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{plan.revision[:8]}"
        self.journal.append({"event": "start", "rollout": rollout_id, "kind": plan.kind, "env": plan.environment,
                             "revision": plan.revision, "dirty": plan.dirty, "fingerprint": plan.snapshot.fingerprint,
                             "target_revision": plan.target_revision, "batches": plan.batches,
                             "steps": [s.as_dict() for s in plan.steps], "snapshot": plan.snapshot.as_dict()})
        return rollout_id, set()

    def event(self, kind: str, **fields: Any) -> None:
        self.journal.append({"event": kind, "rollout": self.rollout_id, **fields})

    def finish(self, status: str, reason: str) -> Result:
        self.event("end", status=status, reason=reason)
        return Result(self.rollout_id, status, reason, self.hosts_state, self.failures, self.journal.path)

    def record_host(self, batch: int, host: str, status: str, **extra: Any) -> None:
        self.hosts_state[host] = status
        self.event("host", batch=batch, host=host, status=status, **extra)
        self.show.host(host, status)

    # ------------------------------------------------------------ check, Pulumi and manual steps

    def other_step(self, step: Step) -> Result | None:
        if step.step == "check" or step.detail.get("skip") == "done":
            self.show.step(step, "done")
            return None
        if step.detail.get("manual"):  # advice for a reviewed change (a Git revert): shown, not awaited
            self.event("step", step=step.step, status="manual", detail=step.detail.get("description", ""),
                       commands=step.detail["commands"])
            self.show.step(step, "manual")
            return None
        self.show.step(step, "running")
        status, detail = self.pulumi.run(step)
        self.event("step", step=step.step, status=status, detail=detail)
        self.show.step(step, status)
        if status == "failed":
            # Before the first batch nothing on the hosts changed; after the last, every host passed its gates.
            where = "no host was touched" if step.step == "pulumi-add" else "every host had passed its gates"
            return self.finish("failed", f"{step.step}: {detail}; {where}. Fix the cause and resume with --resume "
                               "(finished steps and hosts are not run again)")
        if status == "waiting":
            return self.finish("stopped", f"{step.step}: {detail}; run these, then resume with --resume "
                               f"--pulumi-confirmed: " + "; ".join(step.detail["commands"]))
        return None

    # ------------------------------------------------------------ a batch of hosts

    def batch(self, step: Step) -> Result | None:
        index, todo = step.detail["batch"], list(step.detail["run"])
        if not todo:
            return None
        self.show.batch(index, todo)
        for host in todo:
            self.record_host(index, host, "converging")
        label = f"{self.rollout_id}-batch{index}"
        outcomes = self.ansible.run(BATCH_PLAYBOOK, self.plan.env_file, todo, f"{label}-rollout", "converge")
        healthy = [h for h in todo if outcomes[h].ok]
        bad = [outcomes[h] for h in todo if not outcomes[h].ok]
        bad += self.verify_gate(index, healthy, label)
        if self.kube is not None:
            bad += self.device_plugin_gate(index, [h for h in healthy if h not in {b.host for b in bad}], self.kube)
        failed = {b.host for b in bad}
        for outcome in bad:
            self.mark_failed(index, outcome, outcomes[outcome.host].changed, outcomes[outcome.host].job)
        for host in todo:
            if host not in failed:
                self.mark_passed(index, host, outcomes[host].changed, outcomes[host].job)
        self.event("batch", batch=index, status="failed" if failed else "passed", hosts=todo)
        if not failed:
            return None
        untouched = [h for b in self.plan.batches[index:] for h in b]
        return self.finish("failed", f"batch {index}: {', '.join(sorted(failed))} failed its gates; the rollout "
                           f"stopped" + (f" before {', '.join(untouched)}" if untouched else ""))

    def verify_gate(self, index: int, hosts: list[str], label: str) -> list[HostOutcome]:
        """verify.yml (with `dcgmi diag`) on the hosts that converged: the outcomes that failed."""
        if not hosts:
            return []
        for host in hosts:
            self.show.host(host, "verifying")
        checked = self.ansible.run(GATE_PLAYBOOK, self.plan.env_file, hosts, f"{label}-verify", "verify")
        for host in hosts:
            self.event("gate", batch=index, host=host, gate="verify+dcgm", passed=checked[host].ok,
                       detail=checked[host].message)
        return [checked[h] for h in hosts if not checked[h].ok]

    def device_plugin_gate(self, index: int, hosts: list[str], kube: Kubectl) -> list[HostOutcome]:
        """Poll each node until the device plugin advertises what the fleet expects, up to the gate timeout."""
        fleet, pending = self.plan.fleet, list(hosts)
        deadline = time.monotonic() + self.gate_timeout
        mismatches: dict[str, list[str]] = {}
        while pending:
            for host in list(pending):
                node = next(n for n in fleet.nodes if n.name == host)
                mismatches[host] = self._mismatch(node, kube)
                if not mismatches[host]:
                    pending.remove(host)
                    self.event("gate", batch=index, host=host, gate=self._gate_name(node), passed=True, detail="")
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(self.poll_interval)
        failed = []
        for host in pending:
            detail = "; ".join(mismatches[host])
            node = next(n for n in fleet.nodes if n.name == host)
            gate = self._gate_name(node)
            what = ("the DRA driver does not publish the expected devices" if gate == "dra-driver" else
                    "the device plugin does not advertise the expected resources")
            self.event("gate", batch=index, host=host, gate=gate, passed=False, detail=detail)
            failed.append(HostOutcome(host, False, gate, f"{what} after {self.gate_timeout:g} s: {detail}"))
        return failed

    def _on_dra(self, node: ResolvedNode) -> bool:
        cluster = next((c for c in self.plan.fleet.env.clusters if c.name == node.cluster), None)
        return cluster is not None and is_dra(cluster)

    def _gate_name(self, node: ResolvedNode) -> str:
        return "dra-driver" if self._on_dra(node) else "device-plugin"

    def _mismatch(self, node: ResolvedNode, kube: Kubectl) -> list[str]:
        """Device-plugin clusters: the node's allocatable resources; DRA clusters: the driver's ResourceSlices."""
        context = _context(self.plan.fleet, node.name)
        if self._on_dra(node):
            return published_mismatch(node, kube.resource_slices(context, node.name))
        return advertised_mismatch(node.advertised, kube.node(context, node.name))

    def mark_failed(self, index: int, outcome: HostOutcome, changed: int, job: str = "") -> None:
        """Journal the failure; with kubectl, the node stays cordoned and labelled failed."""
        self.failures.append(outcome)
        self.record_host(index, outcome.host, "failed", gate=outcome.gate, message=outcome.message, changed=changed,
                         **({"job": job} if job else {}))
        if self.kube is None:
            return
        ctx = _context(self.plan.fleet, outcome.host)
        self.kube.cordon(ctx, outcome.host)
        self.kube.label(ctx, outcome.host, {ROLLOUT_STATE_LABEL: "failed"})
        self.cordoned.add(outcome.host)
        self.event("node", host=outcome.host, cordoned=True, labels={ROLLOUT_STATE_LABEL: "failed"})

    def mark_passed(self, index: int, host: str, changed: int, job: str = "") -> None:
        """Label the node a success, and uncordon it if an earlier run of this rollout cordoned it."""
        if self.kube is not None:
            ctx = _context(self.plan.fleet, host)
            self.kube.label(ctx, host, {ROLLOUT_STATE_LABEL: "success"})
            if host in self.cordoned:
                self.kube.uncordon(ctx, host)
                self.cordoned.discard(host)
                self.event("node", host=host, cordoned=False, labels={ROLLOUT_STATE_LABEL: "success"})
        self.record_host(index, host, "passed", changed=changed, **({"job": job} if job else {}))
