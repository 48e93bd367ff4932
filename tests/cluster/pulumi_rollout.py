"""`gpushare rollout` of a workspace's stack with the real engine, run in a process of its own:

    python -m tests.cluster.pulumi_rollout --env dev --previous REV --kubeconfigs JSON --out FILE

The working directory is the workspace, a Git work tree. The plan is gpushare's own (`plan_rollout`), executed by
gpushare's own `execute` with its own Pulumi steps (`PulumiRunner`: `pulumi config set --path` of the configs to
keep, `pulumi up`, then `pulumi config rm` and `pulumi up`); only the program reaches the engine inline, as in
tests/cluster/pulumi_inline.py (the Python language host cannot be built from the module proxy).

The hosts of the batches are kwok nodes, with no machine behind them, so the Ansible runner is a stand-in that does
on the API server what playbooks/rollout.yml's gpu_sharing role does there: it sets each node's
`nvidia.com/device-plugin.config` to the config the new revision gives it, and records the sharing-config ConfigMap
as it found it at that moment. Its verify gate passes. The answer (the result, every relabel with what the ConfigMap
held, the journal's events) is written as JSON to --out."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gpushare.ops.rollout.adapters import HostOutcome, PulumiRunner
from tests.cluster.kube import Kube
from tests.cluster.pulumi_inline import inline_stack

CONFIG_LABEL = "nvidia.com/device-plugin.config"


class InlinePulumi(PulumiRunner):
    """gpushare's Pulumi steps, the workspace's stack running gpushare's program inline."""

    def stack(self, name: str) -> Any:
        return inline_stack(name)


class SharingRole:
    """What the gpu_sharing role changes on the API server: the node's device-plugin config label, once the
    host is converged."""

    def __init__(self, kubes: dict[str, Kube], targets: dict[str, tuple[str, str]], configmap: tuple[str, str]
                 ) -> None:
        self.kubes, self.targets, self.configmap = kubes, targets, configmap  # host -> (cluster, config)
        self.relabels: list[dict[str, Any]] = []
        self.calls: list[dict[str, Any]] = []

    def run(self, playbook: str, inventory: Path, hosts: list[str], label: str, gate: str
            ) -> dict[str, HostOutcome]:
        self.calls.append({"playbook": playbook, "hosts": hosts, "gate": gate})
        if gate != "converge":
            return {h: HostOutcome(h, True) for h in hosts}
        for host in hosts:
            cluster, config = self.targets[host]
            kube = self.kubes[cluster]
            name, namespace = self.configmap
            found = kube.get("v1", "ConfigMap", name, namespace)
            node = kube.get("v1", "Node", host)
            assert node is not None, host
            before = node["metadata"].get("labels", {}).get(CONFIG_LABEL)
            answer = kube.apply({"apiVersion": "v1", "kind": "Node",
                                 "metadata": {"name": host, "labels": {CONFIG_LABEL: config}}}, manager="ansible")
            assert answer.allowed, answer.message
            self.relabels.append({"host": host, "from": before, "to": config,
                                  "configs": sorted((found or {}).get("data", {}))})
        return {h: HostOutcome(h, True, changed=1) for h in hosts}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", required=True)
    parser.add_argument("--previous", required=True)
    parser.add_argument("--kubeconfigs", required=True, help="JSON: environment cluster -> its kubeconfig file")
    parser.add_argument("--targets", required=True, help="JSON: host -> [cluster, the config the revision gives it]")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    from gpushare.core.resolve import resolve_env
    from gpushare.ops.rollout.batches import DEFAULT_BATCHES
    from gpushare.ops.rollout.execute import execute
    from gpushare.ops.rollout.journal import Journal
    from gpushare.ops.rollout.plan import plan_rollout, state_dir
    from gpushare.program.components.operator_values import DEVICE_PLUGIN_CONFIGMAP, NAMESPACE

    fleet = resolve_env(args.env)
    journal = Journal(state_dir(fleet.environment) / "journal.jsonl")
    plan = plan_rollout(fleet.source, fleet, journal, DEFAULT_BATCHES, previous=args.previous)
    kubes = {c: Kube(Path(p)) for c, p in json.loads(args.kubeconfigs).items()}
    role = SharingRole(kubes, {h: (c, v) for h, (c, v) in json.loads(args.targets).items()},
                       (DEVICE_PLUGIN_CONFIGMAP, NAMESPACE))
    output: list[str] = []
    result = execute(plan, journal, role, InlinePulumi(confirm=lambda step: False, on_output=output.append),
                     kube=None)
    answer = {"status": result.status, "reason": result.reason, "steps": [s.as_dict() for s in plan.steps],
              "relabels": role.relabels, "calls": role.calls,
              "journal": [json.loads(line) for line in journal.path.read_text().splitlines()],
              "output": "".join(f"{line}\n" for line in output)}
    Path(args.out).write_text(json.dumps(answer, indent=1, default=str))
    return 0 if result.status == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
