"""The real engine through a rollout and a destroy (a dev stack on API servers of its own):

- a sharing change (dev's L4 pool moved from four-way to two-way time-slicing, a new profile) goes through
  `gpushare rollout`'s own plan and Pulumi steps with the real engine (tests/cluster/pulumi_rollout.py): the new
  sharing config is in the ConfigMap before any node is relabelled, the old one stays while nodes are relabelled and
  is pruned only after, the journal records each step, and the stack is converged afterwards (an `up` is empty);
- `pulumi destroy` removes what the stack created and leaves what it only adopted: the nodes it labelled (with the
  labels other managers own), the namespaces and CRDs of what the cluster already ran."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.program.components.operator_values import DEVICE_PLUGIN_CONFIGMAP, NAMESPACE
from tests.cluster.conftest import ClusterFactory
from tests.cluster.kube import Kube, eventually
from tests.cluster.nodes import plan_json, planned_nodes
from tests.cluster.pulumi_rollout import CONFIG_LABEL
from tests.cluster.test_pulumi_up import PREEXISTING_NAMESPACES, Stack, brought_up, server_object

POOL, OLD_PROFILE, NEW_PROFILE = "l4-notebooks", "notebooks-ts4", "notebooks-ts2"


@pytest.fixture(scope="module")
def dev(clusters: ClusterFactory, tmp_path_factory: pytest.TempPathFactory) -> Stack:
    return brought_up("dev", clusters, tmp_path_factory, "ro")


def git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(folder), "-c", "user.name=gpushare tests",
                           "-c", "user.email=tests@gpushare.invalid", *args],
                          capture_output=True, text=True, check=True, timeout=60)
    return done.stdout.strip()


def config_labels(folder: Path, cluster: str) -> dict[str, str]:
    """host -> the device-plugin config the workspace's dev.yaml gives it (gpushare plan --json)."""
    return {n["name"]: n["labels"][CONFIG_LABEL]["value"]
            for n in planned_nodes(plan_json("dev", root=folder), cluster) if CONFIG_LABEL in n["labels"]}


def configmap_keys(kube: Kube) -> set[str]:
    found = kube.get("v1", "ConfigMap", DEVICE_PLUGIN_CONFIGMAP, NAMESPACE)
    assert found is not None, "the device-plugin configs ConfigMap is not on the server"
    return set(found.get("data", {}))


