"""What the rollout tests share: a six-host environment (four A100 hosts, two L4), and recording fakes of the
Ansible and Kubernetes sides (tests/ansible/test_ansible_rollout.py runs the same flow for real against isolated test
hosts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpushare.core.resolve import resolve
from gpushare.ops.rollout.adapters import HostOutcome, PulumiRunner
from gpushare.ops.rollout.execute import execute
from gpushare.ops.rollout.journal import Journal
from gpushare.ops.rollout.plan import plan_rollout

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
