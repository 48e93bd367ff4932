"""`gpushare drift`: on each fixture, imported and compared with itself, drift finds exactly the planted
differences; differences planted afterwards (in the cluster or in Git) are each found, and nothing else."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.resolve import resolve_env
from gpushare.ops.brownfield.cluster import ClusterState, read_dumps
from gpushare.ops.brownfield.drift import DriftReport, find_drift
from tests.unit.ops.brownfield.helpers import CLUSTERS, ENV, FIXTURES, cli

Imported = Callable[[str], tuple[Path, dict[str, Any]]]
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)  # a100-02's MIG change started at 08:00
PLANTED: dict[str, set[tuple[str, str, str]]] = {
    "default-operator": set(),
    "timeslicing-mig": {
        ("a100-02", "mig-state", "labels[nvidia.com/mig.config.state]"),
        ("a100-02", "paused-operand", "labels[nvidia.com/gpu.deploy.device-plugin]"),
        ("a100-02", "paused-operand", "labels[nvidia.com/gpu.deploy.dcgm-exporter]"),
        ("a100-03", "mig-state", "labels[nvidia.com/mig.config.state]"),
    },
    "not-taken-effect": {
        ("l4-12", "advertised", "status.capacity"),
        ("l4-12", "advertised", "status.allocatable"),
    },
    "quotas-kueue": set(),
    "default-and-custom": set(),  # the import of it plans exactly what every node allocates
}


def found(report: DriftReport) -> set[tuple[str, str, str]]:
    return {(d.node, d.kind, d.field) for d in report.drift}


def drift_of(state: ClusterState, now: datetime = NOW) -> DriftReport:
    return find_drift(resolve_env(ENV), state, ENV, now, timedelta(minutes=30))


@pytest.mark.parametrize("name", FIXTURES)
def test_drift_finds_exactly_the_planted_differences(imported: Imported, name: str) -> None:
    imported(name)
    report = drift_of(read_dumps(CLUSTERS / name))
    assert found(report) == PLANTED[name]
    # Before the first rollout gpushare's own labels, and the shared-GPU taint of time-sliced nodes, are missing:
    # pending, not drift.
    assert {d.kind for d in report.pending} <= {"label", "toolkit-version", "device-plugin", "taint"}
    assert all(d.field == "spec.taints[gpushare.io/shared-gpu]" for d in report.pending if d.kind == "taint")
    code, out = cli("drift", "--env", ENV, "--from", str(CLUSTERS / name))
    assert set(out) == {"ok", "environment", "drift", "pending"}
    assert out["ok"] is (not PLANTED[name]) and code == (1 if PLANTED[name] else 0)
    assert out["environment"] == ENV
    assert all(set(d) == {"node", "kind", "field", "git", "cluster"} for d in out["drift"])


def test_a_mig_change_within_the_threshold_is_pending_not_drift(imported: Imported) -> None:
    imported("timeslicing-mig")
    report = drift_of(read_dumps(CLUSTERS / "timeslicing-mig"), now=datetime(2026, 11, 30, 8, 10, tzinfo=UTC))
    assert found(report) == {("a100-03", "mig-state", "labels[nvidia.com/mig.config.state]")}
    pending = {(d.node, d.kind) for d in report.pending}
    assert {("a100-02", "mig-state"), ("a100-02", "paused-operand")} <= pending
    stuck = next(d for d in drift_of(read_dumps(CLUSTERS / "timeslicing-mig")).drift if d.node == "a100-02"
                 and d.kind == "mig-state")
    assert stuck.cluster == "pending for 4h00m"


def node(state: ClusterState, name: str) -> dict[str, Any]:
    return next(n for n in state.of("Node") if n["metadata"]["name"] == name)


def set_label(key: str, value: str, on: str) -> Callable[[ClusterState], None]:
    return lambda s: node(s, on)["metadata"]["labels"].__setitem__(key, value)


def add_taint(s: ClusterState) -> None:
    node(s, "l40s-01")["spec"]["taints"] = [{"key": "maintenance", "value": "true", "effect": "NoExecute"}]


def drop_node(s: ClusterState) -> None:
    s.objects["Node"] = [n for n in s.of("Node") if n["metadata"]["name"] != "l40s-01"]


CLUSTER_EDITS: list[tuple[str, Callable[[ClusterState], None], set[tuple[str, str, str]]]] = [
    ("hand-set gpushare label", set_label("gpushare.io/pool", "other", "l4-01"),
     {("l4-01", "label", "labels[gpushare.io/pool]")}),
    ("a label gpushare does not set", set_label("gpushare.io/owner", "team-a", "l4-01"),
     {("l4-01", "label", "labels[gpushare.io/owner]")}),
    ("the rollout's own progress label is not drift", set_label("gpushare.io/rollout-state", "success", "l4-01"),
     set()),
    ("config label switched by hand", set_label("nvidia.com/device-plugin.config", "ts-2", "l4-01"),
     {("l4-01", "device-plugin", "labels[nvidia.com/device-plugin.config]")}),
    ("MIG config switched by hand", set_label("nvidia.com/mig.config", "all-1g.10gb", "a100-01"),
     {("a100-01", "mig-config", "labels[nvidia.com/mig.config]")}),
    ("old toolkit", set_label("gpushare.io/toolkit-version", "1.16.1", "l4-02"),
     {("l4-02", "toolkit-version", "labels[gpushare.io/toolkit-version]")}),
    ("extra taint", add_taint, {("l40s-01", "taint", "spec.taints[maintenance]")}),
    ("host left the cluster", drop_node, {("l40s-01", "missing-host", "node")}),
]


@pytest.mark.parametrize(("what", "edit", "extra"), CLUSTER_EDITS, ids=[e[0] for e in CLUSTER_EDITS])
def test_each_difference_planted_in_the_cluster_is_found(imported: Imported, what: str,
                                                         edit: Callable[[ClusterState], None],
                                                         extra: set[tuple[str, str, str]]) -> None:
    imported("timeslicing-mig")
    state = read_dumps(CLUSTERS / "timeslicing-mig")
    state.objects = copy.deepcopy(state.objects)
    edit(state)
    assert found(drift_of(state)) == PLANTED["timeslicing-mig"] | extra


def test_a_node_git_does_not_know_and_a_taint_git_adds(imported: Imported) -> None:
    workspace, _ = imported("timeslicing-mig")
    env_file = workspace / "environments" / f"{ENV}.yaml"
    env = yaml.safe_load(env_file.read_text())
    pools = {p["name"]: p for p in env["pools"]}
    env["pools"].remove(pools["l40s-ts-2"])
    pools["l4-ts-4"]["taints"].append({"key": "gpushare.io/pool", "value": "l4", "effect": "NoSchedule"})
    env_file.write_text(yaml.safe_dump(env, sort_keys=False))
    report = drift_of(read_dumps(CLUSTERS / "timeslicing-mig"))
    assert found(report) == PLANTED["timeslicing-mig"] | {
        ("l40s-01", "unknown-node", "node"),
        ("l4-01", "taint", "spec.taints[gpushare.io/pool]"), ("l4-02", "taint", "spec.taints[gpushare.io/pool]")}


def test_drift_needs_one_source_and_a_known_cluster(imported: Imported) -> None:
    imported("default-operator")
    code, out = cli("drift", "--env", ENV)
    assert code == 2 and "exactly one of --from and --kubeconfig" in out["errors"][0]
    code, out = cli("drift", "--env", ENV, "--from", str(CLUSTERS / "default-operator"), "--cluster", "other")
    assert code == 2 and "not one of the environment's clusters" in out["errors"][0]


def test_drift_reads_the_configs_the_operator_mounts(imported: Imported) -> None:
    imported("default-and-custom")
    state = read_dumps(CLUSTERS / "default-and-custom")
    state.objects = copy.deepcopy(state.objects)
    spec = state.of("ClusterPolicy")[0]["spec"]
    # mig-manager switched to NVIDIA's default ConfigMap: its all-balanced is another layout than Git's.
    del spec["migManager"]["config"]["name"]
    assert found(drift_of(state)) == {("a100-02", "mig-config", "labels[nvidia.com/mig.config]")}
    # A default device-plugin config that time-slices 1g.10gb MIG devices is drift on the nodes that advertise them;
    # one naming only nvidia.com/gpu (the fixture's) leaves them unshared, as Git says.
    state = read_dumps(CLUSTERS / "default-and-custom")
    state.objects = copy.deepcopy(state.objects)
    configs = next(c for c in state.of("ConfigMap") if c["metadata"]["name"] == "device-plugin-configs")
    configs["data"]["default"] = ("version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                                  "      - {name: nvidia.com/gpu, replicas: 4}\n"
                                  "      - {name: nvidia.com/mig-1g.10gb, replicas: 4}\n")
    assert found(drift_of(state)) == {(n, "device-plugin", "labels[nvidia.com/device-plugin.config]")
                                      for n in ("a100-01", "a100-02")}


def _labelled_at(state: ClusterState, on: str, value: str, when: datetime) -> None:
    """The node's device-plugin config label set to `value` by kubectl at `when`, as its managedFields record it."""
    n = node(state, on)
    n["metadata"]["labels"]["nvidia.com/device-plugin.config"] = value
    n["metadata"]["managedFields"] = [{
        "manager": "kubectl-label", "operation": "Update", "apiVersion": "v1", "time": f"{when:%Y-%m-%dT%H:%M:%SZ}",
        "fieldsV1": {"f:metadata": {"f:labels": {"f:nvidia.com/device-plugin.config": {}}}}}]