@pytest.fixture(scope="module")
def rolled_out(dev: Stack) -> dict[str, Any]:
    """The workspace committed as the fleet runs it, the pool moved to the new profile, then `gpushare rollout`."""
    folder, cluster = dev.workspace.folder, "dev-metal"
    (folder / ".gitignore").write_text(".state/\n.pulumi-home/\n.gpushare/\n.answer-*\nkubeconfig\n")
    git(folder, "init", "-q")
    git(folder, "add", "-A")
    git(folder, "commit", "-qm", "the fleet as it runs")
    previous = git(folder, "rev-parse", "HEAD")
    before = config_labels(folder, cluster)

    profile = yaml.safe_load((folder / "profiles" / f"{OLD_PROFILE}.yaml").read_text())
    profile["name"], profile["time_slicing"]["replicas"] = NEW_PROFILE, 2
    (folder / "profiles" / f"{NEW_PROFILE}.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    env_path = folder / "environments" / "dev.yaml"
    env = yaml.safe_load(env_path.read_text())
    next(p for p in env["pools"] if p["name"] == POOL)["profile"] = NEW_PROFILE
    env_path.write_text(yaml.safe_dump(env, sort_keys=False))
    git(folder, "add", "-A")
    git(folder, "commit", "-qm", f"{POOL}: two-way time-slicing")
    after = config_labels(folder, cluster)

    kube = dev.kubes[cluster]
    old_keys = configmap_keys(kube)
    out = folder / ".answer-rollout.json"
    kubeconfigs = dict(zip(dev.kubes, map(str, dev.workspace.kubeconfigs), strict=True))
    targets = {host: [cluster, config] for host, config in after.items()}
    done = subprocess.run([sys.executable, "-m", "tests.cluster.pulumi_rollout", "--env", "dev",
                           "--previous", previous, "--kubeconfigs", json.dumps(kubeconfigs),
                           "--targets", json.dumps(targets), "--out", str(out)],
                          cwd=folder, env=dev.workspace.env(), capture_output=True, text=True, timeout=1500,
                          check=False)
    assert out.is_file(), f"the rollout gave no answer:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    answer: dict[str, Any] = json.loads(out.read_text())
    answer.update(before=before, after=after, old_keys=sorted(old_keys), final_keys=sorted(configmap_keys(kube)),
                  stderr=done.stderr[-4000:])
    return answer


def test_a_sharing_change_rolls_out_through_gpushares_pulumi_steps(rolled_out: dict[str, Any], dev: Stack) -> None:
    a = rolled_out
    assert a["status"] == "succeeded", "\n".join(
        [a["reason"], a["stderr"], *[line for line in a["output"].splitlines() if "error" in line.lower()]])
    changed = {h for h in a["after"] if a["after"][h] != a["before"][h]}
    assert len(changed) == 1, (a["before"], a["after"])
    host = changed.pop()
    old, new = a["before"][host], a["after"][host]
    assert old in a["old_keys"] and new not in a["old_keys"]

    # The journal: the add step, then every host's batch, then the prune step; each Pulumi step ran the engine.
    events = a["journal"]
    steps = [(e["step"], e["status"]) for e in events if e["event"] == "step"]
    assert steps == [("pulumi-add", "done"), ("pulumi-prune", "done")], steps
    order = [e.get("step") or e["event"] for e in events if e["event"] in ("step", "batch")]
    assert order[0] == "pulumi-add" and order[-1] == "pulumi-prune" and set(order[1:-1]) == {"batch"}, order
    for e in events:
        if e["event"] == "step":
            assert e["detail"].startswith("pulumi up: succeeded"), e
    passed = {e["host"] for e in events if e["event"] == "host" and e["status"] == "passed"}
    assert passed == set(a["after"]), (passed, a["after"])
    add = next(s for s in a["steps"] if s["step"] == "pulumi-add")
    assert [k["name"] for k in add["keep"]] == [old], add

    # Every relabel found the new config already there, and the old one still there.
    assert [r["host"] for r in a["relabels"]] == [h for b in (s["hosts"] for s in a["steps"]
                                                              if s["step"] == "batch") for h in b]
    for relabel in a["relabels"]:
        assert new in relabel["configs"] and old in relabel["configs"], relabel
    # Pruned only after: the old config is gone once the rollout ended, and the node runs the new one.
    assert new in a["final_keys"] and old not in a["final_keys"], a["final_keys"]
    node = dev.kubes["dev-metal"].get("v1", "Node", host)
    assert node is not None and node["metadata"]["labels"][CONFIG_LABEL] == new

    # The stack is converged: an `up` after the prune has nothing to do.
    again = dev.run("up")
    assert again.ok, again.error + again.output[-4000:]
    assert again.changed() == {}, again.changed()


def test_destroy_removes_what_the_stack_created_and_leaves_what_it_adopted(rolled_out: dict[str, Any],
                                                                          dev: Stack) -> None:
    kube = dev.kubes["dev-metal"]
    state = dev.run("up")  # the stack's resources as its state holds them (nothing to change, as above)
    assert state.ok, state.error
    created = [r["outputs"] for r in state.registered()
               if not str(r["type"]).endswith(("NodePatch", "Release")) and r["outputs"].get("metadata")]
    patched = [r["outputs"]["metadata"]["name"] for r in state.registered("NodePatch")]
    assert created and patched
    labels_before = {n: (kube.get("v1", "Node", n) or {})["metadata"]["labels"] for n in patched}
    pulumi_owned = {n["name"]: {k for k, e in n["labels"].items() if e.get("owner") == "pulumi"}
                    for n in dev.nodes["dev-metal"]}

    destroy = dev.run("destroy")
    assert destroy.ok, destroy.error + destroy.output[-6000:]
    assert destroy.resources == [], [r["urn"] for r in destroy.resources]

    def gone() -> list[str]:
        return [f"{o['kind']} {o['metadata'].get('namespace', '')}/{o['metadata']['name']}" for o in created
                if server_object(kube, o) is not None]

    # Namespaces go once the namespace controller has emptied them.
    eventually(lambda: not gone(), timeout=120, what="every object the stack created gone")
    for name in patched:
        node = kube.get("v1", "Node", name)
        assert node is not None, f"node {name} was only labelled by the stack, and is gone"
        labels = node["metadata"]["labels"]
        kept = {k: v for k, v in labels_before[name].items() if k not in pulumi_owned.get(name, set())}
        assert kept.items() <= labels.items(), (name, kept, labels)
        assert not (pulumi_owned.get(name, set()) & set(labels)), (name, labels)
    for ns in PREEXISTING_NAMESPACES:
        assert kube.get("v1", "Namespace", ns) is not None, ns
    assert kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", "clusterqueues.kueue.x-k8s.io")
