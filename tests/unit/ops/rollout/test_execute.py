"""A rollout that fails, resumes and rolls back (gpushare.ops.rollout.execute): batches, gates, the journal and the
stop/resume/rollback decisions, with the Ansible and Kubernetes sides replaced by recording fakes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpushare.core.errors import GpushareError
from gpushare.core.resolve import resolve
from gpushare.ops.rollout.adapters import PulumiRunner
from gpushare.ops.rollout.execute import advertised_mismatch, execute
from gpushare.ops.rollout.journal import Journal
from gpushare.ops.rollout.plan import Step, plan_rollout
from tests.unit.ops.rollout.helpers import A100, HOSTS, L4, FakeAnsible, FakeKube, confirmed, run, six_host_env

# ---------------------------------------------------------------- a rollout that fails, resumes, rolls back


def test_first_failure_stops_after_its_batch_and_resume_skips_finished_hosts(tmp_path: Path) -> None:
    env = six_host_env(tmp_path)
    journal = Journal(tmp_path / "journal.jsonl")
    ansible = FakeAnsible()
    kube = FakeKube(resolve(env))
    ansible.fail["a100-04"] = ("rollout.yml", "dcgm", "DCGM | run dcgmi diag: GPU 1 failed")

    plan, result = run(env, journal, ansible, kube)
    assert [b for b in plan.batches] == [A100[:1], A100[1:4], L4]
    assert result.status == "failed" and [f.host for f in result.failures] == ["a100-04"]
    assert ansible.hosts_run("rollout.yml") == A100  # the last batch never started
    assert ansible.hosts_run("verify.yml") == A100[:3]  # gates run on the hosts that converged
    assert kube.cordoned == {"a100-04"} and kube.labels["a100-04"] == {"gpushare.io/rollout-state": "failed"}
    assert all(kube.labels[h] == {"gpushare.io/rollout-state": "success"} for h in A100[:3])
    assert not any(name in L4 for _, name, _ in kube.calls)
    events = journal.events()
    assert events[0]["event"] == "start" and events[0]["revision"] and events[0]["batches"] == plan.batches
    assert events[-1] == {**events[-1], "event": "end", "status": "failed"}
    assert "before l4-01, l4-02" in events[-1]["reason"]

    ansible.fail.clear()
    ansible.calls.clear()
    resumed, result = run(env, journal, ansible, kube, resume=True)
    assert resumed.resumes is not None and resumed.done_hosts == set(A100[:3])
    assert result.status == "succeeded"
    assert ansible.hosts_run("rollout.yml") == ["a100-04", *L4]  # finished hosts are not run again
    assert kube.cordoned == set()  # the rollout uncordons what it cordoned, once the gates pass
    assert kube.labels["a100-04"] == {"gpushare.io/rollout-state": "success"}
    rollout_ids = {e["rollout"] for e in journal.events()}
    assert len(rollout_ids) == 1  # the resume continues the same rollout in the journal

    # Nothing is left to resume.
    with pytest.raises(GpushareError, match="nothing to resume"):
        plan_rollout(env, resolve(env), journal, "1,50%,100%", resume=True)


def test_gate_failures_are_attributed(tmp_path: Path) -> None:
    env = six_host_env(tmp_path)
    journal = Journal(tmp_path / "journal.jsonl")
    ansible = FakeAnsible()
    kube = FakeKube(resolve(env))
    ansible.fail["a100-01"] = ("verify.yml", "verify", "Verify | MIG layout: nvidia-mig-parted assert failed")
    _, result = run(env, journal, ansible, kube)
    assert result.status == "failed" and result.failures[0].gate == "verify"
    assert ansible.hosts_run("rollout.yml") == ["a100-01"]  # the canary stopped everything

    journal2 = Journal(tmp_path / "j2.jsonl")
    ansible2 = FakeAnsible()
    kube.advertised["a100-01"] = {"nvidia.com/mig-1g.10gb": 2}  # the plugin advertises the old layout
    _, result = run(env, journal2, ansible2, kube)
    assert result.status == "failed" and result.failures[0].gate == "device-plugin"
    assert "nvidia.com/mig-3g.40gb: absent" in result.failures[0].message
    gates = [e for e in journal2.events() if e["event"] == "gate"]
    assert {(g["gate"], g["passed"]) for g in gates} == {("verify+dcgm", True), ("device-plugin", False)}


def test_advertised_mismatch_compares_every_expected_resource() -> None:
    node = {"status": {"allocatable": {"nvidia.com/gpu.shared": "8", "cpu": "4"}}}
    assert advertised_mismatch({"nvidia.com/gpu.shared": 8}, node) == []
    assert advertised_mismatch({"nvidia.com/gpu.shared": 4}, node) == ["nvidia.com/gpu.shared: 8 (expected 4)"]
    assert advertised_mismatch({"nvidia.com/mig-1g.10gb": 2}, {}) == ["nvidia.com/mig-1g.10gb: absent (expected 2)"]


def test_resume_refuses_a_changed_environment(tmp_path: Path) -> None:
    env = six_host_env(tmp_path)
    journal = Journal(tmp_path / "journal.jsonl")
    ansible = FakeAnsible()
    ansible.fail["a100-01"] = ("rollout.yml", "converge", "boom")
    run(env, journal, ansible)
    six_host_env(tmp_path, a100_profile="mig-small")
    with pytest.raises(GpushareError, match="changed since rollout") as err:
        plan_rollout(env, resolve(env), journal, "1,50%,100%", resume=True)
    assert err.value.problems[0].file == str(env)


def test_rollback_reapplies_the_last_good_revision_to_changed_hosts(tmp_path: Path) -> None:
    env = six_host_env(tmp_path)
    journal = Journal(tmp_path / "journal.jsonl")
    ansible = FakeAnsible()
    good, result = run(env, journal, ansible)
    assert result.status == "succeeded"
    good_fleet = resolve(env)

    with pytest.raises(GpushareError, match="no succeeded rollout"):
        plan_rollout(env, resolve(env), journal, "1,50%,100%", kind="rollback")

    six_host_env(tmp_path, a100_profile="mig-small")
    new_fleet = resolve(env)
    ansible.calls.clear()
    ansible.changed = 0  # only the A100 hosts change in the new revision
    ansible.fail["a100-03"] = ("rollout.yml", "converge", "MIG | apply: GPU processes still run")

    def changed_for(playbook: str, inventory: Path, hosts: list[str], label: str, gate: str):
        out = FakeAnsible.run(ansible, playbook, inventory, hosts, label, gate)
        for h, o in out.items():
            if playbook == "rollout.yml" and h in A100 and o.ok:
                o.changed = 5
        return out

    ansible.run = changed_for  # type: ignore[method-assign]
    plan, result = run(env, journal, ansible)
    assert result.status == "failed"
    dropped = set(good_fleet.device_plugin_configs) - set(new_fleet.device_plugin_configs)
    assert dropped and {k["name"] for k in plan.steps[1].detail["keep"]} == dropped  # old configs stay meanwhile
    assert all(any(k["name"] in c for c in plan.steps[1].detail["commands"]) for k in plan.steps[1].detail["keep"])

    back = plan_rollout(env, resolve(env), journal, "1,50%,100%", kind="rollback")
    assert back.kind == "rollback" and back.target_revision == good.revision
    assert [h for b in back.batches for h in b] == A100  # changed (1, 2, 4) or failed (3); L4 never started
    assert {n.name: n.mig_config for n in back.fleet.nodes} == {n.name: n.mig_config for n in good_fleet.nodes}
    assert back.steps[-1].step == "git-revert" and back.steps[-1].detail["manual"]
    # While hosts roll back, the configs of the revision they leave must stay too.
    assert {k["name"] for k in back.steps[1].detail["keep"]} == dropped

    ansible.run = FakeAnsible.run.__get__(ansible)  # type: ignore[method-assign]
    ansible.fail.clear()
    ansible.calls.clear()
    result = execute(back, journal, ansible, confirmed(), None)
    assert ansible.hosts_run("rollout.yml") == A100
    assert result.status == "succeeded"
    # The Git revert is a reviewed change: the journal and the display carry it as advice, not as a done step.
    manual = [e for e in journal.events() if e["event"] == "step" and e["status"] == "manual"]
    assert manual and manual[-1]["step"] == "git-revert" and "Git" in manual[-1]["detail"]
    # A later rollback goes back past the rollout that failed, not to the rollback itself.
    assert plan_rollout(env, resolve(env), journal, "1,50%,100%", kind="rollback").target_revision == good.revision


def test_pulumi_without_its_cli_stops_until_confirmed(tmp_path: Path) -> None:
    env = six_host_env(tmp_path)
    journal = Journal(tmp_path / "journal.jsonl")
    ansible = FakeAnsible()
    asked: list[Step] = []

    def refuse(step: Step) -> bool:
        asked.append(step)
        return False

    plan, result = run(env, journal, ansible, pulumi=PulumiRunner(confirm=refuse))
    assert PulumiRunner.available() is False  # no Pulumi CLI on these machines
    assert result.status == "stopped" and ansible.calls == []
    assert asked[0].step == "pulumi-add" and asked[0].detail["commands"][-1] == "pulumi up -s dev"
    assert "pulumi up -s dev" in result.reason
    waiting = [e for e in journal.events() if e["event"] == "step"]
    assert waiting == [{**waiting[0], "step": "pulumi-add", "status": "waiting"}]

    _, result = run(env, journal, ansible, resume=True)
    assert result.status == "succeeded" and ansible.hosts_run() == HOSTS
    steps = [(e["step"], e["status"]) for e in journal.events() if e["event"] == "step"]
    assert steps == [("pulumi-add", "waiting"), ("pulumi-add", "done"), ("pulumi-prune", "done")]


class FailingUp(PulumiRunner):
    """The CLI is there and `pulumi up` fails, as the engine reports a resource that errored."""

    def __init__(self, fail_step: str) -> None:
        super().__init__(confirm=lambda step: False)
        self.fail_step, self.ups = fail_step, []

    @staticmethod
    def available() -> bool:
        return True

    def stack(self, name: str) -> Any:
        from types import SimpleNamespace

        from pulumi import automation as auto
        from pulumi.automation._cmd import CommandResult

        def up(**kw: Any) -> Any:
            step = kw["message"].rsplit(" ", 1)[-1]
            self.ups.append(step)
            if step == self.fail_step:
                raise auto.CommandError(CommandResult(stdout="Updating (dev)", code=255, stderr=(
                    "error: update failed\n  kubernetes:helm.sh/v3:Release (dev-metal-gpu-operator):\n"
                    "    error: resource gpu-operator was not successfully created")))
            return SimpleNamespace(summary=SimpleNamespace(result="succeeded", resource_changes={"update": 1}))

        return SimpleNamespace(up=up, set_config=lambda *a, **k: None, remove_config=lambda *a, **k: None)


@pytest.mark.parametrize("fail_step", ["pulumi-add", "pulumi-prune"])
def test_a_failed_pulumi_up_stops_the_rollout_and_is_journalled(tmp_path: Path, fail_step: str) -> None:
    env = six_host_env(tmp_path)
    journal = Journal(tmp_path / "journal.jsonl")
    ansible = FakeAnsible()
    pulumi = FailingUp(fail_step)
    _, result = run(env, journal, ansible, pulumi=pulumi)
    assert result.status == "failed" and result.reason.startswith(f"{fail_step}: pulumi up failed: ")
    assert "resource gpu-operator was not successfully created" in result.reason
    assert "--resume" in result.reason
    # pulumi-add failing: no host is touched; pulumi-prune failing: every host had converged and passed.
    assert ansible.hosts_run() == ([] if fail_step == "pulumi-add" else HOSTS)
    steps = [(e["step"], e["status"]) for e in journal.events() if e["event"] == "step"]
    assert steps[-1] == (fail_step, "failed")
    assert [e for e in journal.events() if e["event"] == "end"][-1]["status"] == "failed"

    # Resumed with the engine working: the failed step runs again, finished ones do not.
    pulumi.fail_step, pulumi.ups = "", []
    _, result = run(env, journal, ansible, pulumi=pulumi, resume=True)
    assert result.status == "succeeded"
    assert pulumi.ups == (["pulumi-add", "pulumi-prune"] if fail_step == "pulumi-add" else ["pulumi-prune"])
    assert ansible.hosts_run() == HOSTS


def test_environment_without_a_stack_skips_pulumi(tmp_path: Path) -> None:
    env = six_host_env(tmp_path, name="nostack")
    plan = plan_rollout(env, resolve(env), Journal(tmp_path / "j.jsonl"), "1,50%,100%")
    assert "no Pulumi stack" in plan.steps[1].detail["skip"]
