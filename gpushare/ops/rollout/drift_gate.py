"""Before a rollout starts: drift that the change it is about to make cannot explain (a MIG change failed or hangs,
operands left paused, a config applied but not taken effect, a host the cluster does not have) stops it, unless the
operator accepts it (`--accept-drift`). Read through the same kubectl calls the rollout's gates make."""

from __future__ import annotations

from datetime import UTC, datetime

from gpushare.core.errors import GpushareError
from gpushare.core.resolve import ResolvedFleet
from gpushare.ops.brownfield.cluster import ClusterState
from gpushare.ops.brownfield.drift import DEFAULT_STUCK_AFTER, Drift, find_drift
from gpushare.ops.rollout.adapters import Kubectl


def unexplained_drift(fleet: ResolvedFleet, kube: Kubectl, now: datetime | None = None) -> list[Drift]:
    """Per cluster, its hosts as kubectl shows them against Git. Nodes Git does not know need a full node list,
    which `gpushare drift` reads; the gate looks at Git's hosts only."""
    found: list[Drift] = []
    for cluster in fleet.clusters.values():
        hosts = [n for n in fleet.nodes if n.cluster == cluster.name and n.address is not None]
        if not hosts:
            continue
        state = ClusterState(source=f"kubectl (context {cluster.kubeconfig_context or 'current'})")
        for host in hosts:
            try:
                state.objects.setdefault("Node", []).append(kube.node(cluster.kubeconfig_context, host.name))
            except GpushareError as err:
                if "not found" not in str(err):
                    raise
        report = find_drift(fleet, state, cluster.name, now or datetime.now(UTC), DEFAULT_STUCK_AFTER)
        found += [d for d in report.unexplained() if d.kind != "unknown-node"]
    return found
