"""`gpushare promote` without Prometheus: the proposal (what is carried over, comments kept, nothing written), the
items the gates measure, the run-time arithmetic, which promotions exist, and the guardrails' `promotion:` section.
The gates against a real Prometheus are in tests/prometheus/test_promote.py."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core.errors import GpushareError
from gpushare.core.guardrails import load_guardrails
from gpushare.core.resolve import resolve, resolve_env
from gpushare.ops.promote import check_promotion, continuous_run, items, propose
from gpushare.render.monitoring.expressions import (
    MIG_STATE_LABEL,
    OPERATOR_MIG_STATE_LABEL,
    POOL_LABEL,
    PROMOTION_NODE_LABELS,
    kube_state_metrics_label_allowlist,
)
from gpushare.render.monitoring.promql import ksm_label
from tests.conftest import ENVIRONMENTS, PROFILES, WORKSPACE
from tests.prometheus.promote_history import NEW_PROFILE, promotion_root

runner = CliRunner()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return promotion_root(tmp_path / "project", WORKSPACE)


def _fleets(root: Path) -> tuple[Any, Any]:
    return (resolve(root / "environments" / "pilot.yaml", root / "profiles"),
            resolve(root / "environments" / "prod.yaml", root / "profiles"))


# ---------------------------------------------------------------- the proposal


def test_identical_settings_propose_nothing(tmp_path: Path) -> None:
    promotion = propose(resolve_env("pilot"), resolve_env("prod"), tmp_path)
    assert promotion.changes == [] and promotion.proposal.patch == ""
    assert promotion.candidate.as_dict()["pools"] == resolve_env("prod").as_dict()["pools"]


def test_the_source_profile_is_carried_over_with_comments_kept(root: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSHARE_ROOT", str(root))
    pilot, prod = _fleets(root)
    before = (root / "environments" / "prod.yaml").read_text()
    promotion = propose(pilot, prod, tmp_path)
    assert [c.as_dict() for c in promotion.changes] == [
        {"path": "pools.l40s-notebooks.profile", "from": "notebooks-ts4", "to": NEW_PROFILE}]
    assert promotion.candidate.pool("l40s-notebooks").profile == NEW_PROFILE
    assert promotion.candidate.pool("l40s-notebooks").totals.physical_gpus == 8  # prod's hosts, not pilot's
    (old, new), = promotion.proposal.files.values()
    assert old == before and (root / "environments" / "prod.yaml").read_text() == before
    assert "# Production. Only profiles" in new  # round-trip: comments stay
    assert list(promotion.proposal.files) == ["environments/prod.yaml"]
    changed = [line for line in promotion.proposal.patch.splitlines() if line.startswith(("+ ", "- ", "+  ", "-  "))]
    assert changed == ["-    profile: notebooks-ts4", f"+    profile: {NEW_PROFILE}"]


def test_defaults_and_cloud_driver_branches_are_carried_over(root: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSHARE_ROOT", str(root))
    path = root / "environments" / "pilot.yaml"
    data = yaml.safe_load(path.read_text())
    data["defaults"]["toolkit_version"] = "1.18.3"
    data["defaults"]["driver_branch"] = 590
    gke = next(p for p in data["pools"] if p["name"] == "gke-l4-inference")
    gke["cloud"]["driver_branch"] = 570
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    pilot, prod = _fleets(root)
    promotion = propose(pilot, prod, tmp_path)
    got = {c.path: (c.old, c.new) for c in promotion.changes}
    assert got == {"pools.l40s-notebooks.profile": ("notebooks-ts4", NEW_PROFILE),
                   "pools.gke-l4-inference.cloud.driver_branch": (None, 570),
                   "defaults.driver_branch": (580, 590), "defaults.toolkit_version": ("1.18.2", "1.18.3")}
    candidate = promotion.candidate
    assert {n.driver_branch for n in candidate.nodes if n.pool != "gke-l4-inference"} == {590}
    assert candidate.pool("gke-l4-inference").nodes[0].driver_branch == 570
    assert {n.toolkit_version for n in candidate.nodes} == {"1.18.3"}


def test_a_pool_of_another_gpu_model_keeps_its_profile(root: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSHARE_ROOT", str(root))
    path = root / "environments" / "pilot.yaml"
    data = yaml.safe_load(path.read_text())
    next(p for p in data["pools"] if p["name"] == "l40s-notebooks")["gpu_model"] = "NVIDIA L4"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    pilot, prod = _fleets(root)
    assert pilot.pool("l40s-notebooks").profile == NEW_PROFILE
    promotion = propose(pilot, prod, tmp_path)
    assert promotion.changes == []
    assert promotion.candidate.pool("l40s-notebooks").profile == "notebooks-ts4"


def test_a_proposal_that_does_not_resolve_is_an_error(root: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Pilot's A100s run 4g + 3g instances and its tenants ask for those; prod's tenants still want 2g (and 1g)
    instances, which the carried-over profile no longer offers: the proposal does not resolve, and says so."""
    monkeypatch.setenv("GPUSHARE_ROOT", str(root))
    path = root / "environments" / "pilot.yaml"
    data = yaml.safe_load(path.read_text())
    next(p for p in data["pools"] if p["name"] == "a100-inference")["profile"] = "mig-llm-serving"
    del next(t for t in data["tenants"] if t["name"] == "search")["quota"]["nvidia.com/mig-2g.20gb"]
    next(t for t in data["tenants"] if t["name"] == "partner-eval")["quota"] = {"nvidia.com/mig-3g.40gb": 2}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    pilot, prod = _fleets(root)
    with pytest.raises(GpushareError) as info:
        propose(pilot, prod, tmp_path)
    assert "the proposed prod (with pilot's settings) does not resolve" in str(info.value)


