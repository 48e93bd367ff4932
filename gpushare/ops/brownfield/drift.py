"""`gpushare drift`: per node, what Git says against what the cluster shows.

Drift is what a rollout would not explain: a MIG change that failed or hangs, operands left paused, a config that
was applied but did not take effect, a value someone changed by hand, nodes Git does not know and hosts the
cluster does not have. What the next rollout simply applies (a gpushare label not set yet, a config renamed to its
content-hashed name with the same content) is `pending`, listed but not drift."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from gpushare.core.labels import DEVICE_PLUGIN_CONFIG_LABEL, MIG_CONFIG_LABEL, MIG_STATE_LABEL, TOOLKIT_VERSION_LABEL
from gpushare.core.mappings import dig
from gpushare.core.resolve import SHARED_GPU_TAINT, ResolvedFleet, ResolvedNode
from gpushare.ops.brownfield.cluster import (
    COUNT_LABEL,
    MIG_DISABLED,
    OPERATOR_MIG_LABEL,
    OPERATOR_STATE_LABEL,
    PRODUCT_LABEL,
    ClusterState,
    ConfigSource,
    gpu_resources,
    labels_of,
    mig_layout,
    name_of,
)
from gpushare.ops.brownfield.importer import SYSTEM_TAINT_PREFIXES
from gpushare.ops.rollout.execute import ROLLOUT_STATE_LABEL

PAUSED = "paused-for-mig-change"
DEPLOY_PREFIX = "nvidia.com/gpu.deploy."
DEFAULT_STUCK_AFTER = timedelta(minutes=30)
# Drift a rollout cannot explain by the change it is about to make: it refuses to start on these.
UNEXPLAINED = ("mig-state", "paused-operand", "advertised", "unknown-node", "missing-host")
# Labels compared by what they mean (a layout, a config's content, a state), not by their text.
_BY_MEANING = (DEVICE_PLUGIN_CONFIG_LABEL, MIG_CONFIG_LABEL, MIG_STATE_LABEL, TOOLKIT_VERSION_LABEL)
# Labels a rollout writes about its own progress: not Git's, never drift.
_RUN_STATE = (ROLLOUT_STATE_LABEL,)


@dataclass(frozen=True)
class Drift:
    node: str
    kind: str
    field: str
    git: str
    cluster: str

    def as_dict(self) -> dict[str, str]:
        return {"node": self.node, "kind": self.kind, "field": self.field, "git": self.git, "cluster": self.cluster}


@dataclass
class DriftReport:
    environment: str
    drift: list[Drift] = field(default_factory=list)
    pending: list[Drift] = field(default_factory=list)
    # How many nodes were compared (Git's hosts of the cluster and its GPU nodes Git does not know); the text
    # summary says it, the JSON leaves it out. 0: not counted.
    nodes: int = 0

    @property
    def ok(self) -> bool:
        return not self.drift

    def unexplained(self) -> list[Drift]:
        return [d for d in self.drift if d.kind in UNEXPLAINED]

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "environment": self.environment, "drift": [d.as_dict() for d in self.drift],
                "pending": [d.as_dict() for d in self.pending]}


def layout_text(layout: dict[str, int] | None) -> str:
    return ",".join(f"{p}={n}" for p, n in sorted(layout.items())) if layout else "disabled"


def counts_text(counts: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(counts.items())) or "none"


def node_resources(layout: dict[str, int] | None, mig_strategy: str) -> list[str]:
    """The resources a node's GPUs advertise before sharing: MIG devices are nvidia.com/mig-<profile> only under the
    mixed strategy."""
    if layout and mig_strategy == "mixed":
        return sorted(f"nvidia.com/mig-{p.replace('+', '.')}" for p in layout)
    return ["nvidia.com/gpu"]


def sharing_of(content: dict[str, Any] | None, resources: list[str]) -> tuple[Any, ...]:
    """What a device-plugin config changes about a node's GPUs: the sharing mode, its replicas per resource and its
    renaming, counting only the resources the node advertises (the plugin shares only those it is told to; a
    time-slicing config for nvidia.com/gpu leaves a MIG node under the mixed strategy unshared). migStrategy and
    the device list strategy come from the operator's env vars, not from this file."""
    sharing = (content or {}).get("sharing") or {}
    for mode in ("timeSlicing", "mps"):
        block = sharing.get(mode)
        if block:
            shared = tuple(sorted((str(r.get("name")), int(r.get("replicas", 1)))
                                  for r in block.get("resources") or [] if str(r.get("name")) in resources))
            if not shared:
                break
            return (mode, shared, bool(block.get("renameByDefault", False)),
                    bool(block.get("failRequestsGreaterThanOne", False)))
    return ("exclusive",)


