"""The control plane itself: it starts, its scheduler binds a pod to a kwok node and kwok runs it, and stopping it
ends every process it started."""

from __future__ import annotations

import os
from pathlib import Path

from tests.cluster import bins as binaries
from tests.cluster.controlplane import Cluster, Etcd
from tests.cluster.kube import eventually
from tests.cluster.nodes import kwok_node


def test_pod_is_scheduled_on_a_kwok_node_and_runs(clusters) -> None:  # type: ignore[no-untyped-def]
    _, kube = clusters("smoke")
    node = kwok_node({"name": "smoke-1", "labels": {"gpushare.io/pool": {"value": "p"}}, "taints": [],
                      "advertised": {"nvidia.com/gpu": 2}})
    assert kube.create(node, dry_run=False).allowed
    eventually(lambda: any(c["type"] == "Ready" and c["status"] == "True" for c in
                           (kube.get("v1", "Node", "smoke-1") or {}).get("status", {}).get("conditions", [])),
               what="kwok marks the node Ready")
    got = kube.get("v1", "Node", "smoke-1")
    assert got is not None and got["status"]["allocatable"]["nvidia.com/gpu"] == "2"  # kwok keeps what we set
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
           "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {
               "limits": {"nvidia.com/gpu": "1"}}}]}}
    assert kube.create(pod, dry_run=False).allowed
    placed = eventually(lambda: (kube.get("v1", "Pod", "p", "default") or {}).get("spec", {}).get("nodeName"),
                        what="the scheduler binds the pod")
    assert placed == "smoke-1"
    eventually(lambda: (kube.get("v1", "Pod", "p", "default") or {}).get("status", {}).get("phase") == "Running",
               what="kwok runs the pod")


def test_stop_ends_every_process_it_started(cluster_bins: binaries.Binaries, tmp_path: Path) -> None:
    etcd = Etcd(cluster_bins, tmp_path / "etcd")
    try:
        cluster = Cluster("stop-check", cluster_bins, etcd, tmp_path / "cluster")
        pids = [p.popen.pid for p in cluster.processes]
        assert len(pids) == 4
        cluster.stop()
    finally:
        etcd.stop()
    for pid in [*pids, etcd.process.popen.pid]:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), f"process {pid} still runs"
    assert not os.environ.get("KUBECONFIG", "").startswith(str(tmp_path))


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True
