"""gpushare rollout: batches, the journal, gates, stop/resume/rollback decisions and the command line, with the
Ansible and Kubernetes sides replaced by recording fakes (tests/ansible/test_rollout.py runs the same flow for real
against isolated test hosts)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core.errors import GpushareError
from gpushare.core.resolve import resolve
from gpushare.ops.rollout.adapters import HostOutcome, PulumiRunner
from gpushare.ops.rollout.batches import parse_batches, plan_batches
from gpushare.ops.rollout.execute import advertised_mismatch, execute
from gpushare.ops.rollout.journal import Journal
from gpushare.ops.rollout.plan import Step, kept_configs, plan_rollout
from gpushare.ops.rollout.snapshot import Snapshot

ROOT = Path(__file__).resolve().parents[1]
A100 = [f"a100-{i:02d}" for i in range(1, 5)]
L4 = [f"l4-{i:02d}" for i in range(1, 3)]
HOSTS = A100 + L4


def six_host_env(directory: Path, a100_profile: str = "mig-balanced", name: str = "dev") -> Path:
    """Four A100 hosts (MIG) and two L4 hosts (time-slicing) in one bare-metal cluster; never contacted here."""
    data = {
        "name": name, "description": "six hosts for rollout tests",
        "defaults": {"driver_branch": 580, "toolkit_version": "1.18.2", "containerd_version": "1.6"},
        "clusters": [{"name": "metal", "kind": "bare-metal", "mig_strategy": "mixed", "cdi": True,
                      "kubernetes_version": "1.33", "kubeconfig_context": "metal-admin"}],
        "pools": [
            {"name": "a100-inference", "cluster": "metal", "purpose": "inference",
             "gpu_model": "NVIDIA A100-SXM4-80GB", "profile": a100_profile,
             "hosts": [{"name": h, "address": f"10.99.{i}.2", "gpu_count": 2} for i, h in enumerate(A100, 1)]},
            {"name": "l4-notebooks", "cluster": "metal", "purpose": "development", "gpu_model": "NVIDIA L4",
             "profile": "notebooks-ts4",
             "hosts": [{"name": h, "address": f"10.99.{i}.2", "gpu_count": 2} for i, h in enumerate(L4, 5)]},
        ],
        "tenants": [{"name": "notebooks", "namespace": "ds-notebooks", "trust": "trusted", "priority": "batch",
                     "quota": {"nvidia.com/gpu.shared": 4}}],
    }
    env_dir = directory / "environments"
    (env_dir / "group_vars").mkdir(parents=True, exist_ok=True)
    (env_dir / "group_vars" / "all.yml").write_text("ansible_user: root\n")
    path = env_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class FakeAnsible:
    """Records each batch's playbook runs; `fail` maps host -> (playbook, gate, message) for its next run."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.fail: dict[str, tuple[str, str, str]] = {}
        self.changed = 3

    def run(self, playbook: str, inventory: Path, hosts: list[str], label: str, gate: str
            ) -> dict[str, HostOutcome]:
        assert inventory.exists()
        self.calls.append((playbook, list(hosts)))
        out = {}
        for h in hosts:
            failing = self.fail.get(h)
            if failing and failing[0] == playbook:
                out[h] = HostOutcome(h, False, failing[1], failing[2])
            else:
                out[h] = HostOutcome(h, True, changed=self.changed if playbook == "rollout.yml" else 0)
        return out

    def hosts_run(self, playbook: str = "rollout.yml") -> list[str]:
        return [h for p, hosts in self.calls if p == playbook for h in hosts]


class FakeKube:
    """Nodes advertise what the fleet expects unless told otherwise; cordons and labels are recorded."""

    def __init__(self, fleet: Any) -> None:
        self.advertised = {n.name: dict(n.advertised) for n in fleet.nodes}
        self.calls: list[tuple[str, str, Any]] = []
        self.cordoned: set[str] = set()
        self.labels: dict[str, dict[str, str]] = {}

    def node(self, context: str | None, name: str) -> dict[str, Any]:
        assert context == "metal-admin"
        return {"status": {"allocatable": {k: str(v) for k, v in self.advertised[name].items()}}}

    def cordon(self, context: str | None, name: str) -> None:
        self.calls.append(("cordon", name, None))
        self.cordoned.add(name)

    def uncordon(self, context: str | None, name: str) -> None:
        self.calls.append(("uncordon", name, None))
        self.cordoned.discard(name)

    def label(self, context: str | None, name: str, labels: dict[str, str]) -> None:
        self.calls.append(("label", name, labels))
        self.labels.setdefault(name, {}).update(labels)


def confirmed() -> PulumiRunner:
    return PulumiRunner(confirm=lambda step: True)


