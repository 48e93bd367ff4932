#!/usr/bin/python
"""Ansible module: cordon, drain, uncordon and label one Kubernetes node through kubectl (run on the controller)."""

from __future__ import annotations

import json
import time

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: kube_node
author: gpushare maintainers (@gpushare)
short_description: Cordon, drain, uncordon and label a Kubernetes node through kubectl
description:
  - Reads the node first and acts only on what differs (labels, schedulability); reports C(changed) accordingly.
  - Drains with the eviction API (PodDisruptionBudgets are respected) and a timeout, or waits for the node's GPU
    pods to finish, for long training jobs that must not be evicted.
  - Order within one call, so a node is never schedulable half-configured - cordon, drain, label, uncordon.
  - Meant to run on the controller (C(delegate_to) C(localhost)) with the kubeconfig the user gives.
options:
  node:
    description: Node name.
    type: str
    required: true
  kubectl:
    description: kubectl executable.
    type: str
    default: kubectl
  kubeconfig:
    description: Path of the kubeconfig; empty for kubectl's default.
    type: str
    default: ""
  context:
    description: kubeconfig context; empty for the current one.
    type: str
    default: ""
  schedulable:
    description: C(false) cordons, C(true) uncordons; omitted leaves it as it is.
    type: bool
  drain:
    description: Drain the node (cordons it first).
    type: bool
    default: false
  drain_mode:
    description: C(evict) evicts pods (respecting PodDisruptionBudgets); C(wait) waits for the node's GPU pods to end.
    type: str
    choices: [evict, wait]
    default: evict
  drain_timeout:
    description: Seconds to wait for the drain or for the GPU pods.
    type: int
    default: 600
  poll_interval:
    description: Seconds between checks in C(wait) mode.
    type: int
    default: 10
  gpu_resource_prefix:
    description: Pods requesting resources with this prefix are GPU pods.
    type: str
    default: nvidia.com/
  labels:
    description: Labels to set (only these keys are touched; others stay).
    type: dict
"""

EXAMPLES = r"""
- name: Drain the node before its MIG layout changes (PodDisruptionBudgets respected), from the controller
  gpushare.fleet.kube_node:
    node: "{{ inventory_hostname }}"
    kubeconfig: ~/.kube/gpushare-dev
    context: dev-metal
    drain: true
    drain_timeout: 900
  delegate_to: localhost
  become: false

- name: Wait, cordoned, for the node's GPU pods (long training jobs) to end rather than evict them
  gpushare.fleet.kube_node:
    node: "{{ inventory_hostname }}"
    drain: true
    drain_mode: wait
    drain_timeout: 86400
    poll_interval: 60
  delegate_to: localhost
  become: false

- name: Mark a failed MIG change on the node and keep it cordoned
  gpushare.fleet.kube_node:
    node: "{{ inventory_hostname }}"
    labels:
      gpushare.io/mig-config.state: failed
    schedulable: false
  delegate_to: localhost
  become: false

- name: Let pods back on once the node is healthy
  gpushare.fleet.kube_node:
    node: "{{ inventory_hostname }}"
    schedulable: true
  delegate_to: localhost
  become: false
"""

RETURN = r"""
commands:
  description: The kubectl commands that changed something, in order.
  returned: always
  type: list
labels:
  description: The node's labels after the call (empty for a drain that evicts, which does not read the node).
  returned: always
  type: dict
unschedulable:
  description: Whether the node is cordoned after the call.
  returned: always
  type: bool
