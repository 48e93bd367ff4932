"""The shipped environments resolve, and every kind of bad input gets a located error with a fix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.resolve import resolve, resolve_env
from tests.conftest import (
    ENVIRONMENTS,
    PROFILES,
    ROOT,
    SHIPPED_ENVIRONMENTS,
    cluster_named,
    host_named,
    pool_named,
    tenant_named,
)


@pytest.mark.parametrize("env", ["dev", "pilot", "prod"])
def test_shipped_environment_resolves(env: str, shipped_workspace: Path) -> None:
    fleet = resolve_env(env)
    assert fleet.environment == env
    kinds = {p.cluster_kind for p in fleet.pools}
    assert "bare-metal" in kinds
    if env != "dev":
        assert kinds & {"gke", "eks"}
    purposes = {(p.purpose, p.sharing) for p in fleet.pools}
    assert ("inference", "mig") in purposes
    assert ("training", "exclusive") in purposes
    assert any(p.sharing == "time-slicing" and not p.nodes[0].gpu_model.mig_capable for p in fleet.pools)
    assert fleet.totals.physical_gpus > 0


@pytest.mark.parametrize("env", ["dev", "pilot", "prod"])
def test_environment_files_point_at_the_schema(env: str) -> None:
    first = (SHIPPED_ENVIRONMENTS / f"{env}.yaml").read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=../schema/environment.schema.json"


def problems_of(path: Path) -> list[Problem]:
    with pytest.raises(GpushareError) as info:
        resolve(path, PROFILES)
    assert info.value.exit_code == 1
    return info.value.problems


def one_problem(path: Path) -> Problem:
    problems = problems_of(path)
    assert len(problems) == 1, [str(p) for p in problems]
    return problems[0]


Mutate = Callable[[dict[str, Any]], None]


def _misspelt_key(d: dict[str, Any]) -> None:
    host_named(d, "dev-a100-01")["gpu_cuont"] = 8


def test_misspelt_key_names_file_line_path_and_suggests(dev_data: dict[str, Any], write_env: Any) -> None:
    _misspelt_key(dev_data)
    path = write_env(dev_data)
    p = one_problem(path)
    assert p.file == str(path)
    assert p.path == "pools[0].hosts[0].gpu_cuont"
    assert p.line is not None and p.line > 1
    assert "unknown key" in p.message
    assert p.fix and "did you mean 'gpu_count'" in p.fix


CASES: list[tuple[str, Mutate, str, str]] = [
    ("unknown GPU model",
     lambda d: pool_named(d, "h100-training").__setitem__("gpu_model", "NVIDIA H100 90GB"),
     "pools[1].gpu_model", "H100 90GB"),
    ("MIG profile on a GPU without MIG",
     lambda d: pool_named(d, "l4-notebooks").__setitem__("profile", "mig-balanced"),
     "pools[2].profile", "NVIDIA L4 has no MIG"),
    ("explicit layout missing for the model",
     lambda d: pool_named(d, "a100-inference").update(gpu_model="NVIDIA A30", profile="mig-llm-serving"),
     "pools[0].profile", "has no layout for NVIDIA A30"),
    ("replicas below 2",
     lambda d: d.setdefault("profiles", []).append(
         {"name": "ts1", "kind": "time-slicing", "time_slicing": {"replicas": 1}}),
     "profiles[0].time_slicing.replicas", "greater than or equal to 2"),
    ("MPS on MIG",
     lambda d: d.setdefault("profiles", []).append(
         {"name": "mps-mig", "kind": "mps", "mps": {"replicas": 2}, "mig": {"layout": "balanced"}}),
     "profiles[0]", "MPS is never used on MIG devices"),
    ("duplicate host in one pool",
     lambda d: pool_named(d, "a100-inference")["hosts"].append(
         {"name": "dev-a100-01", "address": "10.40.1.99", "gpu_count": 8}),
     "pools[0].hosts[1].name", "listed twice in this pool"),
    ("host in two pools",
     lambda d: pool_named(d, "h100-training")["hosts"].append(
         {"name": "dev-a100-01", "address": "10.40.1.98", "gpu_count": 8}),
     "pools[1].hosts[1].name", "in pools 'a100-inference' and 'h100-training'"),
    ("two hosts, one address",
     lambda d: pool_named(d, "h100-training")["hosts"].append(
         {"name": "dev-h100-02", "address": "10.40.2.11", "gpu_count": 8}),
     "pools[1].hosts[1].address", "also host 'dev-h100-01'"),
    ("tenant quota on a resource no pool advertises",
     lambda d: tenant_named(d, "search")["quota"].__setitem__("nvidia.com/mig-7g.80gb", 1),
     "tenants[0].quota.nvidia.com/mig-7g.80gb", "no pool in dev-metal advertises"),
    ("borrowing without quota",
     lambda d: tenant_named(d, "research").__setitem__("borrowing_limit", {"nvidia.com/gpu.shared": 2}),
     "tenants[1].borrowing_limit.nvidia.com/gpu.shared", "has no quota on it"),
    ("unknown cluster",
     lambda d: pool_named(d, "a100-inference").__setitem__("cluster", "nowhere"),
     "pools[0].cluster", "unknown cluster 'nowhere'"),
    ("unknown profile",
     lambda d: pool_named(d, "a100-inference").__setitem__("profile", "mig-huge"),
     "pools[0].profile", "unknown sharing profile 'mig-huge'"),
    ("MPS with the mixed strategy",
     lambda d: pool_named(d, "l4-notebooks").__setitem__("profile", "mps-4"),
     "pools[2].profile", "refuses MPS with the mixed strategy"),
    ("several MIG profiles under the single strategy",
     lambda d: cluster_named(d, "dev-metal").__setitem__("mig_strategy", "single"),
     "pools[0].profile", "mig_strategy single"),
    ("profile too new for the host's driver",
     lambda d: pool_named(d, "a100-inference").update(gpu_model="NVIDIA A100-SXM4-40GB", profile="mig-a100-40-small")
     or host_named(d, "dev-a100-01").__setitem__("driver_branch", 470)
     or d.setdefault("profiles", []).append({"name": "mig-a100-40-small", "kind": "mig",
                                             "mig": {"layouts": {"NVIDIA A100-SXM4-40GB": "1g.10gb=4"}}}),
     "pools[0].profile", "R525"),
    ("cloud pool in a bare-metal cluster",
     lambda d: pool_named(d, "l4-notebooks").update(
         hosts=[], cloud={"machine_type": "g2-standard-24", "gpus_per_node": 2, "node_count": 1}),
     "pools[2].cloud", "cluster 'dev-metal' is bare metal"),
    ("host label in gpushare's namespace",
     lambda d: pool_named(d, "a100-inference").__setitem__("labels", {"gpushare.io/pool": "x"}),
     "pools[0].labels", "set by gpushare itself"),
]


@pytest.mark.parametrize(("case", "mutate", "path", "text"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_located(case: str, mutate: Mutate, path: str, text: str,
                              dev_data: dict[str, Any], write_env: Any) -> None:
    mutate(dev_data)
    env_file = write_env(dev_data)
    problems = problems_of(env_file)
    matching = [p for p in problems if p.path == path and text in p.message]
    assert matching, [str(p) for p in problems]
    p = matching[0]
    assert p.file == str(env_file)
    assert p.line is not None
    assert p.fix


def test_layout_that_does_not_fit(dev_data: dict[str, Any], write_env: Any) -> None:
    dev_data["profiles"] = [{"name": "too-big", "kind": "mig",
                             "mig": {"layouts": {"NVIDIA A100-SXM4-80GB": "4g.40gb=1,3g.40gb=1,1g.10gb=1"}}}]
    pool_named(dev_data, "a100-inference")["profile"] = "too-big"
    problems = problems_of(write_env(dev_data))
    assert {p.path for p in problems} == {"pools[0].profile"}
    assert all("NVIDIA A100-SXM4-80GB" in p.message and "too-big" in p.message for p in problems)
    assert any("memory slices" in p.message for p in problems)


def test_profile_file_errors_name_the_profile_file(tmp_path: Path, dev_data: dict[str, Any],
                                                   write_env: Any) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "ts.yaml").write_text("name: ts\nkind: time-slicing\ntime_slicing:\n  replicas: 4\n  rename: true\n")
    with pytest.raises(GpushareError) as info:
        resolve(write_env(dev_data), profiles)
    (p,) = info.value.problems
    assert p.file == str(profiles / "ts.yaml")
    assert p.path == "time_slicing.rename"
    assert p.line == 5
    assert p.fix and "rename_by_default" in p.fix


def test_profile_file_name_must_match(tmp_path: Path, dev_data: dict[str, Any], write_env: Any) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "ts.yaml").write_text("name: other\nkind: exclusive\n")
    with pytest.raises(GpushareError, match="differs from its file name"):
        resolve(write_env(dev_data), profiles)


def test_duplicate_yaml_key_is_an_error(tmp_path: Path) -> None:
    text = (ENVIRONMENTS / "dev.yaml").read_text().replace("name: dev\n", "name: dev\nname: dev2\n", 1)
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    p = one_problem(path)
    assert "'name' appears twice" in p.message
    assert p.line == text.splitlines().index("name: dev2") + 1


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: dev\npools: [\n")
    p = one_problem(path)
    assert "not valid YAML" in p.message and p.line is not None


def test_unknown_environment_name_is_unusable_input() -> None:
    with pytest.raises(GpushareError) as info:
        resolve_env("staging")
    assert info.value.exit_code == 2
    assert "dev" in (info.value.problems[0].fix or "")


def test_every_problem_is_reported_at_once(dev_data: dict[str, Any], write_env: Any) -> None:
    pool_named(dev_data, "h100-training")["gpu_model"] = "NVIDIA H100 90GB"
    pool_named(dev_data, "l4-notebooks")["profile"] = "mig-balanced"
    tenant_named(dev_data, "search")["quota"]["nvidia.com/mig-7g.80gb"] = 1
    host_named(dev_data, "dev-a100-01")["gpu_count"] = 0
    paths = {p.path for p in problems_of(write_env(dev_data))}
    assert paths == {"pools[0].hosts[0].gpu_count"}  # schema errors stop before resolution
    host_named(dev_data, "dev-a100-01")["gpu_count"] = 8
    paths = {p.path for p in problems_of(write_env(dev_data))}
    # What the failed pools would advertise is unknown, so quotas are not judged against it.
    assert paths == {"pools[1].gpu_model", "pools[2].profile"}


def test_the_field_reference_in_environments_md_is_current() -> None:
    from scripts.field_reference import with_reference

    page = (ROOT / "docs" / "environments.md").read_text()
    assert with_reference(page) == page, "docs/environments.md is out of date: run python scripts/field_reference.py"


def test_the_field_reference_has_every_field_of_every_model() -> None:
    from pydantic import BaseModel

    from gpushare.core import spec
    from gpushare.core.schemas import field_reference

    tables = {section.split("\n", 1)[0]: section for section in field_reference().split("### ")[1:]}
    models = {name: cls for name, cls in vars(spec).items()
              if isinstance(cls, type) and issubclass(cls, BaseModel) and name in tables}
    assert {"Environment", "Cluster", "Pool", "Host", "CloudNodes", "Tenant", "Defaults", "MigSpec"} <= set(models)
    for name, model in models.items():
        for field, info in model.model_fields.items():
            shown = info.alias or field
            row = next((line for line in tables[name].splitlines() if line.startswith(f"| `{shown}` |")), None)
            assert row is not None, (name, shown)
            if info.description:
                assert info.description.split(";")[0] in row.replace("\\|", "|"), (name, shown)
