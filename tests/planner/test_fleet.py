"""`gpushare pack --fleet ENV`: re-planning existing hosts with the fewest drains. The fleet cases of issue 20: an
all-7x1g fleet asked for 3g instances (one host must change, and that is proven least), a fleet with spare whole
GPUs (served as it is), a fleet that already fits (zero changes); plus --max-changes, additions and the patch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

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
    assert changes == {"gpus_reconfigured": 4, "nodes_drained": ["r-01"], "gpus_added": 0, "gpus_freed": 6,
                       "lower_bound": 4}
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
                                         "gpus_freed": 0, "lower_bound": 0}
    assert plan.gpus_used == 2


def test_max_changes_zero_adds_gpus_where_the_demand_allows(fleet: Any) -> None:
    fleet(_pool(*SMALL, _host("r-01", 4)))
    with pytest.raises(GpushareError) as err:
        replan({**UNTRUSTED_30, "replicas": 4}, max_changes=0)
    assert "gpus:" in err.value.problems[0].fix and "--max-changes" in err.value.problems[0].fix
    plan = replan({**UNTRUSTED_30, "replicas": 4}, gpus=[{"model": H100}], max_changes=0)
    changes = plan.as_json()["changes"]
    assert changes["gpus_reconfigured"] == 0 and changes["gpus_added"] == 2


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
    assert 0 < changes["lower_bound"] <= changes["gpus_reconfigured"] == 4 * len(changes["nodes_drained"])


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
