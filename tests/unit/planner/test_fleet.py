"""`gpushare pack --fleet ENV`: re-planning existing hosts with the fewest drains. The fleet cases of issue 20: an
all-7x1g fleet asked for 3g instances (one host must change, and that is proven least), a fleet with spare whole
GPUs (served as it is), a fleet that already fits (zero changes); plus --max-changes, additions and the patch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core.errors import GpushareError
from gpushare.planner.demand import Demand
from gpushare.planner.pack import PackPlan, plan_demand
from tests.conftest import WORKSPACE

H100 = "NVIDIA H100 80GB HBM3"
runner = CliRunner()


def _host(name: str, gpus: int) -> dict[str, Any]:
    return {"name": name, "address": f"10.9.0.{int(name[-2:])}", "gpu_count": gpus}


def _pool(name: str, profile: str, *hosts: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "cluster": "dev-metal", "purpose": "inference", "gpu_model": H100, "profile": profile,
            "hosts": list(hosts)}


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A copy of the frozen workspace whose dev environment is the pools given."""
    root = tmp_path / "ws"
    shutil.copytree(WORKSPACE, root)
    monkeypatch.setenv("GPUSHARE_ROOT", str(root))
    base = yaml.safe_load((WORKSPACE / "environments" / "dev.yaml").read_text())

    def write(*pools: dict[str, Any]) -> Path:
        env = {key: base[key] for key in ("name", "description", "defaults", "clusters")}
        env["pools"] = list(pools)
        env["tenants"] = [{"name": "t", "namespace": "t-work", "trust": "trusted", "priority": "batch",
                           "quota": {}}]
        path = root / "environments" / "dev.yaml"
        path.write_text(yaml.safe_dump(env, sort_keys=False))
        return path

    return write


def replan(*workloads: dict[str, Any], gpus: list[dict[str, Any]] | None = None, **options: Any) -> PackPlan:
    named = [{"name": f"w{k}", "tenant": "t", "kind": "online", **w} for k, w in enumerate(workloads)]
    demand = Demand.model_validate({"gpus": gpus or [], "workloads": named})
    return plan_demand(demand, fleet="dev", time_limit=30, **options)


SMALL = ("h100-small", "mig-small")  # 7 x 1g.10gb per H100
UNTRUSTED_30 = {"memory_gib": 30, "compute": 0.3, "trust": "untrusted"}


def test_an_all_1g_fleet_asked_for_3g_instances_drains_one_host(fleet: Any) -> None:
    fleet(_pool(*SMALL, _host("r-01", 4), _host("r-02", 4)))
    plan = replan({**UNTRUSTED_30, "replicas": 4})
    changes = plan.as_json()["changes"]
    # Two GPUs with two 3g instances each serve four replicas; a host changes as a whole (4 GPUs).
    assert changes == {"gpus_reconfigured": 4, "nodes_drained": ["r-01"], "gpus_added": 0, "gpus_added_bound": 0,
                       "gpus_freed": 6, "lower_bound": 4}
    layouts = [g["layout"] for g in plan.as_json()["gpus"]]
    assert all(layout.get("3g.40gb", 0) >= 1 for layout in layouts) and len(layouts) == 2


def test_spare_whole_gpus_serve_without_a_change(fleet: Any) -> None:
    fleet(_pool(*SMALL, _host("r-01", 4)), _pool("h100-whole", "exclusive", _host("r-03", 2)))
    plan = replan({**UNTRUSTED_30, "replicas": 2})
    changes = plan.as_json()["changes"]
    assert changes["gpus_reconfigured"] == 0 and changes["nodes_drained"] == [] and changes["gpus_added"] == 0
    assert {g["profile"] for g in plan.as_json()["gpus"]} == {"exclusive"}


def test_a_fleet_that_already_fits_needs_zero_changes(fleet: Any) -> None:
    fleet(_pool(*SMALL, _host("r-01", 2)))
    plan = replan({"memory_gib": 8, "compute": 0.1, "replicas": 10, "trust": "untrusted"})
    assert plan.as_json()["changes"] == {"gpus_reconfigured": 0, "nodes_drained": [], "gpus_added": 0,
                                         "gpus_added_bound": 0, "gpus_freed": 0, "lower_bound": 0}
    assert plan.gpus_used == 2