def sharing_text(name: str | None, content: dict[str, Any] | None, resources: list[str]) -> str:
    what = sharing_of(content, resources)
    detail = what[0] if len(what) == 1 else f"{what[0]} {','.join(f'{r} x{n}' for r, n in what[1])}" + (
        " renamed" if what[2] else "")
    return f"{name or '(none)'}: {detail}"


def label_time(node: dict[str, Any], label: str) -> datetime | None:
    """When the label was last written, from the node's managedFields (the API server records it per manager)."""
    found: datetime | None = None
    for entry in dig(node, "metadata", "managedFields") or []:
        labels = dig(entry, "fieldsV1", "f:metadata", "f:labels") or {}
        stamp = entry.get("time")
        if f"f:{label}" in labels and stamp:
            when = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
            found = when if found is None or when > found else found
    return found


class _NodeCheck:
    """One Git node against its cluster node."""

    def __init__(self, fleet: ResolvedFleet, state: ClusterState, git: ResolvedNode, node: dict[str, Any],
                 now: datetime, stuck_after: timedelta, report: DriftReport,
                 configs: tuple[ConfigSource, ConfigSource]) -> None:
        self.fleet, self.state, self.git, self.node = fleet, state, git, node
        self.labels = labels_of(node)
        self.now, self.stuck_after, self.report = now, stuck_after, report
        self.mig_settling = False  # a MIG change under way within the threshold: paused operands are expected
        self.mig_differs = False
        # The operator's configs, read once per report (parsing them per node costs minutes on a large fleet).
        self.mig_source, self.dp_source = configs
        self.cluster_mig, self.cluster_dp = self.mig_source.configs, self.dp_source.configs

    def add(self, kind: str, where: str, git: str, cluster: str, pending: bool = False) -> None:
        item = Drift(self.git.name, kind, where, git, cluster)
        (self.report.pending if pending else self.report.drift).append(item)

    def run(self) -> None:
        self.owned_labels()
        self.toolkit()
        mig_ok = self.mig() if self.git.gpu_model.mig_capable else True
        self.paused()
        if self.device_plugin() and mig_ok and not self.mig_differs:
            self.advertised()
        self.taints()

    def owned_labels(self) -> None:
        wanted = {k: v.value for k, v in self.git.labels.items() if k not in _BY_MEANING}
        for key, value in sorted(wanted.items()):
            have = self.labels.get(key)
            if have != value:
                self.add("label", f"labels[{key}]", value, have or "absent", pending=have is None)
        for key in sorted(k for k in self.labels if k.startswith("gpushare.io/") and k not in wanted
                          and k not in _BY_MEANING + _RUN_STATE):
            self.add("label", f"labels[{key}]", "absent", self.labels[key])

    def toolkit(self) -> None:
        have = self.labels.get(TOOLKIT_VERSION_LABEL)
        if self.git.managed_by == "ansible" and have != self.git.toolkit_version:
            self.add("toolkit-version", f"labels[{TOOLKIT_VERSION_LABEL}]", self.git.toolkit_version,
                     have or "absent", pending=have is None)

    def mig(self) -> bool:
        """Compare the layout the node's config label names, and its state; False while that state is not success."""
        if MIG_CONFIG_LABEL in self.labels:  # gpushare's own label (Ansible): its configs are Git's
            label, state_label, name = MIG_CONFIG_LABEL, MIG_STATE_LABEL, self.labels[MIG_CONFIG_LABEL]
            configs = self.fleet.mig_configs
            layout = configs[name].get(self.git.gpu_model.name) if name in configs else None
            known = name in configs or name == MIG_DISABLED
        else:
            label, state_label = OPERATOR_MIG_LABEL, OPERATOR_STATE_LABEL
            name = self.labels.get(label, MIG_DISABLED)
            entries = self.cluster_mig.get(name)
            layout = mig_layout(entries, self.git.gpu_model) if entries is not None else None
            known = entries is not None or name == MIG_DISABLED
        if not known:
            self.mig_differs = True
            self.add("mig-config", f"labels[{label}]", layout_text(self.git.mig_layout),
                     f"{name}: {_missing(self.mig_source, name)}")
        elif (layout or None) != (self.git.mig_layout or None):
            self.mig_differs = True
            self.add("mig-config", f"labels[{label}]", layout_text(self.git.mig_layout),
                     f"{name}: {layout_text(layout)}")
        return self.mig_state(name, state_label)

    def mig_state(self, name: str, state_label: str) -> bool:
        state = self.labels.get(state_label)
        if state in (None, "success") or (state is None and name == MIG_DISABLED):
            return True
        if state == "failed":
            self.add("mig-state", f"labels[{state_label}]", "success", "failed")
            return False
        since = label_time(self.node, state_label)
        age = self.now - since if since is not None else None
        if age is not None and age <= self.stuck_after:
            self.mig_settling = True
            self.add("mig-state", f"labels[{state_label}]", "success", f"{state} for {_minutes(age)}", pending=True)
        else:
            shown = f"{state} for {_minutes(age)}" if age is not None else f"{state} (since an unknown time)"
            self.add("mig-state", f"labels[{state_label}]", "success", shown)
        return False

    def paused(self) -> None:
        for key in sorted(k for k, v in self.labels.items() if k.startswith(DEPLOY_PREFIX) and v == PAUSED):
            git = self.git.labels[key].value if key in self.git.labels else "true"
            self.add("paused-operand", f"labels[{key}]", git, PAUSED, pending=self.mig_settling)

    def device_plugin(self) -> bool:
        """Compare what the config the node runs does to its GPUs with what Git's does; True when they agree."""
        git_name = self.git.device_plugin_config
        git_content = self.fleet.device_plugin_configs[git_name].content if git_name else None
        resources = node_resources(self.git.mig_layout, self.fleet.clusters[self.git.cluster].mig_strategy)
        name = self.state.device_plugin_config_for(self.node)
        cluster_configs = self.cluster_dp
        if name is not None and name not in cluster_configs and name not in self.fleet.device_plugin_configs:
            self.add("device-plugin", f"labels[{DEVICE_PLUGIN_CONFIG_LABEL}]",
                     sharing_text(git_name, git_content, resources), f"{name}: {_missing(self.dp_source, name)}")
            return False
        content = cluster_configs.get(name) if name in cluster_configs else (
            self.fleet.device_plugin_configs[name].content if name else None)
        if sharing_of(content, resources) != sharing_of(git_content, resources):
            self.add("device-plugin", f"labels[{DEVICE_PLUGIN_CONFIG_LABEL}]",
                     sharing_text(git_name, git_content, resources), sharing_text(name, content, resources))
            return False
        if name != git_name:
            every = _named_resources(content, git_content, resources)
            why = self.relabelled(content, git_content, every)
            if why is None:
                self.add("device-plugin", f"labels[{DEVICE_PLUGIN_CONFIG_LABEL}]", str(git_name),
                         str(name or "(none)"), pending=True)
            else:
                self.add("device-plugin", f"labels[{DEVICE_PLUGIN_CONFIG_LABEL}]",
                         sharing_text(git_name, git_content, every),
                         f"{sharing_text(name, content, every)} ({why})")
        return True

    def relabelled(self, content: dict[str, Any] | None, git_content: dict[str, Any] | None,
                   every: list[str]) -> str | None:
        """Why a config label that names another config than Git's, doing the same to this node's GPUs today, is
        drift; None where a rollout explains it (pending). Explained: no label (the node runs the ClusterPolicy's
        default until the rollout labels it); the same config under another name (every resource either config
        shares, shared alike: a rename to the content-hashed name); on an adopted cluster, a label no later than the
        import (or of unknown age: a dump without managedFields), which the import read. Anything else someone chose
        by hand, such as a node moved from `default` to a config that shares only what its MIG layout does not
        advertise today: the node's next layout would be shared as Git never said."""
        if DEVICE_PLUGIN_CONFIG_LABEL not in self.labels:
            return None
        if sharing_of(content, every) == sharing_of(git_content, every):
            return None
        adoption = self.fleet.env.adoption
        written = label_time(self.node, DEVICE_PLUGIN_CONFIG_LABEL)
        if adoption is None:
            return "not Git's config for the node, nor the same config under another name"
        if written is None or adoption.imported is None or written.date() <= adoption.imported:
            return None
        return f"labelled {written:%Y-%m-%d %H:%M} UTC, after the import of {adoption.imported}"

    def advertised(self) -> None:
        """The "applied but not taken effect" case: the config is right, the node advertises something else."""
        status = self.node.get("status") or {}
        for where in ("capacity", "allocatable"):
            if where not in status:
                continue  # an API server always reports both; a partial answer is not a claim of zero
            have = gpu_resources(status[where] or {})
            if have != self.git.advertised:
                self.add("advertised", f"status.{where}", counts_text(self.git.advertised), counts_text(have))

    def taints(self) -> None:
        want: set[tuple[str, str, str]] = {(t.key, t.value, t.effect) for t in self.git.taints}
        have = {(str(t.get("key")), str(t.get("value", "") or ""), str(t.get("effect")))
                for t in dig(self.node, "spec", "taints") or []
                if not str(t.get("key")).startswith(SYSTEM_TAINT_PREFIXES)}
        for key, value, effect in sorted(want - have):
            # The shared-GPU taint is gpushare's own on every time-sliced or MPS node: on a cluster it has not rolled
            # out to yet it is what the first rollout adds (pending, as an owned label not set yet), not drift.
            self.add("taint", f"spec.taints[{key}]", f"{key}={value}:{effect}", "absent",
                     pending=key == SHARED_GPU_TAINT.key)
        for key, value, effect in sorted(have - want):
            self.add("taint", f"spec.taints[{key}]", "absent", f"{key}={value}:{effect}")


