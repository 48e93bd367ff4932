"""A promotion source's history for a real Prometheus, written as OpenMetrics from its resolved fleet: what
kube-state-metrics (kube_node_labels with the allowlisted node labels), dcgm-exporter (per GPU and MIG instance, with
DCGM_FI_DRIVER_VERSION, modelName and the node's name: `Hostname` from the exporters of OLD_EXPORTER_NODES, which
predate 4.6.0-4.8.3, `hostname` from the rest) and Kueue (admission-wait histogram buckets) would have exported.

Several histories go into one TSDB, each in its own time span with a gap between them, so `--at` picks one."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from gpushare.core.labels import MIG_STATE_LABEL, OPERATOR_MIG_CONFIG_LABEL
from gpushare.core.resolve import ResolvedFleet, ResolvedNode
from gpushare.render.monitoring.expressions import kube_state_metrics_label_allowlist
from gpushare.render.monitoring.promql import HOST_LABEL, LEGACY_HOST_LABEL, ksm_label
from tests.prometheus.scenarios import WAIT_BUCKETS, create_blocks

DAY = 86400
# Nodes whose dcgm-exporter still writes `Hostname`, as in a fleet half-way through an exporter upgrade.
OLD_EXPORTER_NODES = frozenset({"pilot-a100-01", "pilot-h100-02"})


@dataclass
class History:
    """One span of the source environment's life, ending at `end` (the `--at` that judges it)."""

    fleet: ResolvedFleet  # what the nodes run at the end
    end: int
    days: float
    queues: tuple[str, ...]  # Kueue ClusterQueues with admissions
    before: ResolvedFleet | None = None  # what the nodes ran until `switch`
    switch: int | None = None
    shared_util: float = 0.6  # mean busy share of the units of shared pools
    exclusive_util: float = 0.25
    wait_seconds: float = 30.0  # every admission waits this long
    xids: tuple[tuple[int, str, int], ...] = ()  # (time, node, XID) on the node's first GPU
    ecc_dbe: tuple[tuple[int, str], ...] = ()  # (time, node): a double-bit error on the node's first GPU
    mig_failed: tuple[int, int, str] | None = None  # (from, to, node): MIG state failed meanwhile
    dcgm_gap: tuple[int, int, str] | None = None  # (from, to, node): the node's dcgm-exporter sent nothing meanwhile
    node_step: int = 300  # kube-state-metrics
    dcgm_step: int = 900  # dcgm-exporter and Kueue (coarser: keeps the backfill small)
    gpus_per_node: int = 2  # GPUs per node in the data (the gates count reporting nodes)

    @property
    def start(self) -> int:
        return self.end - int(self.days * DAY)


def node_names(node: ResolvedNode) -> list[str]:
    return [node.name] if node.count == 1 and node.address else [f"{node.name}-{i}" for i in range(node.count)]