def test_max_changes_zero_adds_gpus_where_the_demand_allows(fleet: Any) -> None:
    fleet(_pool(*SMALL, _host("r-01", 4)))
    with pytest.raises(GpushareError) as err:
        replan({**UNTRUSTED_30, "replicas": 4}, max_changes=0)
    assert "gpus:" in err.value.problems[0].fix and "--max-changes" in err.value.problems[0].fix
    plan = replan({**UNTRUSTED_30, "replicas": 4}, gpus=[{"model": H100}], max_changes=0)
    changes = plan.as_json()["changes"]
    assert changes["gpus_reconfigured"] == 0 and changes["gpus_added"] == 2
    # No 3g instance without a change, and no GPU holds more than two: two added is proven least.
    assert changes["gpus_added_bound"] == 2


def test_cli_writes_the_patch_and_the_changes(fleet: Any, tmp_path: Path) -> None:
    fleet(_pool(*SMALL, _host("r-01", 4), _host("r-02", 4)))
    demand = tmp_path / "d.yaml"
    demand.write_text(yaml.safe_dump({"workloads": [{"name": "svc", "tenant": "t", "kind": "online",
                                                     **UNTRUSTED_30, "replicas": 4}]}))
    patch = tmp_path / "patch.yaml"
    result = runner.invoke(app, ["pack", "--demand", str(demand), "--fleet", "dev", "--env-out", str(patch),
                                 "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["changes"]["nodes_drained"] == ["r-01"]
    written = yaml.safe_load(patch.read_text())
    assert [(h["pool"], h["host"], h["was"]) for h in written["hosts"]] == [("h100-small", "r-01", "mig-small")]
    new = written["hosts"][0]["profile"]
    assert any(p["name"] == new for p in written.get("profiles", [])) or new in {"mig-balanced", "mig-llm-serving"}


def test_many_replica_types_still_get_a_proven_change_bound(fleet: Any) -> None:
    # More replica types than fills can be enumerated for: the bound comes from the compact relaxation.
    fleet(_pool(*SMALL, _host("r-01", 4), _host("r-02", 4)), _pool("h100-whole", "exclusive", _host("r-03", 4)))
    many = [{"memory_gib": 2 + k * 0.7, "compute": 0.02 + k * 0.004, "trust": "untrusted" if k % 3 else "trusted",
             "kind": "batch"} for k in range(45)]
    plan = replan(*many, gpus=[{"model": H100}])
    changes = plan.as_json()["changes"]
    assert plan.stats["exhaustive"] is False
    # Any plan needs 14 GPUs (the GPU bound), so at least two are added; every host changes as a whole.
    assert plan.lower_bound == 14 and changes["gpus_added"] >= 2
    assert 2 <= changes["gpus_added_bound"] <= changes["gpus_added"]
    assert 0 < changes["lower_bound"] <= changes["gpus_reconfigured"] == 4 * len(changes["nodes_drained"])


def test_the_change_bound_from_the_lp_alone_is_whole_hosts_and_holds(fleet: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # Past BOUND_MIP_TYPES the bound on changes is the LP's, rounded up to GPUs whole hosts hold (4 each here).
    import gpushare.planner.fleet as planner_fleet

    monkeypatch.setattr(planner_fleet, "BOUND_MIP_TYPES", 0)
    fleet(_pool(*SMALL, _host("r-01", 4), _host("r-02", 4)), _pool("h100-whole", "exclusive", _host("r-03", 4)))
    many = [{"memory_gib": 2 + k * 0.7, "compute": 0.02 + k * 0.004, "trust": "untrusted" if k % 3 else "trusted",
             "kind": "batch"} for k in range(45)]
    changes = replan(*many, gpus=[{"model": H100}]).as_json()["changes"]
    assert changes["lower_bound"] % 4 == 0 and 0 < changes["lower_bound"] <= changes["gpus_reconfigured"]


def test_host_sums_round_a_bound_up_to_what_whole_hosts_hold() -> None:
    from gpushare.planner.fleet import HostClass, host_sum_at_least

    eights, threes = HostClass(H100, 0, 8, [None] * 3), HostClass(H100, 1, 3, [None] * 2)  # type: ignore[list-item]
    totals = {value: host_sum_at_least([eights, threes], value) for value in (0, 0.2, 3, 3.1, 6.5, 9, 22.5, 30, 31)}
    # Reachable totals: 0, 3, 6, 8, 11, 14, 16, 19, 22, 24, 27, 30; past the fleet the value itself.
    assert totals == {0: 0, 0.2: 3, 3: 3, 3.1: 6, 6.5: 8, 9: 11, 22.5: 24, 30: 30, 31: 31}


@pytest.mark.slow
def test_a_re_plan_is_the_same_in_separate_processes(fleet: Any, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    fleet(_pool(*SMALL, _host("r-01", 4), _host("r-02", 4)), _pool("h100-whole", "exclusive", _host("r-03", 4)))
    demand = tmp_path / "d.yaml"
    many = [{"name": f"w{k}", "tenant": "t", "kind": "batch", "memory_gib": 2 + k * 0.7, "compute": 0.02 + k * 0.004,
             "trust": "untrusted" if k % 3 else "trusted"} for k in range(45)]
    demand.write_text(yaml.safe_dump({"gpus": [{"model": H100}], "workloads": many}))
    outputs = []
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-m", "gpushare", "pack", "--demand", str(demand), "--fleet", "dev",
                              "--json"], env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True,
                             check=True).stdout
        doc = json.loads(out)
        doc["solve"].pop("seconds")  # the one wall-clock reading
        outputs.append(json.dumps(doc, sort_keys=True))
    assert outputs[0] == outputs[1] and json.loads(outputs[0])["changes"]["gpus_reconfigured"] > 0


def _captured(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The arguments pack gives plan_fleet (problem, hosts, addable, ...), for building its model in a test."""
    import gpushare.planner.pack as pack

    seen: list[tuple[Any, ...]] = []
    real = pack.plan_fleet

    def spy(*args: Any) -> Any:
        seen.append(args)
        return real(*args)

    monkeypatch.setattr(pack, "plan_fleet", spy)
    return seen


def test_the_trivial_plan_of_a_serving_fleet_is_accepted_by_highs(fleet: Any, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    import highspy

    from gpushare.planner.fleet import FleetModel, current_hint, host_classes
    from gpushare.planner.solve import Data

    # Two hosts of 8 GPUs: 7 x 1g.10gb each serve 100 small replicas of 9 types as they are.
    fleet(_pool(*SMALL, _host("r-01", 8), _host("r-02", 8)))
    seen = _captured(monkeypatch)
    small = [{"memory_gib": 4 + k * 0.5, "compute": 0.05, "replicas": 11 + k % 2, "trust": "untrusted"}
             for k in range(9)]
    plan = replan(*small, gpus=[{"model": H100}])
    assert plan.as_json()["changes"]["gpus_reconfigured"] == 0 and plan.as_json()["changes"]["gpus_added"] == 0
    assert plan.stats["stage_mips"] == 0  # answered by the fleet as it is, without a MIP
    problem, hosts, addable, max_changes, _ = seen[0]
    data = Data(problem)
    classes = host_classes(problem, hosts)
    adds = [g.index for g in data.configs if g.model.name in addable]
    hint = current_hint(data, classes, adds)
    assert hint is not None and not hint.change and not hint.add
    model = FleetModel(data, classes, list(hint.fills), addable, max_changes)
    x = model.vector(hint)
    assert x is not None
    # HiGHS itself with every column fixed at the start: feasible means it accepts the start.
    model.h.changeColsBounds(model.total, np.arange(model.total, dtype=np.int32), x, x)
    model.h.run()
    assert model.h.getModelStatus() == highspy.HighsModelStatus.kOptimal


def test_a_start_that_breaks_a_row_is_not_given(fleet: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpushare.planner.fleet import FleetModel, current_hint, host_classes
    from gpushare.planner.solve import Data

    fleet(_pool(*SMALL, _host("r-01", 2)))
    seen = _captured(monkeypatch)
    replan({"memory_gib": 8, "compute": 0.1, "replicas": 10, "trust": "untrusted"})
    problem, hosts, addable, max_changes, _ = seen[0]
    data = Data(problem)
    classes = host_classes(problem, hosts)
    hint = current_hint(data, classes, [])
    assert hint is not None
    model = FleetModel(data, classes, list(hint.fills), addable, max_changes)
    assert model.vector(hint) is not None
    hint.fills = {f: n - 1 for f, n in hint.fills.items()}  # one replica short of the demand
    assert model.vector(hint) is None


def test_a_plan_never_adds_gpus_where_the_fleet_can_change_to_serve(fleet: Any) -> None:
    # Whole GPUs that cannot be added (no gpus: list): the untrusted 30 GiB replicas need 3g instances, so hosts
    # must change; the plan from nothing, mapped onto whole hosts, must not round into additions.
    fleet(_pool(*SMALL, _host("r-01", 8), _host("r-02", 8), _host("r-03", 8)))
    plan = replan({**UNTRUSTED_30, "replicas": 9}, {"memory_gib": 8, "compute": 0.1, "replicas": 40,
                                                     "trust": "untrusted"})
    changes = plan.as_json()["changes"]
    assert changes["gpus_added"] == 0 and 0 < changes["lower_bound"] <= changes["gpus_reconfigured"] <= 16