def _named_resources(content: dict[str, Any] | None, git_content: dict[str, Any] | None,
                     resources: list[str]) -> list[str]:
    """Every resource either config shares, and those the node advertises: what tells two configs apart."""
    named = {str(r.get("name")) for c in (content, git_content) for mode in ("timeSlicing", "mps")
             for r in (dig(c, "sharing", mode, "resources") or [])}
    return sorted(named | set(resources))


def _missing(source: ConfigSource, name: str) -> str:
    """Why the cluster has no readable config `name`: an unreadable one is not reported as absent."""
    if name in source.broken:
        return f"the cluster's config cannot be read ({source.broken[name]})"
    return "no such config in the cluster"


def _minutes(age: timedelta) -> str:
    minutes = int(age.total_seconds() // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


def find_drift(fleet: ResolvedFleet, state: ClusterState, cluster: str, now: datetime,
               stuck_after: timedelta = DEFAULT_STUCK_AFTER) -> DriftReport:
    """Every difference between Git's nodes of `cluster` (bare-metal hosts) and the cluster's GPU nodes."""
    report = DriftReport(fleet.environment)
    nodes = {name_of(n): n for n in state.of("Node")}
    git_nodes = [n for n in fleet.nodes if n.cluster == cluster and n.address is not None]
    configs = (state.mig_source(), state.device_plugin_source())
    for git in git_nodes:
        node = nodes.get(git.name)
        if node is None:
            report.drift.append(Drift(git.name, "missing-host", "node", f"host of pool {git.pool}", "absent"))
            continue
        _NodeCheck(fleet, state, git, node, now, stuck_after, report, configs).run()
    known = {n.name for n in git_nodes}
    for node in state.gpu_nodes():
        if name_of(node) not in known:
            labels = labels_of(node)
            shown = f"{labels.get(PRODUCT_LABEL, 'GPU')} x{labels.get(COUNT_LABEL, '?')}"
            report.drift.append(Drift(name_of(node), "unknown-node", "node", "absent", shown))
    report.nodes = len(known | {name_of(n) for n in state.gpu_nodes()})
    return report