"""


ARGUMENT_SPEC = {
    "node": {"type": "str", "required": True},
    "kubectl": {"type": "str", "default": "kubectl"},
    "kubeconfig": {"type": "str", "default": ""},
    "context": {"type": "str", "default": ""},
    "schedulable": {"type": "bool"},
    "drain": {"type": "bool", "default": False},
    "drain_mode": {"type": "str", "choices": ["evict", "wait"], "default": "evict"},
    "drain_timeout": {"type": "int", "default": 600},
    "poll_interval": {"type": "int", "default": 10},
    "gpu_resource_prefix": {"type": "str", "default": "nvidia.com/"},
    "labels": {"type": "dict"},
}


class Kubectl:
    def __init__(self, module):
        self.module = module
        p = module.params
        self.base = [p["kubectl"]]
        if p["kubeconfig"]:
            self.base += ["--kubeconfig", p["kubeconfig"]]
        if p["context"]:
            self.base += ["--context", p["context"]]
        self.commands = []

    def run(self, *args, record=False):
        cmd = self.base + list(args)
        rc, out, err = self.module.run_command(cmd)
        if rc != 0:
            self.module.fail_json(msg=f"kubectl failed ({rc}): {err.strip() or out.strip()}", cmd=cmd,
                                  commands=self.commands)
        if record:
            self.commands.append(" ".join(cmd))
        return out

    def json(self, *args, node):
        """kubectl's JSON answer to `args`, an object; the task fails naming the node, the command and the field
        where kubectl printed something else (a proxy's HTML page, a plugin's text, another shape)."""
        out = self.run(*args)
        shown = " ".join(self.base + list(args))
        try:
            data = json.loads(out)
        except (ValueError, RecursionError) as exc:
            self.refuse(node, shown, f"printed something that is not JSON ({exc}): {out.strip()[:200]!r}")
        if not isinstance(data, dict):
            self.refuse(node, shown, f"printed {_kind(data)} at the top level, not an object")
        return data

    def node(self, name):
        data = self.json("get", "node", name, "-o", "json", node=name)
        shown = " ".join(self.base + ["get", "node", name, "-o", "json"])
        for field, value, want in (("metadata", data.get("metadata"), dict), ("spec", data.get("spec"), dict),
                                   ("metadata.labels", (data.get("metadata") or {}).get("labels"), dict),
                                   ("spec.unschedulable", (data.get("spec") or {}).get("unschedulable"), bool)):
            if value is not None and not isinstance(value, want):
                self.refuse(name, shown, f"field {field} is {_kind(value)}, not {_kind(want())}")
        return data

    def refuse(self, node, command, problem):
        done = "; ".join(self.commands) or "none"
        self.module.fail_json(msg=f"node {node}: `{command}` {problem}; stopped there (kubectl commands that "
                              f"changed the node before: {done}) (fix: run the command by hand and check that "
                              "kubectl, the kubeconfig and its context reach the Kubernetes API server and that "
                              "no plugin, wrapper or proxy prints other output)", commands=self.commands)


_KINDS = {str: "a string", int: "a number", float: "a number", bool: "a boolean", type(None): "null",
          dict: "an object", list: "a list"}


def _kind(value):
    return _KINDS.get(type(value), type(value).__name__)


def gpu_pods(pods, prefix):
    """Names of pods still holding or about to hold GPUs: running or pending, requesting a GPU resource."""
    found = []
    for pod in pods.get("items", []):
        if pod.get("status", {}).get("phase") not in ("Pending", "Running"):
            continue
        for container in pod.get("spec", {}).get("containers", []):
            resources = container.get("resources", {})
            wanted = list(resources.get("limits", {})) + list(resources.get("requests", {}))
            if any(name.startswith(prefix) for name in wanted):
                meta = pod.get("metadata", {})
                found.append("{}/{}".format(meta.get("namespace", "default"), meta.get("name")))
                break
    return found


def label_changes(current, wanted):
    return {k: v for k, v in sorted(wanted.items()) if current.get(k) != v}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    kubectl = Kubectl(module)
    name = p["node"]
    # `kubectl drain` cordons the node itself: a drain that evicts needs neither the node read nor a cordon first
    # (each kubectl call is a process on the controller, per host).
    evict_only = p["drain"] and p["drain_mode"] == "evict" and not p["labels"] and p["schedulable"] is None
    node = {} if evict_only else kubectl.node(name)
    labels = dict((node.get("metadata") or {}).get("labels") or {})
    unschedulable = bool((node.get("spec") or {}).get("unschedulable", False))
    changed = False

    if evict_only:
        unschedulable = True  # the drain below cordons first
    elif (p["drain"] or p["schedulable"] is False) and not unschedulable:
        changed = True
        if not module.check_mode:
            kubectl.run("cordon", name, record=True)
        unschedulable = True

    if p["drain"]:
        changed = True
        if not module.check_mode:
            if p["drain_mode"] == "evict":
                kubectl.run("drain", name, "--ignore-daemonsets", "--delete-emptydir-data",
                            f"--timeout={p['drain_timeout']}s", record=True)
            else:
                wait_for_gpu_pods(module, kubectl, name)

    if p["labels"]:
        wanted = {str(k): str(v) for k, v in p["labels"].items()}
        diff = label_changes(labels, wanted)
        if diff:
            changed = True
            if not module.check_mode:
                kubectl.run("label", "node", name, "--overwrite", *["{}={}".format(*kv) for kv in diff.items()],
                            record=True)
            labels.update(diff)

    if p["schedulable"] is True and unschedulable:
        changed = True
        if not module.check_mode:
            kubectl.run("uncordon", name, record=True)
        unschedulable = False

    module.exit_json(changed=changed, commands=kubectl.commands, labels=labels, unschedulable=unschedulable)


def wait_for_gpu_pods(module, kubectl, name):
    p = module.params
    deadline = time.monotonic() + p["drain_timeout"]
    while True:
        pods = kubectl.json("get", "pods", "--all-namespaces", "--field-selector", f"spec.nodeName={name}", "-o",
                            "json", node=name)
        items = pods.get("items") or []
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            kubectl.refuse(name, f"kubectl get pods --field-selector spec.nodeName={name} -o json",
                            "printed a field items that is not a list of objects")
        busy = gpu_pods(pods, p["gpu_resource_prefix"])
        if not busy:
            return
        if time.monotonic() >= deadline:
            module.fail_json(msg=f"GPU pods still run on {name} after {p['drain_timeout']}s: {', '.join(busy)}; "
                             "the node stays cordoned", pods=busy, commands=kubectl.commands)
        time.sleep(p["poll_interval"])


if __name__ == "__main__":
    main()