def host_label(node: str) -> str:
    return LEGACY_HOST_LABEL if node in OLD_EXPORTER_NODES else HOST_LABEL


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def write_history(h: History, out: TextIO) -> int:
    allowlist = kube_state_metrics_label_allowlist()
    count = 0

    def series(name: str, labels: dict[str, str], start: int, end: int, step: int, value: object) -> None:
        nonlocal count
        head = name + _labels(labels) + " "
        for t in range(start, end + 1, step):
            host = labels.get(HOST_LABEL) or labels.get(LEGACY_HOST_LABEL)
            if name.startswith("DCGM_") and h.dcgm_gap and host == h.dcgm_gap[2] \
                    and h.dcgm_gap[0] <= t <= h.dcgm_gap[1]:
                continue
            v = value(t) if callable(value) else value
            out.write(f"{head}{v:.6g} {t}\n")
            count += 1

    def spans(name: str) -> list[tuple[int, int, ResolvedNode]]:
        """(from, to, node as resolved then) for a node across the switch."""
        now = {n.name: n for n in h.fleet.nodes}
        if h.before is None or h.switch is None:
            return [(h.start, h.end, now[name])]
        then = {n.name: n for n in h.before.nodes}
        return [(h.start, h.switch - 1, then[name]), (h.switch, h.end, now[name])]

    for node in h.fleet.nodes:
        for start, end, resolved in spans(node.name):
            for name in node_names(resolved):
                labels = {"node": name, **{ksm_label(k): v.value for k, v in sorted(resolved.labels.items())
                                           if k in allowlist}}
                cuts = [(start, end, labels)]
                if h.mig_failed and h.mig_failed[2] == name and start <= h.mig_failed[0] <= end:
                    state = ksm_label(MIG_STATE_LABEL if resolved.managed_by == "ansible"
                                      else f"{OPERATOR_MIG_CONFIG_LABEL}.state")
                    a, b = h.mig_failed[0], h.mig_failed[1]
                    cuts = [(start, a - 1, labels), (a, b, {**labels, state: "failed"}), (b + 1, end, labels)]
                for s, e, lab in cuts:
                    first = s + (-s) % h.node_step
                    series("kube_node_labels", lab, first, e, h.node_step, 1)
            if resolved.managed_by == "gke":
                continue
            shared = resolved.sharing != "exclusive"
            driver = f"{resolved.driver_branch}.95.05"
            for name in node_names(resolved):
                for g in range(min(h.gpus_per_node, resolved.gpus_per_node)):
                    first = start + (-start) % h.dcgm_step
                    base = {"gpu": str(g), "UUID": f"GPU-{name}-{g}", "modelName": resolved.gpu_model.name,
                            host_label(name): name, "DCGM_FI_DRIVER_VERSION": driver}
                    series("DCGM_FI_DEV_GPU_TEMP", base, first, end, h.dcgm_step, 48)
                    xids = [(t, x) for t, n, x in h.xids if n == name and g == 0]
                    series("DCGM_FI_DEV_XID_ERRORS", base, first, end, h.dcgm_step,
                           lambda t, xids=xids: next((x for when, x in sorted(xids, reverse=True) if when <= t), 0))
                    dbe = [t for t, n in h.ecc_dbe if n == name and g == 0]
                    series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", base, first, end, h.dcgm_step,
                           lambda t, dbe=dbe: sum(1 for when in dbe if when <= t))
                    series("DCGM_FI_DEV_ROW_REMAP_FAILURE", base, first, end, h.dcgm_step, 0)
                    util = h.shared_util if shared else h.exclusive_util
                    units = [{}] if not resolved.mig_layout else [
                        {"GPU_I_ID": str(i), "GPU_I_PROFILE": p}
                        for i, p in enumerate((p for p, n in resolved.mig_layout.items() for _ in range(n)), 1)]
                    for salt, unit in enumerate(units):
                        series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", {**base, **unit}, first, end, h.dcgm_step,
                               lambda t, u=util, salt=salt: min(1.0, max(0.0, u + 0.05 * math.sin(
                                   2 * math.pi * (t % DAY) / DAY + salt))))
    first = h.start + (-h.start) % h.dcgm_step
    for queue in h.queues:
        for le in WAIT_BUCKETS:
            series("kueue_admission_wait_time_seconds_bucket",
                   {"cluster_queue": queue, "le": "+Inf" if math.isinf(le) else f"{le:g}"}, first, h.end,
                   h.dcgm_step, lambda t, le=le: (t - first) // h.dcgm_step if h.wait_seconds <= le else 0)
    return count


def backfill(histories: list[History], work: Path, data_dir: Path) -> int:
    """Every history into TSDB blocks under data_dir (promtool); returns the samples written."""
    source = work / "history.om"
    with source.open("w") as out:
        # A series that several histories share must go in time order.
        samples = sum(write_history(h, out) for h in sorted(histories, key=lambda h: h.start))
        out.write("# EOF\n")
    create_blocks(source, data_dir, max(h.end for h in histories) - min(h.start for h in histories))
    return samples


NEW_PROFILE = "notebooks-ts2"


def promotion_root(root: Path, project: Path) -> Path:
    """A project root (GPUSHARE_ROOT) whose pilot runs a profile prod does not yet: pool l40s-notebooks moves from
    notebooks-ts4 to notebooks-ts2 (a new profile that prod's guardrails allow). Prod is the project's own file."""
    import shutil

    import yaml

    (root / "environments").mkdir(parents=True)
    (root / "policies").mkdir()
    shutil.copy(project / "gpushare.yaml", root / "gpushare.yaml")  # a workspace, as `gpushare init` makes one
    shutil.copytree(project / "profiles", root / "profiles")
    profile = yaml.safe_load((project / "profiles" / "notebooks-ts4.yaml").read_text())
    profile.update(name=NEW_PROFILE, description="Two pods take turns on each GPU (trusted notebooks).")
    profile["time_slicing"]["replicas"] = 2
    (root / "profiles" / f"{NEW_PROFILE}.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    pilot = (project / "environments" / "pilot.yaml").read_text()
    assert pilot.count("profile: notebooks-ts4") == 1
    (root / "environments" / "pilot.yaml").write_text(pilot.replace("profile: notebooks-ts4",
                                                                    f"profile: {NEW_PROFILE}"))
    # notebooks-ts2 halves the shared replicas, so prod's notebooks quota halves too (prod refuses quota above
    # what its pools advertise).
    prod = (project / "environments" / "prod.yaml").read_text()
    assert prod.count("nvidia.com/gpu.shared: 32") == 1
    (root / "environments" / "prod.yaml").write_text(prod.replace("nvidia.com/gpu.shared: 32",
                                                                  "nvidia.com/gpu.shared: 16"))
    guardrails = yaml.safe_load((project / "policies" / "guardrails.yaml").read_text())
    guardrails["environments"]["prod"]["allowed_profiles"].append(NEW_PROFILE)
    (root / "policies" / "guardrails.yaml").write_text(yaml.safe_dump(guardrails, sort_keys=False))
    return root
