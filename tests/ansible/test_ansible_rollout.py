"""`gpushare rollout` for real: six isolated test hosts, batches 1, 50%, 100% (1, 3 and 2 hosts), ansible-runner
with --limit per batch, verify.yml and `dcgmi diag -r 1` as gates, and the device-plugin gate through kubectl (the
recording test double, whose nodes advertise what their selected device-plugin config gives).

The tests run in file order on the same hosts: a first rollout converges revision A; revision B changes the A100
pool's layout and the fourth host fails its DCGM gate, so the rollout stops after the second batch; `--resume`
finishes it without rerunning finished hosts; `--rollback` puts revision A's layouts back on the hosts that changed;
revision B again goes out through a stand-in of AWX's job API (tests/ansible/awx_standin.py), one job launch per
batch and playbook.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.resolve import resolve
from tests.ansible.awx_standin import AwxStandIn, JobTemplate
from tests.ansible.controller import ENVIRONMENTS, Controller
from tests.ansible.testbed import ROOT, Host, HostSpec, Testbed

pytestmark = [pytest.mark.ansible, pytest.mark.slow]

A100 = [f"ro-a100-{i:02d}" for i in range(1, 5)]
L4 = [f"ro-l4-{i:02d}" for i in range(1, 3)]
HOSTS = A100 + L4
SPECS = [HostSpec(h, "NVIDIA A100-SXM4-80GB", 2) for h in A100] + [HostSpec(h, "NVIDIA L4", 2) for h in L4]
FAILING = A100[3]  # the fourth host: in the second batch


@pytest.fixture(scope="module")
def bed() -> Iterator[Testbed]:
    if os.geteuid() != 0:
        pytest.skip("the Ansible tests boot test hosts with systemd-nspawn in network namespaces: run as root")
    with Testbed(SPECS, tag="rollout") as testbed:
        yield testbed


def write_env(bed: Testbed, directory: Path, a100_profile: str) -> Path:
    """A `dev` environment (its guardrails pass `gpushare check`) with the six hosts at their addresses."""
    addresses = {h.name: h.address for h in bed.hosts}
    data = {
        "name": "dev", "description": "rollout tests",
        "defaults": {"driver_branch": 580, "toolkit_version": "1.18.2", "containerd_version": "1.6"},
        "clusters": [{"name": "rollout-metal", "kind": "bare-metal", "mig_strategy": "mixed", "cdi": True,
                      "kubernetes_version": "1.33", "kubeconfig_context": "rollout-admin"}],
        "pools": [
            {"name": "a100-inference", "cluster": "rollout-metal", "purpose": "inference",
             "gpu_model": "NVIDIA A100-SXM4-80GB", "profile": a100_profile,
             "hosts": [{"name": h, "address": addresses[h], "gpu_count": 2} for h in A100]},
            {"name": "l4-notebooks", "cluster": "rollout-metal", "purpose": "development",
             "gpu_model": "NVIDIA L4", "profile": "notebooks-ts4",
             "hosts": [{"name": h, "address": addresses[h], "gpu_count": 2} for h in L4]},
        ],
        "tenants": [{"name": "notebooks", "namespace": "ds-notebooks", "trust": "trusted", "priority": "batch",
                     "quota": {"nvidia.com/gpu.shared": 4}}],
    }
    env_dir = directory / "environments"
    (env_dir / "group_vars").mkdir(parents=True, exist_ok=True)
    (env_dir / "group_vars" / "all.yml").write_text((ENVIRONMENTS / "group_vars" / "all.yml").read_text())
    path = env_dir / "dev.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class Rollouts:
    """The environment file (edited between revisions), the controller and the journal the tests share."""

    def __init__(self, bed: Testbed, work: Path) -> None:
        self.bed = bed
        self.work = work
        self.env = write_env(bed, work, "mig-balanced")
        self.revision_a = resolve(self.env)
        self.revision_b = resolve(write_env(bed, work / "b", "mig-small"))
        self.journal = work / "state" / "journal.jsonl"
        self.ctl = Controller(work / "controller", bed.hosts[0].key, forks=10)
        # Each node's stand-in device plugin advertises what the config its label selects gives, for both revisions.
        self.ctl.seed_nodes({h: {"kubernetes.io/hostname": h, "nvidia.com/mig.config": "all-disabled"} for h in HOSTS})
        state = json.loads(self.ctl.kubectl_state.read_text())
        for fleet in (self.revision_a, self.revision_b):
            for node in fleet.nodes:
                state["nodes"][node.name].setdefault("device_plugin", {})[node.device_plugin_config] = node.advertised
        self.ctl.kubectl_state.write_text(json.dumps(state, indent=1))

    def use(self, a100_profile: str) -> None:
        write_env(self.bed, self.work, a100_profile)

    def rollout(self, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
        cmd = [sys.executable, "-m", "gpushare", "rollout", "--env", str(self.env), "--journal", str(self.journal),
               "--kubeconfig", str(self.ctl.kubeconfig), "--pulumi-confirmed", "--gate-timeout", "10", "--json",
               *args]
        done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **self.ctl.env(), **(env or {})},
                              capture_output=True, text=True, timeout=3000)
        try:
            doc = json.loads(done.stdout)
        except ValueError:
            doc = {}
        return done.returncode, doc, f"rc={done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"

    def events(self, since: int = 0) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.journal.read_text().splitlines()[since:]]

    def lines(self) -> int:
        return len(self.journal.read_text().splitlines()) if self.journal.exists() else 0


@pytest.fixture(scope="module")
def rollouts(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Rollouts:
    return Rollouts(bed, tmp_path_factory.mktemp("rollout"))


def layouts(host: Host) -> list[dict[str, int]]:
    return [g["layout"] for g in json.loads(host.ssh("gpusim show").stdout)["gpus"]]


def expected(fleet: Any, name: str) -> list[dict[str, int]]:
    node = next(n for n in fleet.nodes if n.name == name)
    return [dict(node.mig_layout or {})] * node.gpus_per_node


def host_events(events: list[dict[str, Any]], status: str) -> list[str]:
    return [e["host"] for e in events if e["event"] == "host" and e["status"] == status]


def test_rollout_converges_batch_by_batch(bed: Testbed, rollouts: Rollouts) -> None:
    rc, doc, out = rollouts.rollout()
    assert rc == 0, out
    assert [b["hosts"] for b in doc["batches"]] == [A100[:1], A100[1:], L4]
    events = rollouts.events()
    assert events[0]["event"] == "start" and len(events[0]["revision"]) == 40
    # A batch starts only after the previous one passed its gates.
    order = [(e["event"], e.get("batch"), e.get("status")) for e in events if e["event"] in ("batch", "host")]
    first_of_batch2 = order.index(("host", 2, "converging"))
    assert ("batch", 1, "passed") in order[:first_of_batch2]
    assert {(e["host"], e["gate"], e["passed"]) for e in events if e["event"] == "gate"} >= {
        (h, g, True) for h in HOSTS for g in ("verify+dcgm", "device-plugin")}
    for name in A100:
        assert layouts(bed.host(name)) == expected(rollouts.revision_a, name), name
    for host in bed.hosts:
        node = rollouts.ctl.node(host.name)
        assert node["labels"]["gpushare.io/rollout-state"] == "success" and not node["unschedulable"]


def test_failing_gate_stops_the_rollout_after_its_batch(bed: Testbed, rollouts: Rollouts) -> None:
    rollouts.use("mig-small")
    failing = bed.host(FAILING)
    failing.ssh("gpusim diag --gpu 1 --message 'simulated XID 79: GPU has fallen off the bus'")
    untouched = {h: bed.host(h).ssh("cat /var/lib/gpushare/state.json").stdout for h in L4}
    since, t0 = rollouts.lines(), time.time()
    rc, doc, out = rollouts.rollout()
    assert rc == 1, out
    assert doc["status"] == "failed" and [f["host"] for f in doc["failures"]] == [FAILING]
    assert doc["failures"][0]["gate"] == "dcgm" and "XID 79" in doc["failures"][0]["message"]
    # The kept config of revision A is in the Pulumi step while hosts move.
    keep = next(s for s in doc["steps"] if s["step"] == "pulumi-add")["keep"]
    assert {k["name"] for k in keep} == set(rollouts.revision_a.device_plugin_configs) - set(
        rollouts.revision_b.device_plugin_configs)
    events = rollouts.events(since)
    assert host_events(events, "passed") == A100[:3]
    for name in A100[:3]:
        assert layouts(bed.host(name)) == expected(rollouts.revision_b, name)
    node = rollouts.ctl.node(FAILING)
    assert node["unschedulable"] is True and node["labels"]["gpushare.io/rollout-state"] == "failed"
    # The last batch is untouched: no Ansible run, no node call, the hosts' state as it was.
    assert not [e for e in events if e.get("host") in L4]
    for name in L4:
        assert rollouts.ctl.mutating_calls(name, since=t0) == []
        assert bed.host(name).ssh("cat /var/lib/gpushare/state.json").stdout == untouched[name]


def test_resume_finishes_without_rerunning_finished_hosts(bed: Testbed, rollouts: Rollouts) -> None:
    bed.host(FAILING).ssh("gpusim diag --clear")
    since, t0 = rollouts.lines(), time.time()
    rc, doc, out = rollouts.rollout("--resume")
    assert rc == 0, out
    events = rollouts.events(since)
    assert events[0]["event"] == "resume" and sorted(events[0]["skipping"]) == A100[:3]
    assert host_events(events, "converging") == [FAILING, *L4]
    for name in A100[:3]:
        assert rollouts.ctl.mutating_calls(name, since=t0) == []
    node = rollouts.ctl.node(FAILING)
    assert node["unschedulable"] is False and node["labels"]["gpushare.io/rollout-state"] == "success"
    for name in A100:
        assert layouts(bed.host(name)) == expected(rollouts.revision_b, name), name


def test_rollback_restores_the_previous_layouts_on_the_changed_hosts(bed: Testbed, rollouts: Rollouts) -> None:
    since, t0 = rollouts.lines(), time.time()
    rc, doc, out = rollouts.rollout("--rollback")
    assert rc == 0, out
    assert doc["kind"] == "rollback" and doc["target_revision"] == rollouts.events()[0]["revision"]
    events = rollouts.events(since)
    # Only the A100 hosts changed in revision B; the L4 hosts' converged runs changed nothing.
    assert host_events(events, "passed") == A100
    for name in L4:
        assert rollouts.ctl.mutating_calls(name, since=t0) == []
    for name in A100:
        assert layouts(bed.host(name)) == expected(rollouts.revision_a, name), name
    for host in bed.hosts:
        labels = rollouts.ctl.node(host.name)["labels"]
        node = next(n for n in rollouts.revision_a.nodes if n.name == host.name)
        assert labels["nvidia.com/device-plugin.config"] == node.device_plugin_config
    assert any(e["event"] == "step" and e["status"] == "manual" for e in events)


def test_rollout_through_awx_launches_one_job_per_batch_and_journals_its_result(
        bed: Testbed, rollouts: Rollouts, tmp_path: Path) -> None:
    rollouts.use("mig-small")
    # As the controller's job templates would be set up: this checkout's playbooks, the environment file as the
    # inventory source, the kubeconfig from a credential, Prompt on launch for the limit and the variables.
    creds = {"gpushare_kubeconfig": str(rollouts.ctl.kubeconfig)}
    templates = {21: JobTemplate("rollout.yml", rollouts.env, creds),
                 22: JobTemplate("verify.yml", rollouts.env, creds)}
    since = rollouts.lines()
    (tmp_path / "awx").mkdir()
    with AwxStandIn(templates, rollouts.ctl.env, tmp_path / "awx") as awx:
        rc, doc, out = rollouts.rollout("--awx-url", awx.url, "--awx-template", "rollout.yml=21",
                                        "--awx-template", "verify.yml=22", env={"CONTROLLER_OAUTH_TOKEN": awx.token})
        launches = list(awx.launches)
    assert rc == 0, out
    batches = [b["hosts"] for b in doc["batches"] if b["hosts"]]
    # Per batch: the converge job, then the verify gate, each with exactly the batch's hosts as its limit.
    assert [(la["job_template"], la["limit"]) for la in launches] == [
        (t, ",".join(hosts)) for hosts in batches for t in (21, 22)]
    assert all(la["extra_vars"]["gpushare_rollout_run"].startswith(doc["rollout"]) for la in launches)
    events = rollouts.events(since)
    passed = [e for e in events if e["event"] == "host" and e["status"] == "passed"]
    assert sorted(e["host"] for e in passed) == sorted(h for hosts in batches for h in hosts)
    assert all(e["job"].startswith(awx.url + "/#/jobs/playbook/") for e in passed)
    for name in A100:
        assert layouts(bed.host(name)) == expected(rollouts.revision_b, name), name
