"""The tools a rollout drives, each behind a small interface the tests fake: an AnsibleRunner (playbooks through
ansible-runner), a PulumiSteps (Pulumi's Automation API, or a person running the printed commands) and a Kubectl
(the user's kubeconfig). The real adapters are AnsibleBackend, PulumiRunner and Kube."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.paths import ansible_environment, package_ansible, project_root
from gpushare.ops.rollout.plan import KEEP_CONFIGS_KEY, Step


@dataclass
class HostOutcome:
    host: str
    ok: bool
    gate: str = ""  # which gate failed
    message: str = ""
    changed: int = 0
    job: str = ""  # where an external runner (AWX) kept the run, journalled with the host


class AnsibleRunner(Protocol):
    def run(self, playbook: str, inventory: Path, hosts: list[str], label: str, gate: str
            ) -> dict[str, HostOutcome]:
        """One playbook run limited to `hosts`; an outcome per host, failures attributed to `gate` (or DCGM)."""
        ...


class PulumiSteps(Protocol):
    def run(self, step: Step) -> tuple[str, str]:
        """(status, detail): done, skipped, waiting (a person must run the commands first) or failed."""
        ...


class Kubectl(Protocol):
    def node(self, context: str | None, name: str) -> dict[str, Any]: ...

    def resource_slices(self, context: str | None, node: str) -> list[dict[str, Any]]: ...

    def cordon(self, context: str | None, name: str) -> None: ...

    def uncordon(self, context: str | None, name: str) -> None: ...

    def label(self, context: str | None, name: str, labels: dict[str, str]) -> None: ...


# ---------------------------------------------------------------- Ansible


def _gate_of(task: str, default: str) -> str:
    return "dcgm" if task.startswith("DCGM |") else default


def _failure(events: list[dict[str, Any]], host: str, gate: str) -> tuple[str, str] | None:
    """(gate, message) of the host's last failed task that counts (not ignored, not rescued)."""
    found = None
    for ev in events:
        data = ev.get("event_data", {})
        if data.get("host") != host or ev.get("event") not in ("runner_on_failed", "runner_on_unreachable"):
            continue
        if data.get("ignore_errors") or ev.get("event") == "runner_on_failed" and data.get("rescued"):
            continue
        res = data.get("res", {})
        task = str(data.get("task", ""))
        found = _gate_of(task, gate), f"{task}: {res.get('msg') or res.get('stderr') or 'failed'}"
    return found


def host_outcome(host: str, stats: dict[str, Any], events: list[dict[str, Any]], playbook: str, gate: str,
                 log: Path) -> HostOutcome:
    """One host's outcome from ansible-runner's stats and events."""
    failed = int(stats.get("failures", {}).get(host, 0)) > 0 or int(stats.get("dark", {}).get(host, 0)) > 0
    seen = any(host in stats.get(k, {}) for k in ("ok", "failures", "dark", "skipped", "changed"))
    outcome = HostOutcome(host, ok=seen and not failed, changed=int(stats.get("changed", {}).get(host, 0)))
    if not seen:
        outcome.gate, outcome.message = gate, f"{playbook} did not run on {host} (log: {log})"
    failure = _failure(events, host, gate)
    if failure is not None:
        outcome.gate, outcome.message = failure
    if failed and not outcome.message:
        outcome.gate, outcome.message = gate, f"{playbook} failed on {host} (log: {log})"
    return outcome


class AnsibleBackend:
    """The playbooks through ansible-runner, one call per batch with `--limit`."""

    def __init__(self, logs: Path, forks: int = 10, kubeconfig: Path | None = None,
                 on_task: Callable[[str, str], None] | None = None, strategy_env: dict[str, str] | None = None) -> None:
        self.logs = logs
        self.forks = forks
        # Settings that pick the converge plays' strategy (mitogen_environment() for --mitogen); none for `free`.
        self.strategy_env = strategy_env or {}
        self.kubeconfig = kubeconfig
        self.on_task = on_task
        self.calls = 0

    def _handler(self, event: dict[str, Any]) -> bool:
        data = event.get("event_data", {})
        if self.on_task and event.get("event") in ("runner_on_start", "runner_on_ok", "runner_on_failed"):
            host, task = data.get("host"), data.get("task")
            if host and task:
                self.on_task(host, task)
        return True

    def run(self, playbook: str, inventory: Path, hosts: list[str], label: str, gate: str) -> dict[str, HostOutcome]:
        import ansible_runner

        root = project_root()
        self.calls += 1
        self.logs.mkdir(parents=True, exist_ok=True)
        # Ansible does not walk up: the workspace's ansible.cfg is named, and the package's playbooks run with its
        # own roles, modules and inventory plugin whatever that file says.
        env = {**ansible_environment(root),
               "ANSIBLE_CONFIG": os.environ.get("ANSIBLE_CONFIG", str(root / "ansible.cfg")),
               "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]),
               **self.strategy_env}
        extravars: dict[str, Any] = {}
        if self.kubeconfig is not None:
            extravars["gpushare_kubeconfig"] = str(self.kubeconfig)
        with tempfile.TemporaryDirectory(prefix="gpushare-runner-") as private:
            result = ansible_runner.run(
                private_data_dir=private, project_dir=str(root), playbook=str(package_ansible(playbook)),
                inventory=str(inventory), limit=",".join(hosts), envvars=env, extravars=extravars, quiet=True,
                forks=self.forks, event_handler=self._handler)
            log = self.logs / f"{label}.log"
            log.write_text(result.stdout.read())
            events = list(result.events)
            stats = result.stats or {}  # read from the artifacts directory, so before it goes
        return {host: host_outcome(host, stats, events, playbook, gate, log) for host in hosts}