# ---------------------------------------------------------------- what the gates measure


def test_config_names_are_the_same_in_every_environment_for_the_same_content() -> None:
    pilot, prod = resolve_env("pilot"), resolve_env("prod")
    assert {n.device_plugin_config for n in prod.nodes} <= {n.device_plugin_config for n in pilot.nodes}
    assert set(prod.mig_configs) <= set(pilot.mig_configs)


def test_items_cover_every_profile_layout_driver_and_toolkit(root: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSHARE_ROOT", str(root))
    pilot, prod = _fleets(root)
    candidate = propose(pilot, prod, tmp_path).candidate
    found = {(i.kind, i.name): i for i in items(candidate, "pilot", "1h")}
    profiles = {name for kind, name in found if kind == "profile"}
    assert profiles == {f"{n.profile} ({n.device_plugin_config})" for n in candidate.nodes if n.device_plugin_config} \
        | {"inference-ts2"}  # the GKE-managed pool has no device-plugin config: its profile label
    assert {name for kind, name in found if kind == "MIG layout"} == set(candidate.mig_configs)
    drivers = {name for kind, name in found if kind == "driver branch"}
    assert drivers == {f"R580 on {n.gpu_model.name}" for n in candidate.nodes}
    assert found[("driver branch", "R580 on NVIDIA L4")].expr is None  # GKE-managed: said, not measured
    assert found[("toolkit version", "1.18.2")].expr is not None
    for item in found.values():
        if item.expr:
            assert 'label_gpushare_io_environment="pilot"' in item.expr


def test_toolkit_needs_no_evidence_without_ansible_hosts(tmp_path: Path) -> None:
    fleet = resolve_env("pilot")
    cloud_only = [p for p in fleet.pools if p.cloud is not None]
    fleet.pools[:] = cloud_only
    (toolkit,) = [i for i in items(fleet, "pilot", "1h") if i.kind == "toolkit version"]
    assert toolkit.expr is None and "no Ansible-managed hosts" in toolkit.note


def test_every_node_label_promote_reads_is_exported() -> None:
    """The allowlist gives kube-state-metrics every label the gates read (and the rules read the rest)."""
    fleet = resolve_env("prod")
    exprs = [i.expr for i in items(fleet, "pilot", "1h") if i.expr]
    read = set()
    for expr in exprs:
        read |= set(re.findall(r"\b(label_[a-z0-9_]+)\b(?!\s*\()", expr))
    allow = {ksm_label(label) for label in kube_state_metrics_label_allowlist()}
    assert read <= allow
    assert read | {ksm_label(x) for x in (POOL_LABEL, MIG_STATE_LABEL, OPERATOR_MIG_STATE_LABEL)} == allow
    assert {ksm_label(x) for x in PROMOTION_NODE_LABELS} <= read


@pytest.mark.parametrize(("times", "expected"), [
    ([0, 3600, 7200, 10800], (10800, 0)),  # present throughout
    ([0, 3600, 10800], (0, 10800)),  # a gap of two steps: only the last point counts
    ([0, 3600, 7200], (0, None)),  # gone before `at`
    ([], (0, None)),
])
def test_continuous_run_ends_at_the_first_gap(times: list[float], expected: tuple[float, float | None]) -> None:
    assert continuous_run(times, 10800, 3600) == expected


# ---------------------------------------------------------------- which promotions exist


@pytest.mark.parametrize(("source", "target", "text"), [
    ("dev", "prod", "prod promote_from is pilot, so it is not promoted from dev"),
    ("prod", "pilot", "pilot has no promote_from"),
    ("pilot", "staging", "no environment 'staging'"),
])
def test_only_a_declared_promotion_is_accepted(source: str, target: str, text: str) -> None:
    with pytest.raises(GpushareError) as info:
        check_promotion(load_guardrails(), source, target)
    (problem,) = info.value.problems
    assert text in problem.message and info.value.exit_code == 2
    assert problem.file is not None and problem.file.endswith("policies/guardrails.yaml")
    assert problem.path in (f"environments.{target}.promote_from", f"environments.{target}") and problem.fix


def test_an_undeclared_promotion_exits_2_from_the_cli() -> None:
    result = runner.invoke(app, ["promote", "--from", "dev", "--to", "prod", "--json"])
    assert result.exit_code == 2
    problem = json.loads(result.stdout)["problems"][0]
    assert problem["path"] == "environments.prod.promote_from" and "guardrails.yaml" in problem["file"]


def test_fixture_environments_without_prometheus(tmp_path: Path) -> None:
    result = runner.invoke(app, ["promote", "--from", "pilot", "--to", "prod", "--json", "--no-plan",
                                 "--patch", str(tmp_path / "p.patch")])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["changes"] == [] and data["patch"] is None and not (tmp_path / "p.patch").exists()
    assert {g["gate"] for g in data["gates"]} == {"guardrails", "run-time", "xid", "ecc", "mig-reconfiguration",
                                                  "utilization-uplift", "queue-wait-p95"}


def test_guardrails_gate_runs_the_plan_rules_too(tmp_path: Path) -> None:
    result = runner.invoke(app, ["promote", "--from", "pilot", "--to", "prod", "--json"])
    (gate,) = [g for g in json.loads(result.stdout)["gates"] if g["gate"] == "guardrails"]
    assert gate["passed"] and "not run" not in gate["detail"]


# ---------------------------------------------------------------- guardrails: promotion


def _bad(section: str | None, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(g: dict[str, Any]) -> None:
        if section is None:
            g.pop(key)
        elif value is KeyError:
            g[section].pop(key)
        else:
            g[section][key] = value
    return mutate


@pytest.mark.parametrize(("mutate", "path", "text"), [
    (_bad(None, "promotion", None), "promotion", "Field required"),
    (_bad("promotion", "min_dayz", 14), "promotion.min_dayz", "unknown key"),
    (_bad("promotion", "min_days", KeyError), "promotion.min_days", "Field required"),
    (_bad("promotion", "min_days", 0), "promotion.min_days", "greater than or equal to 1"),
    (_bad("promotion", "utilization_baseline", 1.2), "promotion.utilization_baseline", "less than 1"),
    (_bad("promotion", "min_utilization_uplift", 4.0), "promotion", "above 1: no pool can pass"),
    (_bad("promotion", "max_queue_p95_seconds", -5), "promotion.max_queue_p95_seconds", "greater than 0"),
    (_bad("promotion", "step", "1 hour"), "promotion.step", "should match pattern"),
    (_bad("promotion", "step", "7h"), "promotion", "does not divide a day"),
    (_bad("promotion", "step", "1m"), "promotion", "points per series"),
    (_bad("promotion", "ignored_xids", [13, 13]), "promotion", "lists an XID twice"),
    (_bad("promotion", "ignored_xids", [13, 79]), "", "79, which monitoring.critical_xids calls hardware faults"),
])
def test_bad_promotion_policy_is_a_clear_error(tmp_path: Path, mutate: Callable[[dict[str, Any]], None], path: str,
                                               text: str) -> None:
    data = yaml.safe_load((WORKSPACE / "policies" / "guardrails.yaml").read_text())
    mutate(data)
    file = tmp_path / "policies" / "guardrails.yaml"
    file.parent.mkdir()
    file.write_text(yaml.safe_dump(data))
    with pytest.raises(GpushareError) as info:
        load_guardrails(file)
    problem = next((p for p in info.value.problems if text in p.message), None)
    assert problem is not None, [str(p) for p in info.value.problems]
    assert problem.file == str(file) and (problem.path or "") == path and problem.fix
    # The command stops with the same problem and a non-zero exit.
    (tmp_path / "environments").symlink_to(ENVIRONMENTS)
    (tmp_path / "profiles").symlink_to(PROFILES)
    result = runner.invoke(app, ["promote", "--from", "pilot", "--to", "prod", "--json"],
                           env={"GPUSHARE_ROOT": str(tmp_path)})
    assert result.exit_code != 0
    assert any(text in p["message"] and p["file"] == str(file) for p in json.loads(result.stdout)["problems"])
