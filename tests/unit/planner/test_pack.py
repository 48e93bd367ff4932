"""`gpushare pack`: small demands whose optimum was worked out by hand come out optimal; every plan keeps the
sharing rules (checked here from the JSON output, not through the planner's own check); infeasible demand is an
error that names the workload; the environment section parses and resolves to the planned fleet; CLI contract."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core.catalog import load_catalog
from gpushare.core.errors import GpushareError
from gpushare.core.guardrails import load_guardrails
from gpushare.core.mig import check_layout, layout_from_counts
from gpushare.core.resolve import resolve
from gpushare.core.spec import PROFILE_ADAPTER, Pool
from gpushare.planner.demand import Demand
from gpushare.planner.pack import PackPlan, check_plan, plan_demand
from gpushare.planner.pack_output import env_section
from tests.conftest import ENVIRONMENTS, PROFILES, ROOT

H100 = "NVIDIA H100 80GB HBM3"
runner = CliRunner()


def make(*workloads: dict[str, Any], gpus: list[dict[str, Any]] | None = None, **top: Any) -> Demand:
    named = [{"name": f"w{k}", "tenant": "t", "kind": "batch", **w} for k, w in enumerate(workloads)]
    return Demand.model_validate({"gpus": gpus or [{"model": H100}], "workloads": named, **top})


def pack(demand: Demand, **options: Any) -> PackPlan:
    return plan_demand(demand, time_limit=options.pop("time_limit", 10.0), **options)


def assert_rules(plan: PackPlan, env: str | None = None) -> None:
    """Every sharing rule, re-derived from the JSON document and the demand."""
    doc = json.loads(json.dumps(plan.as_json()))
    demand = plan.demand
    by_name = {w.name: w for w in demand.workloads}
    catalog = load_catalog()
    rails = load_guardrails()
    limits = rails.environment(env) if env else None
    untrusted_tenants: set[str] = set()
    if env:
        env_data = yaml.safe_load((ENVIRONMENTS / f"{env}.yaml").read_text())
        untrusted_tenants = {t["name"] for t in env_data.get("tenants", []) if t["trust"] == "untrusted"}
    placed: list[str] = []
    advertised = units = 0
    for gpu in doc["gpus"]:
        model = catalog.lookup(gpu["model"])
        kind = gpu["sharing"]
        assert kind in ("exclusive", "time-slicing", "mps", "mig", "mig-time-slicing")
        if kind.startswith("mig"):
            check = check_layout(model, layout_from_counts(gpu["layout"]), 580)
            assert check.ok, (gpu["layout"], check.errors)
            assert len(gpu["units"]) == sum(gpu["layout"].values())
        else:
            assert gpu["layout"] == {} and len(gpu["units"]) == 1
        advertised += gpu["advertised"]
        units += gpu["hardware_units"]
        assert gpu["advertised"] == gpu["hardware_units"] * gpu["replicas"]
        for unit in gpu["units"]:
            names = unit["workloads"]
            placed += names
            loads = [by_name[n.rsplit("/", 1)[0]] for n in names]
            if unit["mig_profile"]:
                profile = model.profiles[unit["mig_profile"]]
                memory, compute = profile.memory_gib, profile.compute_slices / model.compute_slices_total
            else:
                memory, compute = model.memory_gib, 1.0
            assert unit["memory_gib"] == memory
            shared = unit["sharing"] != "exclusive"
            assert len(names) <= (unit["replicas"] if shared else 1)
            if shared and limits is not None:
                assert unit["replicas"] <= rails.max_shared_replicas(env or "", memory)
            for w in loads:
                own = w.trust == "untrusted" or w.tenant in untrusted_tenants or w.latency_class == "high"
                if own:
                    assert not shared and len(names) == 1, f"{w.name} must have a unit of its own"
                if w.latency_class == "medium":
                    assert unit["sharing"] != "time-slicing"
                if unit["sharing"] == "mps":
                    assert kind == "mps" and w.memory_gib <= memory / unit["replicas"] + 1e-9
                    assert w.compute <= 1.0 / unit["replicas"] + 1e-9
                else:
                    assert w.memory_gib <= memory + 1e-9
            if unit["sharing"] == "time-slicing":
                assert sum(w.memory_gib for w in loads) <= memory + 1e-6
                assert sum(w.compute for w in loads) <= compute * demand.compute_budget + 1e-6
            elif unit["sharing"] == "exclusive" and loads:
                assert loads[0].compute <= compute + 1e-9
    expected = sorted(f"{w.name}/{r}" for w in demand.workloads for r in range(w.replicas))
    assert sorted(placed) == expected
    assert doc["gpus_used"] == len(doc["gpus"]) and doc["baseline_gpus"] == len(expected)
    assert doc["lower_bound"] <= doc["cost"] + 1e-9
    if limits is not None and units:
        assert advertised <= limits.max_oversubscription * units + 1e-9
        for gpu in doc["gpus"]:
            assert limits.allows_profile(gpu["profile"]) or gpu["profile"].startswith("plan-") and \
                "*" in limits.allowed_profiles
    for name, count in doc["gpus_by_model"].items():
        supply = {catalog.lookup(s.model).name: s.count for s in demand.gpus}
        assert supply[name] is None or count <= supply[name]
    assert check_plan(plan) == []


# ---------------------------------------------------------------- optima worked out by hand


def test_untrusted_3g_instances_two_per_gpu() -> None:
    # 30 GiB and 0.4 of a GPU, untrusted: a 3g.40gb instance (39.5 GiB, 3/7) or larger, alone. An H100 holds at
    # most two instances of 3 or more compute slices, so 3 replicas need 2 GPUs.
    plan = pack(make({"memory_gib": 30, "compute": 0.4, "replicas": 3, "trust": "untrusted"}))
    assert_rules(plan)
    assert plan.gpus_used == 2 and plan.lower_bound == 2 and plan.optimal


@pytest.mark.parametrize(("replicas", "gpus"), [(7, 1), (8, 2)])
def test_seven_small_instances_per_gpu(replicas: int, gpus: int) -> None:
    # 9 GiB and 0.14 of a GPU, untrusted: 1g.10gb (9.75 GiB, 1/7 = 0.143); seven fit one H100.
    plan = pack(make({"memory_gib": 9, "compute": 0.14, "replicas": replicas, "trust": "untrusted"}))
    assert_rules(plan)
    assert plan.gpus_used == gpus == plan.lower_bound
    if replicas == 7:
        assert sum(plan.gpus[0].config.layout_dict.values()) == 7


def test_memory_bounds_time_slicing() -> None:
    # Trusted batch work of 30 GiB: at most two share an 80 GiB GPU however it is shared; five need three GPUs.
    plan = pack(make({"memory_gib": 30, "compute": 0.2, "replicas": 5}))
    assert_rules(plan)
    assert plan.gpus_used == 3 and plan.lower_bound == 3


def test_mps_for_latency_medium() -> None:
    # Online (latency medium): MPS but not time-slicing. Four clients of 18 GiB and 0.25 fit MPS x4 on one GPU.
    plan = pack(make({"kind": "online", "memory_gib": 18, "compute": 0.25, "replicas": 4}))
    assert_rules(plan)
    assert plan.gpus_used == 1 and plan.gpus[0].config.kind == "mps" and plan.gpus[0].config.replicas == 4


def test_untrusted_never_shares_a_gpu_without_mig() -> None:
    # An L4 has no MIG: two untrusted replicas need two L4s however small they are; trusted ones share one.
    gpus = [{"model": "NVIDIA L4"}]
    alone = pack(make({"memory_gib": 2, "compute": 0.05, "replicas": 2, "trust": "untrusted"}, gpus=gpus))
    shared = pack(make({"memory_gib": 2, "compute": 0.05, "replicas": 2}, gpus=gpus))
    assert_rules(alone)
    assert_rules(shared)
    assert (alone.gpus_used, shared.gpus_used) == (2, 1)
    assert shared.gpus[0].config.kind in ("time-slicing", "mps") and shared.gpus[0].config.replicas == 2


def test_compute_budget_limits_time_slicing() -> None:
    # Ten replicas of 0.3 of a GPU on L4s in dev (no MPS there: mig_strategy mixed): three per GPU by compute
    # (budget 1.0), two with a budget of 0.7.
    base = {"memory_gib": 4, "compute": 0.3, "replicas": 10}
    full = pack(make(base, gpus=[{"model": "NVIDIA L4"}]), env="dev")
    tight = pack(make(base, gpus=[{"model": "NVIDIA L4"}], compute_budget=0.7), env="dev")
    assert_rules(full, "dev")
    assert_rules(tight, "dev")
    assert (full.gpus_used, tight.gpus_used) == (4, 5)


def test_cost_objective_prefers_cheaper_gpus() -> None:
    # Four 10 GiB replicas: two L4s (24 GB, cost 0.25 each) cost 0.5; one H100 (cost 1) would hold all four.
    gpus = [{"model": H100, "cost": 1.0}, {"model": "NVIDIA L4", "cost": 0.25}]
    workload = {"memory_gib": 10, "compute": 0.2, "replicas": 4}
    cheap = pack(make(workload, gpus=gpus, objective="cost"))
    fewest = pack(make(workload, gpus=gpus))
    assert_rules(cheap)
    assert cheap.objective == pytest.approx(0.5) and cheap.gpus_used == 2
    assert {g.config.model.name for g in cheap.gpus} == {"NVIDIA L4"}
    assert cheap.lower_bound == pytest.approx(0.5, abs=1e-4)
    assert fewest.gpus_used == 1


def test_availability_is_respected() -> None:
    # Three H100s at most: the rest goes to A100s.
    gpus = [{"model": H100, "count": 3}, {"model": "NVIDIA A100-SXM4-80GB"}]
    plan = pack(make({"memory_gib": 60, "compute": 0.8, "replicas": 5}, gpus=gpus))
    assert_rules(plan)
    by_model = plan.as_json()["gpus_by_model"]
    assert by_model.get(H100, 0) <= 3 and plan.gpus_used == 5


def test_prod_oversubscription_limit_decides() -> None:
    # prod: ratio <= 1.5 and only its allowed profiles. notebooks-ts4 alone would hold all four replicas on one
    # GPU at ratio 4.0; nothing else fits four 10 GiB replicas on one GPU, so the optimum is 2 GPUs.
    plan = pack(make({"memory_gib": 10, "compute": 0.1, "replicas": 4}), env="prod")
    assert_rules(plan, "prod")
    assert plan.gpus_used == 2 and plan.lower_bound == 2
    assert plan.oversubscription() <= 1.5


def test_env_tenant_trust_wins(tmp_path: Path) -> None:
    # dev marks tenant partner-eval untrusted: its workloads get units of their own even if the file says trusted.
    demand = Demand.model_validate({"gpus": [{"model": H100}], "workloads": [
        {"name": "eval", "tenant": "partner-eval", "kind": "batch", "memory_gib": 4, "compute": 0.05,
         "replicas": 3, "trust": "trusted"}]})
    plan = pack(demand, env="dev")
    assert_rules(plan, "dev")
    assert all(len(u.replicas) <= 1 and u.kind.sharing == "exclusive" for g in plan.gpus for u in g.units)


def test_bigger_plan_keeps_rules_and_reports_gap() -> None:
    demand_path = ROOT / "examples" / "demand" / "inference.yaml"
    from gpushare.planner.demand import load_demand

    demand, doc = load_demand(demand_path)
    for env in (None, "dev", "pilot", "prod"):
        plan = plan_demand(demand, doc, env=env, time_limit=10)
        assert_rules(plan, env)
        assert plan.lower_bound <= plan.objective
        assert plan.gpus_used < plan.baseline_gpus


def test_a_plan_the_exact_mip_proves_optimal_has_no_gap() -> None:
    """The MIP over every fill proves the plan's cost optimal: that proof is the lower bound, so the text's
    "optimal (proven ...)" and the JSON's gap agree (the LP relaxation's value stays in lp_value)."""
    demand = ROOT / "examples" / "demand" / "training-cost.yaml"
    result = runner.invoke(app, ["pack", "--demand", str(demand), "--json", "--time-limit", "30"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["solve"]["method"] == "mip" and doc["optimal"] is True
    assert doc["gap"] == 0 and doc["lower_bound"] == doc["cost"]
    assert doc["lp_value"] < doc["cost"]  # the relaxation alone would have left a gap
    text = runner.invoke(app, ["pack", "--demand", str(demand), "--time-limit", "30"], env={"COLUMNS": "200"})
    assert f"lower bound {doc['cost']:g}: optimal (proven by the exact MIP)" in text.stdout


# ---------------------------------------------------------------- infeasible demand


def test_too_large_for_every_gpu_names_the_workload(tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump({"gpus": [{"model": "NVIDIA L4"}, {"model": H100}], "workloads": [
        {"name": "small", "tenant": "t", "kind": "batch", "memory_gib": 4, "compute": 0.1},
        {"name": "huge-model", "tenant": "t", "kind": "online", "memory_gib": 200, "compute": 1.0},
    ]}, sort_keys=False))
    result = runner.invoke(app, ["pack", "--demand", str(path), "--json"])
    assert result.exit_code == 1
    doc = json.loads(result.output)
    assert doc["ok"] is False
    problem = doc["problems"][0]
    assert "huge-model" in problem["message"] and "200 GiB" in problem["message"]
    line = path.read_text().splitlines().index("- name: huge-model") + 1
    assert problem["path"] == "workloads[1]" and problem["line"] == line and problem["fix"]


def test_isolation_no_model_offers(monkeypatch: pytest.MonkeyPatch) -> None:
    # An environment that allows only time-slicing cannot host an untrusted workload.
    from gpushare.planner import pack as pack_module
    from gpushare.planner.model import Limits

    profiles = pack_module._project_profiles()
    monkeypatch.setattr(pack_module, "environment_limits", lambda env: Limits(
        environment=None, allowed_profiles=lambda name: name == "notebooks-ts4", profiles=profiles))
    demand = make({"memory_gib": 4, "compute": 0.1},
                  {"memory_gib": 4, "compute": 0.1, "trust": "untrusted"}, gpus=[{"model": "NVIDIA L4"}])
    with pytest.raises(GpushareError) as err:
        pack(demand)
    assert len(err.value.problems) == 1
    message = err.value.problems[0].message
    assert "'w1'" in message and "untrusted" in message and "of its own" in message


def test_not_enough_gpus_is_an_error() -> None:
    demand = make({"memory_gib": 60, "compute": 0.9, "replicas": 3}, gpus=[{"model": H100, "count": 2}])
    with pytest.raises(GpushareError) as err:
        pack(demand)
    assert "cannot serve" in err.value.problems[0].message and err.value.exit_code == 1


def test_unknown_gpu_model_is_located(tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    path.write_text("gpus:\n  - {model: NVIDIA H200}\n  - {model: Quantum GPU 9000}\n"
                    "workloads:\n  - {name: a, tenant: t, kind: batch, memory_gib: 4, compute: 0.1}\n")
    result = runner.invoke(app, ["pack", "--demand", str(path), "--json"])
    assert result.exit_code == 1
    problem = json.loads(result.output)["problems"][0]
    assert problem["path"] == "gpus[1].model" and problem["line"] == 3 and "Quantum" in problem["message"]


# ---------------------------------------------------------------- the environment section


def _resolve_section(tmp_path: Path, section: dict[str, Any], env: str | None) -> Any:
    if env is None:
        data = {"name": "planned", "defaults": {"driver_branch": 580, "toolkit_version": "1.18.2"}, **section}
    else:
        data = copy.deepcopy(yaml.safe_load((ENVIRONMENTS / f"{env}.yaml").read_text()))
        data["pools"] = section["pools"]
        data["profiles"] = data.get("profiles", []) + section.get("profiles", [])
        data["tenants"] = []
    path = tmp_path / "environments" / f"{data['name']}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return resolve(path, PROFILES)


@pytest.mark.parametrize("env", [None, "dev", "prod"])
def test_env_out_parses_and_resolves_to_the_plan(tmp_path: Path, env: str | None) -> None:
    from gpushare.planner.demand import load_demand

    demand, doc = load_demand(ROOT / "examples" / "demand" / "inference.yaml")
    plan = plan_demand(demand, doc, env=env, time_limit=10)
    section = env_section(plan)
    for pool in section["pools"]:
        Pool.model_validate(pool)
    for profile in section.get("profiles", []):
        PROFILE_ADAPTER.validate_python(profile)
    fleet = _resolve_section(tmp_path, section, env)
    assert fleet.totals.physical_gpus == plan.gpus_used
    assert fleet.totals.hardware_units == sum(g.config.hardware_units for g in plan.gpus)
    assert fleet.totals.advertised_total == sum(g.config.advertised for g in plan.gpus)
    planned = sorted((p["model"], p["gpus"], tuple(sorted(p["layout"].items()))) for p in plan.pools())
    resolved = sorted((p.nodes[0].gpu_model.name, p.totals.physical_gpus,
                       tuple(sorted((p.nodes[0].mig_layout or {}).items()))) for p in fleet.pools)
    assert planned == resolved


def test_env_out_without_env_puts_mps_in_a_single_strategy_cluster(tmp_path: Path) -> None:
    plan = pack(make({"kind": "online", "memory_gib": 18, "compute": 0.25, "replicas": 4},
                     {"kind": "batch", "memory_gib": 30, "compute": 0.4, "replicas": 2, "trust": "untrusted"}))
    section = env_section(plan)
    clusters = {c["name"]: c["mig_strategy"] for c in section["clusters"]}
    assert clusters == {"planned": "mixed", "planned-mps": "single"}
    for pool in section["pools"]:
        assert pool["cluster"] == ("planned-mps" if pool["profile"].startswith(("mps", "plan-mps")) else "planned")
        assert sum(h["gpu_count"] for h in pool["hosts"]) >= 1
    fleet = _resolve_section(tmp_path, section, None)
    assert fleet.totals.physical_gpus == plan.gpus_used


# ---------------------------------------------------------------- CLI


def test_cli_json_contract(tmp_path: Path) -> None:
    out = tmp_path / "section.yaml"
    result = runner.invoke(app, ["pack", "--demand", str(ROOT / "examples" / "demand" / "inference.yaml"),
                                 "--env", "dev", "--env-out", str(out), "--json", "--time-limit", "10"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert {"ok", "gpus_used", "lower_bound", "baseline_gpus", "assignments", "gpus"} <= set(doc)
    assert doc["ok"] is True and isinstance(doc["lower_bound"], (int, float))
    assert doc["gpus_used"] == len(doc["gpus"]) >= doc["lower_bound"]
    assert len(doc["assignments"]) == doc["baseline_gpus"]
    assert {"workload", "replica", "gpu", "model", "mig_profile", "sharing"} <= set(doc["assignments"][0])
    assert {"model", "layout", "workloads"} <= set(doc["gpus"][0])
    section = yaml.safe_load(out.read_text())
    assert section["pools"] and out.read_text().startswith("# Planned by `gpushare pack`")


def test_cli_gpus_option_and_table(tmp_path: Path) -> None:
    demand = ROOT / "examples" / "demand" / "inference.yaml"
    result = runner.invoke(app, ["pack", "--demand", str(demand), "--gpus", "NVIDIA A100-SXM4-80GB=20",
                                 "--json"])
    assert result.exit_code == 0, result.output
    assert set(json.loads(result.output)["gpus_by_model"]) == {"NVIDIA A100-SXM4-80GB"}
    table = runner.invoke(app, ["pack", "--demand", str(demand)], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "lower bound" in table.output and "one GPU per replica" in table.output
    missing = runner.invoke(app, ["pack", "--demand", str(tmp_path / "none.yaml")])
    assert missing.exit_code == 2


def test_lower_bound_is_a_whole_number_of_gpus() -> None:
    plan = pack(make({"memory_gib": 11, "compute": 0.3, "replicas": 5},
                     {"kind": "online", "memory_gib": 30, "compute": 0.5, "latency": "high", "replicas": 3}))
    assert_rules(plan)
    assert plan.lower_bound == math.floor(plan.lower_bound) and plan.lower_bound <= plan.gpus_used


def test_the_plan_check_catches_broken_plans() -> None:
    # The independent check that guards every plan must see a broken rule, or the guard guards nothing.
    plan = pack(make({"memory_gib": 9, "compute": 0.1, "replicas": 2, "trust": "untrusted"},
                     {"memory_gib": 9, "compute": 0.1, "replicas": 3}))
    assert check_plan(plan) == []
    units = [u for g in plan.gpus for u in g.units if u.replicas]
    untrusted = next(u for u in units if plan.demand.workloads[u.replicas[0][0]].trust == "untrusted")
    other = next(u for u in units if u is not untrusted)
    other.replicas.append(untrusted.replicas.pop())
    problems = " ".join(check_plan(plan))
    assert "not placed" not in problems and ("of its own" in problems or "exclusive unit holds" in problems)
    other.replicas.append(other.replicas[-1])
    assert "placed 2 times" in " ".join(check_plan(plan))


# ---------------------------------------------------------------- issue 20: usable memory, driver branch, errors


def test_an_80_gib_untrusted_replica_no_longer_fits_a_whole_h100() -> None:
    with pytest.raises(GpushareError) as err:
        pack(make({"memory_gib": 80, "compute": 0.5, "trust": "untrusted"}))
    assert "CUDA context" in err.value.problems[0].message
    # Without the context reserve it fits exactly, which is what the plan used to say.
    assert pack(make({"memory_gib": 80, "compute": 0.5, "trust": "untrusted"}, context_reserve_gib=0)).gpus_used == 1


def test_the_guardrails_set_the_context_reserve_and_the_demand_file_overrides_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    workspace = tmp_path / "ws"
    shutil.copytree(ROOT / "tests" / "fixtures", workspace)
    rails = workspace / "policies" / "guardrails.yaml"
    rails.write_text(rails.read_text() + "planner: {context_reserve_gib: 0}\n")
    monkeypatch.setenv("GPUSHARE_ROOT", str(workspace))
    whole = {"memory_gib": 80, "compute": 0.5, "trust": "untrusted"}
    assert pack(make(whole)).demand.context_reserve_gib == 0 and pack(make(whole)).gpus_used == 1
    with pytest.raises(GpushareError, match="CUDA context"):
        pack(make(whole, context_reserve_gib=0.5))  # set in the demand file: it wins over the guardrails


def test_the_context_reserve_takes_room_on_a_shared_unit() -> None:
    # Eight 10 GiB MPS clients filled one 80 GiB GPU; with 0.5 GiB of context each they need two.
    eight = {"memory_gib": 10, "compute": 0.1, "replicas": 8, "kind": "online"}
    assert pack(make(eight, gpus=[{"model": "NVIDIA L40S"}], context_reserve_gib=0)).gpus_used == 2
    no_mig = [{"model": "NVIDIA H100 PCIe"}]
    plan = pack(make({**eight, "memory_gib": 9.5}, gpus=no_mig, context_reserve_gib=0.5))
    assert_rules(plan)
    units = [u for g in plan.as_json()["gpus"] for u in g["units"]]
    assert all(len(u["workloads"]) * 10.0 <= u["memory_gib"] + 1e-9 for u in units)


def test_profiles_that_need_a_newer_driver_are_not_planned() -> None:
    small = {"memory_gib": 8, "compute": 0.1, "replicas": 7, "trust": "untrusted"}
    a100 = [{"model": "NVIDIA A100-SXM4-40GB"}]
    new = pack(make(small, gpus=a100, driver_branch=580, context_reserve_gib=0))
    old = pack(make(small, gpus=a100, driver_branch=470, context_reserve_gib=0))
    used = {p for plan in (new,) for g in plan.as_json()["gpus"] for p in g["layout"]}
    assert "1g.10gb" in used or new.gpus_used == 1
    assert all("1g.10gb" not in g["layout"] for g in old.as_json()["gpus"])
    assert any("R470" in note for note in old.problem.notes)


def test_empty_demand_says_what_to_add(tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    path.write_text("gpus:\n  - {model: NVIDIA L4}\nworkloads: []\n")
    result = runner.invoke(app, ["pack", "--demand", str(path), "--json"])
    problem = json.loads(result.stdout)["problems"][0]
    assert result.exit_code == 1 and "no workloads" in problem["message"] and "add workloads" in problem["fix"]


def test_proven_short_supply_does_not_ask_for_more_time() -> None:
    demand = make({"memory_gib": 60, "compute": 0.9, "replicas": 3}, gpus=[{"model": H100, "count": 2}])
    with pytest.raises(GpushareError) as err:
        pack(demand)
    problem = err.value.problems[0]
    assert "proven" in problem.message and "time-limit" not in problem.fix and "raise the counts" in problem.fix


def _plan_in_a_process(demand: Path, seed: str) -> bytes:
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run([sys.executable, "-m", "gpushare", "pack", "--demand", str(demand), "--json"],
                         env=env, capture_output=True, check=True).stdout
    doc = json.loads(out)
    for key in ("seconds", "lp_seconds"):  # wall-clock readings, the only fields allowed to differ
        doc["solve"].pop(key, None)
    return json.dumps(doc, sort_keys=True).encode()


@pytest.mark.slow
def test_the_same_demand_gives_the_same_plan_in_separate_processes(tmp_path: Path) -> None:
    # Enough replica types that column generation, the knapsack search and the MIP all run.
    workloads = [{"name": f"w{k}", "tenant": "t", "kind": ("batch", "online", "dev")[k % 3],
                  "memory_gib": 2 + (k * 7919 % 37), "compute": round(0.03 + (k * 104729 % 40) / 100, 2),
                  "replicas": 1 + k % 4, "trust": "untrusted" if k % 7 == 0 else "trusted"} for k in range(60)]
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump({"gpus": [{"model": H100}, {"model": "NVIDIA L4"}], "workloads": workloads}))
    first = _plan_in_a_process(path, "1")
    assert json.loads(first)["solve"]["cut_by_time_limit"] is False
    assert first == _plan_in_a_process(path, "2")
