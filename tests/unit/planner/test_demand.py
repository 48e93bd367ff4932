"""The demand file: strict keys, located errors with fixes, defaults, and the --gpus option."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpushare.core.errors import GpushareError
from gpushare.planner.demand import Demand, load_demand, parse_gpus_option
from tests.conftest import ROOT

EXAMPLES = sorted((ROOT / "examples" / "demand").glob("*.yaml"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "demand.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_load(path: Path) -> None:
    demand, _ = load_demand(path)
    assert demand.workloads and demand.gpus


def test_defaults_follow_the_kind() -> None:
    demand = Demand.model_validate({"workloads": [
        {"name": "a", "tenant": "t", "kind": "online", "memory_gib": 4, "compute": 0.1},
        {"name": "b", "tenant": "t", "kind": "batch", "memory_gib": 4, "compute": 0.1},
        {"name": "c", "tenant": "t", "kind": "online", "memory_gib": 4, "compute": 0.1, "latency": "high"},
    ]})
    assert [w.latency_class for w in demand.workloads] == ["medium", "low", "high"]
    assert demand.workloads[0].replicas == 1 and demand.workloads[0].trust == "trusted"
    assert demand.objective == "gpus" and demand.compute_budget == 1.0


def test_unknown_key_is_located_with_a_fix(tmp_path: Path) -> None:
    path = write(tmp_path, """\
gpus:
  - {model: NVIDIA L4}
workloads:
  - name: a
    tenant: t
    kind: online
    memory_gb: 4
    compute: 0.1
""")
    with pytest.raises(GpushareError) as err:
        load_demand(path)
    problems = {p.path: p for p in err.value.problems}
    unknown = problems["workloads[0].memory_gb"]
    assert unknown.line == 7 and unknown.file == str(path)
    assert "did you mean 'memory_gib'" in (unknown.fix or "")
    assert "workloads[0].memory_gib" not in problems  # the misspelling is said once, as the unknown key


def test_values_out_of_range_are_located(tmp_path: Path) -> None:
    path = write(tmp_path, """\
workloads:
  - {name: a, tenant: t, kind: online, memory_gib: 4, compute: 1.5}
  - {name: b, tenant: t, kind: nightly, memory_gib: 4, compute: 0.5}
""")
    with pytest.raises(GpushareError) as err:
        load_demand(path)
    where = {p.path: p for p in err.value.problems}
    assert "workloads[0].compute" in where and where["workloads[0].compute"].line == 2
    assert "workloads[1].kind" in where and "online" in (where["workloads[1].kind"].fix or "")


def test_duplicate_workload_points_at_the_second(tmp_path: Path) -> None:
    path = write(tmp_path, yaml.safe_dump({"workloads": [
        {"name": "a", "tenant": "t", "kind": "online", "memory_gib": 4, "compute": 0.1},
        {"name": "a", "tenant": "t", "kind": "batch", "memory_gib": 8, "compute": 0.2},
    ]}, sort_keys=False))
    with pytest.raises(GpushareError) as err:
        load_demand(path)
    problem = err.value.problems[0]
    assert problem.path == "workloads[1].name" and "listed twice" in problem.message and problem.fix


def test_not_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(GpushareError) as err:
        load_demand(write(tmp_path, "- just\n- a list\n"))
    assert "mapping" in err.value.problems[0].message


def test_missing_file_is_exit_2(tmp_path: Path) -> None:
    with pytest.raises(GpushareError) as err:
        load_demand(tmp_path / "nope.yaml")
    assert err.value.exit_code == 2


def test_gpus_option() -> None:
    supply = parse_gpus_option("NVIDIA H100 80GB HBM3=16, NVIDIA L4")
    assert [(s.model, s.count) for s in supply] == [("NVIDIA H100 80GB HBM3", 16), ("NVIDIA L4", None)]
    for bad in ("NVIDIA L4=two", "NVIDIA L4,,A30", "NVIDIA L4=-1"):
        with pytest.raises(GpushareError) as err:
            parse_gpus_option(bad)
        assert err.value.exit_code == 2 and err.value.problems[0].fix
