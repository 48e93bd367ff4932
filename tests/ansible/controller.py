"""The controller side of gpushare's Ansible tests: ansible-runner runs of the real playbooks with the project's
ansible.cfg, and the recording kubectl test double first on PATH."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner

from tests.ansible.testbed import BUILD, ROOT

HERE = Path(__file__).resolve().parent
KUBECTL_DIR = HERE / "bin"
ENVIRONMENTS = HERE / "environments"


@dataclass
class PlaybookRun:
    playbook: str
    rc: int
    status: str
    stats: dict[str, dict[str, int]]
    events: list[dict[str, Any]] = field(repr=False)
    log: Path

    def count(self, kind: str, host: str) -> int:
        return int((self.stats or {}).get(kind, {}).get(host, 0))

    def changed(self, host: str) -> int:
        return self.count("changed", host)

    def failed(self, host: str) -> bool:
        return self.count("failures", host) > 0 or self.count("dark", host) > 0

    def failures(self, host: str) -> list[str]:
        """The messages of the host's failed tasks (rescued ones included), in order."""
        out = []
        for ev in self.events:
            data = ev.get("event_data", {})
            if ev.get("event") in ("runner_on_failed", "runner_on_unreachable") and data.get("host") == host:
                res = data.get("res", {})
                out.append(f"{data.get('task')}: {res.get('msg') or res.get('stderr') or res}")
        return out

    def task_results(self, host: str, task: str) -> list[dict[str, Any]]:
        out = []
        for ev in self.events:
            data = ev.get("event_data", {})
            if ev.get("event", "").startswith("runner_on_") and data.get("host") == host and data.get("task") == task:
                out.append(data.get("res", {}))
        return out

    def changed_tasks(self, host: str) -> list[str]:
        return [ev["event_data"]["task"] for ev in self.events
                if ev.get("event") == "runner_on_ok" and ev["event_data"].get("host") == host
                and ev["event_data"].get("res", {}).get("changed")]

    def summary(self) -> str:
        return f"{self.playbook}: rc={self.rc} status={self.status} stats={json.dumps(self.stats)} (log: {self.log})"


class Controller:
    def __init__(self, workdir: Path, key: Path, forks: int = 10):
        self.workdir = workdir
        self.key = key
        self.forks = forks
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.kubectl_state = workdir / "kubectl-state.json"
        self.kubectl_log = workdir / "kubectl-calls.jsonl"
        self.kubeconfig = workdir / "kubeconfig"
        self.kubeconfig.write_text("# the kubectl test double reads no kubeconfig; it records the path it is given\n")
        # One log per playbook run, kept after the session for reading failures (the next session removes them).
        self.logs = BUILD / "logs" / str(os.getpid())
        for old in (BUILD / "logs").glob("*"):
            if old.name.isdigit() and not Path(f"/proc/{old.name}").exists():
                shutil.rmtree(old, ignore_errors=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.runs = 0

    # -- the Kubernetes test double

    def seed_nodes(self, nodes: dict[str, dict[str, str]]) -> None:
        self.kubectl_state.write_text(json.dumps({
            "nodes": {name: {"labels": labels, "unschedulable": False} for name, labels in nodes.items()},
            "pods": []}, indent=1))
        self.kubectl_log.write_text("")

    def add_pod(self, node: str, name: str, gpu: bool = True, pdb_blocked: bool = False) -> None:
        data = json.loads(self.kubectl_state.read_text())
        resources = {"limits": {"nvidia.com/gpu": 1}} if gpu else {}
        data["pods"].append({"node": node, "pdb_blocked": pdb_blocked, "object": {
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "main", "resources": resources}]},
            "status": {"phase": "Running"}}})
        self.kubectl_state.write_text(json.dumps(data, indent=1))

    def node(self, name: str) -> dict[str, Any]:
        return json.loads(self.kubectl_state.read_text())["nodes"][name]

    def kubectl_calls(self, node: str | None = None, since: float = 0.0) -> list[dict[str, Any]]:
        calls = [json.loads(line) for line in self.kubectl_log.read_text().splitlines() if line.strip()]
        return [c for c in calls if c["t"] >= since and (node is None or c["node"] == node)]

    def mutating_calls(self, node: str, since: float = 0.0) -> list[dict[str, Any]]:
        return [c for c in self.kubectl_calls(node, since) if c["verb"] != "get"]

    # -- Ansible

    def env(self) -> dict[str, str]:
        venv_bin = str(Path(sys.executable).parent)
        return {
            "PATH": os.pathsep.join([str(KUBECTL_DIR), venv_bin, os.environ.get("PATH", "/usr/bin:/bin")]),
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_PRIVATE_KEY_FILE": str(self.key),
            "ANSIBLE_HOST_KEY_CHECKING": "False",
            "ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3",
            "ANSIBLE_SSH_ARGS": "-o ControlMaster=auto -o ControlPersist=300s -o UserKnownHostsFile=/dev/null "
                                "-o StrictHostKeyChecking=no -o LogLevel=ERROR",
            "ANSIBLE_FORKS": str(self.forks),
            "ANSIBLE_NOCOLOR": "1",
            "KUBECTL_DOUBLE_STATE": str(self.kubectl_state),
            "KUBECTL_DOUBLE_LOG": str(self.kubectl_log),
        }

    def run(self, playbook: str, inventory: Path, extravars: dict[str, Any] | None = None,
            limit: str | None = None, label: str = "", env: dict[str, str] | None = None) -> PlaybookRun:
        """A playbook of the checkout's playbooks/ (or at an absolute path), with `env` over the controller's."""
        self.runs += 1
        private = self.workdir / f"runner-{self.runs:02d}"
        shutil.rmtree(private, ignore_errors=True)
        private.mkdir(parents=True)
        result = ansible_runner.run(
            private_data_dir=str(private), project_dir=str(ROOT), playbook=str(ROOT / "playbooks" / playbook),
            inventory=str(inventory), envvars={**self.env(), **(env or {})}, limit=limit, quiet=True, forks=self.forks,
            extravars={"gpushare_kubeconfig": str(self.kubeconfig), **(extravars or {})},
        )
        log = self.logs / f"{self.runs:02d}-{label or Path(playbook).stem}.log"
        log.write_text(result.stdout.read())
        events = list(result.events)
        stats = result.stats or {}
        shutil.rmtree(private, ignore_errors=True)
        return PlaybookRun(playbook=playbook, rc=result.rc, status=result.status, stats=stats, events=events,
                           log=log)