def _with_ts8(state: ClusterState) -> None:
    """A config in the device plugin's ConfigMap that time-slices whole GPUs 8 ways (and nothing else)."""
    configs = next(c for c in state.of("ConfigMap") if c["metadata"]["name"] == "device-plugin-configs")
    configs["data"]["ts-8"] = ("version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
                               "      - {name: nvidia.com/gpu, replicas: 8}\n")


def test_a_config_label_moved_off_the_default_by_hand_is_drift_even_where_it_shares_nothing_today(
        imported: Imported) -> None:
    """a100-01 runs the ClusterPolicy's `default` (it has no label) and Git gives it an exclusive config. Someone
    labels it `ts-8` after the import: a config that time-slices whole GPUs, which the node's MIG instances under the
    mixed strategy do not advertise, so its GPUs are shared alike today and drift used to list the label as pending,
    like a rename the next rollout makes. No rollout and no import explains it, and the node's next layout (MIG off)
    would be shared 8 ways: drift, naming both configs and when the label was written. The same label the import read
    (written before it, or of unknown age), a move to Git's own config under another name (`whole`), and an
    unlabelled node stay pending."""
    imported("default-and-custom")
    day = resolve_env(ENV).env.adoption.imported  # type: ignore[union-attr]
    assert day is not None
    after = datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=1, hours=9)

    def state_with(value: str, when: datetime | None) -> ClusterState:
        state = read_dumps(CLUSTERS / "default-and-custom")
        state.objects = copy.deepcopy(state.objects)
        _with_ts8(state)
        if when is None:
            node(state, "a100-01")["metadata"]["labels"]["nvidia.com/device-plugin.config"] = value
        else:
            _labelled_at(state, "a100-01", value, when)
        return state

    report = drift_of(state_with("ts-8", after))
    assert found(report) == {("a100-01", "device-plugin", "labels[nvidia.com/device-plugin.config]")}
    (item,) = report.drift
    assert item.git.startswith("all-1g-10gb-") and item.git.endswith(": exclusive"), item
    assert item.cluster.startswith("ts-8: timeSlicing nvidia.com/gpu x8 (labelled "), item
    assert f"after the import of {day}" in item.cluster, item
    for value, when in (("ts-8", after - timedelta(days=3)), ("ts-8", None), ("whole", after)):
        report = drift_of(state_with(value, when))
        assert found(report) == set(), (value, when, report.drift)
        assert ("a100-01", "device-plugin") in {(d.node, d.kind) for d in report.pending}, (value, when)


def test_a_config_label_set_by_hand_on_a_cluster_gpushare_built_is_drift(imported: Imported) -> None:
    """Without an adoption block every label is a rollout's: one naming another config than Git's, which shares
    differently (here only resources the MIG node does not advertise), is drift whatever its age; an unlabelled
    node running the ClusterPolicy's default stays pending."""
    workspace, _ = imported("default-and-custom")
    env_file = workspace / "environments" / f"{ENV}.yaml"
    env = yaml.safe_load(env_file.read_text())
    del env["adoption"]
    env_file.write_text(yaml.safe_dump(env, sort_keys=False))
    state = read_dumps(CLUSTERS / "default-and-custom")
    state.objects = copy.deepcopy(state.objects)
    _with_ts8(state)
    node(state, "a100-01")["metadata"]["labels"]["nvidia.com/device-plugin.config"] = "ts-8"
    report = drift_of(state)
    assert ("a100-01", "device-plugin", "labels[nvidia.com/device-plugin.config]") in found(report)
    (item,) = [d for d in report.drift if d.node == "a100-01"]
    assert "nor the same config under another name" in item.cluster, item
    assert {d.node for d in report.drift} == {"a100-01"}, report.drift