# ---------------------------------------------------------------- kubectl

# Seconds one kubectl call may take: a get, cordon, uncordon or label, none of which waits on the cluster.
KUBECTL_TIMEOUT = 120


class Kube:
    """kubectl with the user's kubeconfig (and each cluster's context), as the roles call it."""

    def __init__(self, kubeconfig: Path, kubectl: str = "kubectl") -> None:
        self.kubeconfig = kubeconfig
        self.kubectl = kubectl

    def _run(self, context: str | None, *args: str) -> str:
        cmd = [self.kubectl, f"--kubeconfig={self.kubeconfig}"]
        if context:
            cmd.append(f"--context={context}")
        try:
            done = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=KUBECTL_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise GpushareError(Problem(f"kubectl {' '.join(args)} failed: {exc}",
                                        fix="install kubectl on PATH and check --kubeconfig"), exit_code=2) from None
        if done.returncode != 0:
            raise GpushareError(Problem(f"kubectl {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}",
                                        fix="check --kubeconfig and that the node exists"), exit_code=2)
        return done.stdout

    def node(self, context: str | None, name: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self._run(context, "get", "node", name, "-o", "json"))
        return doc

    def resource_slices(self, context: str | None, node: str) -> list[dict[str, Any]]:
        """The ResourceSlices DRA drivers publish for one node (resource.k8s.io/v1, Kubernetes 1.34+)."""
        doc = json.loads(self._run(context, "get", "resourceslices.resource.k8s.io",
                                   f"--field-selector=spec.nodeName={node}", "-o", "json"))
        items: list[dict[str, Any]] = doc.get("items", [])
        return items

    def cordon(self, context: str | None, name: str) -> None:
        self._run(context, "cordon", name)

    def uncordon(self, context: str | None, name: str) -> None:
        self._run(context, "uncordon", name)

    def label(self, context: str | None, name: str, labels: dict[str, str]) -> None:
        self._run(context, "label", "node", name, *[f"{k}={v}" for k, v in labels.items()], "--overwrite")


# ---------------------------------------------------------------- Pulumi


def pulumi_environment() -> dict[str, str]:
    """What the Pulumi CLI runs the workspace's program with where Pulumi.yaml sets no virtualenv (PULUMI_PYTHON_CMD
    is the Python language host's setting for it): the interpreter running gpushare, which has the package."""
    return {"PULUMI_PYTHON_CMD": os.environ.get("PULUMI_PYTHON_CMD", sys.executable)}


PULUMI_ERROR_LINES = 12  # of a failed `pulumi up`'s output, kept in the journal


class PulumiRunner:
    """Pulumi through its Automation API when the CLI is installed; otherwise the exact commands for a person."""

    def __init__(self, confirm: Callable[[Step], bool], on_output: Callable[[str], None] | None = None) -> None:
        self.confirm = confirm
        self.on_output = on_output

    @staticmethod
    def available() -> bool:
        return shutil.which("pulumi") is not None

    def run(self, step: Step) -> tuple[str, str]:
        """(status, detail): done, skipped, waiting (a person must run the commands first) or failed (the
        engine refused or a resource errored)."""
        if step.detail.get("skip"):
            return "skipped", str(step.detail["skip"])
        if not self.available():
            if self.confirm(step):
                return "done", "confirmed: " + "; ".join(step.detail["commands"])
            return "waiting", "the Pulumi CLI is not installed"
        return self._up(step)

    def stack(self, name: str) -> Any:
        """The workspace's stack (an Automation API Stack), its program run by the Pulumi CLI."""
        from pulumi import automation as auto

        # The workspace's Pulumi.yaml names no interpreter (or only its own .venv): without one, Pulumi runs the
        # program with this gpushare's Python, wherever it is installed on this machine.
        return auto.select_stack(stack_name=name, work_dir=str(project_root()),
                                 opts=auto.LocalWorkspaceOptions(env_vars=pulumi_environment()))

    def _up(self, step: Step) -> tuple[str, str]:
        from pulumi import automation as auto

        stack = self.stack(step.detail["stack"])
        if step.step == "pulumi-add" and step.detail.get("keep"):
            for i, entry in enumerate(step.detail["keep"]):
                stack.set_config(f"{KEEP_CONFIGS_KEY}[{i}].name", auto.ConfigValue(value=entry["name"]), path=True)
                stack.set_config(f"{KEEP_CONFIGS_KEY}[{i}].file", auto.ConfigValue(value=entry["file"]), path=True)
        if step.step == "pulumi-prune" and step.detail.get("keep"):
            stack.remove_config(KEEP_CONFIGS_KEY)
        try:
            result = stack.up(on_output=self.on_output, message=f"gpushare rollout: {step.step}")
        except auto.CommandError as err:
            # The engine's own diagnostics (its `error:` lines, else its last lines): journalled; the rollout stops.
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            errors = [line for line in lines if line.startswith("error:")]
            return "failed", "pulumi up failed: " + " | ".join((errors or lines)[-PULUMI_ERROR_LINES:])
        return "done", f"pulumi up: {result.summary.result} ({json.dumps(result.summary.resource_changes or {})})"