def run(env: Path, journal: Journal, ansible: FakeAnsible, kube: FakeKube | None = None, **kw: Any):
    fleet = resolve(env)
    pulumi = kw.pop("pulumi", None) or confirmed()
    plan = plan_rollout(env, fleet, journal, kw.pop("batches", "1,50%,100%"), kubeconfig=kube is not None, **kw)
    return plan, execute(plan, journal, ansible, pulumi, kube,  # type: ignore[arg-type]
                         gate_timeout=0, poll_interval=0)


# ---------------------------------------------------------------- batches


@pytest.mark.parametrize(("spec", "count", "sizes"), [
    ("1,50%,100%", 6, [1, 3, 2]),
    ("1,50%,100%", 1, [1]),
    ("1,50%,100%", 3, [1, 1, 1]),
    ("2", 5, [2, 2, 1]),
    ("1,25%", 10, [1, 2, 2, 2, 2, 1]),
    ("100%", 4, [4]),
    ("10%", 4, [1, 1, 1, 1]),
])
def test_batches_are_cut_like_ansible_serial(spec: str, count: int, sizes: list[int]) -> None:
    hosts = [f"h{i}" for i in range(count)]
    batches = plan_batches(hosts, parse_batches(spec))
    assert [len(b) for b in batches] == sizes
    assert [h for b in batches for h in b] == hosts


@pytest.mark.parametrize("spec", ["0", "abc", "150%", "", "1,,2", "-1", "0%"])
def test_bad_batch_sizes_are_refused(spec: str) -> None:
    with pytest.raises(GpushareError) as err:
        parse_batches(spec)
    assert err.value.exit_code == 2
    assert err.value.problems[0].path == "--batches" and "1,50%,100%" in (err.value.problems[0].fix or "")


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


def test_kept_configs_are_written_for_the_pulumi_program(tmp_path: Path) -> None:
    old = resolve(six_host_env(tmp_path / "a"))
    new = resolve(six_host_env(tmp_path / "b", a100_profile="mig-small"))
    kept = kept_configs(old, new, tmp_path / "kept")
    assert [k["name"] for k in kept] == sorted(set(old.device_plugin_configs) - set(new.device_plugin_configs))
    from gpushare.core.resolve import device_plugin_digest
    from gpushare.render.fleet import parse_device_plugin

    for k in kept:
        content = parse_device_plugin((ROOT / k["file"]).read_text())
        assert k["name"].endswith(device_plugin_digest(content))
    assert kept_configs(None, new, tmp_path / "kept") == []
    assert kept_configs(new, new, tmp_path / "kept") == []


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


# ---------------------------------------------------------------- journal and snapshots


