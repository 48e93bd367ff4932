"""`gpushare rollout` from the command line: `--dry-run --json` lists batches and steps and writes nothing, an
environment failing `check` is refused before anything starts, bad options are refused, and the command shows its
progress and the outcome (with the recording fakes of tests/unit/ops/rollout/helpers.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.ops.rollout.adapters import HostOutcome
from tests.unit.ops.rollout.helpers import A100, L4, FakeAnsible, six_host_env

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