def test_journal_tolerates_a_cut_last_line_but_not_a_broken_middle(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl")
    journal.append({"event": "start", "rollout": "r1", "env": "dev", "batches": [],
                    "snapshot": {"name": "dev.yaml", "text": "", "profiles": {}}})
    journal.append({"event": "end", "rollout": "r1", "status": "failed"})
    with journal.path.open("a") as handle:
        handle.write('{"event": "ho')
    assert [e["event"] for e in journal.events()] == ["start", "end"]
    lines = journal.path.read_text().splitlines()
    journal.path.write_text("\n".join([lines[0], "not json", lines[1]]) + "\n")
    with pytest.raises(GpushareError) as err:
        journal.events()
    assert err.value.problems[0].file == str(journal.path) and "line 2" in err.value.problems[0].message


def test_snapshot_round_trips_and_resolves_the_same(tmp_path: Path) -> None:
    env = six_host_env(tmp_path)
    snap = Snapshot.of(env)
    again = Snapshot.from_dict(json.loads(json.dumps(snap.as_dict())))
    assert again == snap and again.fingerprint == snap.fingerprint
    path = again.materialize(tmp_path / "copy")
    assert (path.parent / "group_vars" / "all.yml").exists() and path.parent.name == "environments"
    assert resolve(path).as_dict()["pools"] == resolve(env).as_dict()["pools"]


def test_snapshot_from_git_reads_the_committed_files() -> None:
    import subprocess

    env = ROOT / "environments" / "pilot.yaml"
    head = Snapshot.from_git(ROOT, "HEAD", env)
    committed = subprocess.run(["git", "-C", str(ROOT), "show", "HEAD:environments/pilot.yaml"],
                               capture_output=True, text=True, check=True).stdout
    assert head.text == committed and "mig-balanced.yaml" in head.profiles
    with pytest.raises(GpushareError) as err:
        Snapshot.from_git(ROOT, "no-such-revision", env)
    assert err.value.problems[0].path == "--previous" and err.value.exit_code == 2


# ---------------------------------------------------------------- the command line


def test_dry_run_json_lists_batches_and_steps_and_writes_nothing(tmp_path: Path) -> None:
    env = six_host_env(tmp_path)
    journal = tmp_path / "state" / "journal.jsonl"
    result = CliRunner().invoke(app, ["rollout", "--env", str(env), "--dry-run", "--json", "--journal", str(journal)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [b["hosts"] for b in doc["batches"]] == [A100[:1], A100[1:], L4]
    assert [s["step"] for s in doc["steps"]] == ["check", "pulumi-add", "batch", "batch", "batch", "pulumi-prune"]
    assert doc["steps"][2]["limit"] == "a100-01" and doc["steps"][2]["gates"] == ["verify", "dcgm"]
    assert not journal.exists()


def test_rollout_of_an_environment_failing_check_refuses_to_start(tmp_path: Path) -> None:
    # prod does not allow mig-small-ts2 (policies/guardrails.yaml): `gpushare check` fails, so no rollout starts.
    env = six_host_env(tmp_path, name="prod", a100_profile="mig-small-ts2")
    journal = tmp_path / "state" / "journal.jsonl"
    result = CliRunner().invoke(app, ["rollout", "--env", str(env), "--journal", str(journal),
                                      "--pulumi-confirmed"])
    assert result.exit_code == 1, result.output
    assert "fails `gpushare check`" in result.output and "the rollout does not start" in result.output
    assert "profile-allowed" in result.output or "mig-small-ts2" in result.output
    assert not journal.exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--resume", "--rollback"], "--resume and --rollback together"),
    (["--batches", "0"], "is not a host count"),
    (["--kubeconfig", "/nonexistent/kubeconfig"], "file not found"),
])
def test_bad_options_are_refused(tmp_path: Path, args: list[str], message: str) -> None:
    env = six_host_env(tmp_path)
    result = CliRunner().invoke(app, ["rollout", "--env", str(env), "--dry-run", "--journal",
                                      str(tmp_path / "j.jsonl"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_command_line_shows_progress_and_the_outcome(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Rich display and the summary, with ansible-runner replaced by the recording fake."""
    from gpushare.ops.rollout import adapters

    env = six_host_env(tmp_path)
    fake = FakeAnsible()
    fake.fail["a100-02"] = ("rollout.yml", "converge", "Toolkit | preflight: 1.17.8 is below the CVE floor 1.18.2")

    def run_fake(self: adapters.AnsibleBackend, playbook: str, inventory: Path, hosts: list[str], label: str, gate: str
                 ) -> dict[str, HostOutcome]:
        for h in hosts:
            assert self.on_task is not None
            self.on_task(h, "Toolkit | preflight")
        return fake.run(playbook, inventory, hosts, label, gate)

    monkeypatch.setattr(adapters.AnsibleBackend, "run", run_fake)
    journal = tmp_path / "state" / "journal.jsonl"
    result = CliRunner().invoke(app, ["rollout", "--env", str(env), "--journal", str(journal),
                                      "--pulumi-confirmed"])
    assert result.exit_code == 1, result.output
    assert "rollout failed" in result.output and "a100-02 (converge)" in result.output
    assert "CVE floor" in result.output and "confirmed as run" in result.output
    assert "pulumi up -s dev" in result.output
    assert fake.hosts_run() == A100  # batch 2 ran whole; batch 3 never started
    # Non-interactive without confirmation: stops at the Pulumi step (exit 3) and names the commands.
    result = CliRunner().invoke(app, ["rollout", "--env", str(env), "--journal", str(tmp_path / "j2.jsonl")])
    assert result.exit_code == 3, result.output
    assert "rollout stopped" in result.output and "--resume --pulumi-confirmed" in result.output


def test_pulumi_runs_the_program_with_this_gpushare_s_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """A workspace's Pulumi.yaml names no interpreter of the machine that wrote it: the rollout tells Pulumi's
    Python language host to use the interpreter that runs gpushare (PULUMI_PYTHON_CMD), and keeps one a user set."""
    import sys
    from types import SimpleNamespace

    from pulumi import automation as auto

    seen: dict[str, Any] = {}

    def select_stack(stack_name: str, work_dir: str, opts: auto.LocalWorkspaceOptions) -> Any:
        seen.update(stack=stack_name, work_dir=work_dir, env=dict(opts.env_vars or {}))
        summary = SimpleNamespace(result="succeeded", resource_changes={})
        return SimpleNamespace(up=lambda **_: SimpleNamespace(summary=summary))

    monkeypatch.setattr(auto, "select_stack", select_stack)
    monkeypatch.delenv("PULUMI_PYTHON_CMD", raising=False)
    runner = PulumiRunner(confirm=lambda step: False)
    status, _ = runner._up(Step("pulumi-prune", {"stack": "dev", "commands": []}))
    assert status == "done" and seen["stack"] == "dev" and seen["env"] == {"PULUMI_PYTHON_CMD": sys.executable}
    monkeypatch.setenv("PULUMI_PYTHON_CMD", "/opt/python/bin/python3")
    runner._up(Step("pulumi-prune", {"stack": "dev", "commands": []}))
    assert seen["env"] == {"PULUMI_PYTHON_CMD": "/opt/python/bin/python3"}
