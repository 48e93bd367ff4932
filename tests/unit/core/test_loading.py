"""Loading workspace files (gpushare.core.loading): the shipped environments resolve, every kind of bad input gets
a located error with a fix, and each file's format version (no apiVersion reads as v1; anything else is an error)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.guardrails import load_guardrails
from gpushare.core.paths import (
    package_data_path,
)
from gpushare.core.resolve import resolve, resolve_env
from gpushare.core.spec import load_environment, load_profile_file
from gpushare.planner.demand import load_demand
from gpushare.policy.waivers import load_waivers
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

# ---------------------------------------------------------------- file format versions


SKELETON = package_data_path("workspace")


# ---------------------------------------------------------------- file format versions

SAMPLES = {  # kind -> (a valid file of that kind, how it is loaded)
    "Environment": ("environments/dev.yaml", lambda p: load_environment(p)),
    "Guardrails": ("policies/guardrails.yaml", lambda p: load_guardrails(p)),
    "Waivers": ("policies/waivers.yaml", lambda p: load_waivers(p, load_guardrails(SKELETON / "policies" /
                                                                                   "guardrails.yaml"))),
    "Demand": (str(ROOT / "examples" / "demand" / "inference.yaml"), lambda p: load_demand(p)),
}


def _variant(tmp_path: Path, sample: str, **header: object) -> Path:
    """The sample file of a kind with its header replaced by `header` (first, so on line 1)."""
    source = Path(SAMPLES[sample][0])
    data = yaml.safe_load((source if source.is_absolute() else SKELETON / source).read_text()) or {}
    data = {**header, **{k: v for k, v in data.items() if k not in ("apiVersion", "kind")}}
    path = tmp_path / f"{sample.lower()}-{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("kind", SAMPLES)
def test_a_file_without_a_version_reads_as_v1(kind: str, tmp_path: Path) -> None:
    SAMPLES[kind][1](_variant(tmp_path, kind))
    SAMPLES[kind][1](_variant(tmp_path, kind, apiVersion="gpushare.io/v1", kind=kind))


@pytest.mark.parametrize("kind", SAMPLES)
def test_an_unknown_version_is_a_located_error(kind: str, tmp_path: Path) -> None:
    path = _variant(tmp_path, kind, apiVersion="gpushare.io/v2", kind=kind)
    with pytest.raises(GpushareError) as info:
        SAMPLES[kind][1](path)
    problem = info.value.problems[0]
    assert (problem.file, problem.path, problem.line) == (str(path), "apiVersion", 1)
    assert "gpushare.io/v2" in problem.message and "apiVersion: gpushare.io/v1" in (problem.fix or "")
    assert info.value.exit_code == 2


@pytest.mark.parametrize("kind", SAMPLES)
def test_a_wrong_kind_is_a_located_error(kind: str, tmp_path: Path) -> None:
    other = "Demand" if kind != "Demand" else "Environment"
    path = _variant(tmp_path, kind, apiVersion="gpushare.io/v1", kind=other)
    with pytest.raises(GpushareError) as info:
        SAMPLES[kind][1](path)
    problem = info.value.problems[0]
    assert (problem.file, problem.path) == (str(path), "kind")
    assert other in problem.message and f"kind: {kind}" in (problem.fix or "")


def test_guardrails_keep_their_old_version_field(tmp_path: Path) -> None:
    assert load_guardrails(_variant(tmp_path, "Guardrails", version=1))
    with pytest.raises(GpushareError, match="version"):
        load_guardrails(_variant(tmp_path, "Guardrails", version=2))


def test_profiles_carry_an_api_version_and_keep_kind_for_the_sharing_mode(tmp_path: Path) -> None:
    text = (SKELETON / "profiles" / "exclusive.yaml").read_text()
    assert "apiVersion: gpushare.io/v1" in text
    (tmp_path / "exclusive.yaml").write_text(text.replace("apiVersion: gpushare.io/v1\n", ""))
    assert load_profile_file(tmp_path / "exclusive.yaml")[0].kind == "exclusive"
    for bad, where in (("apiVersion: gpushare.io/v9", "apiVersion"), ("kind: SharingProfile", "kind")):
        wrong = text.replace("apiVersion: gpushare.io/v1", bad) if "apiVersion" in bad else \
            text.replace("kind: exclusive", bad)
        (tmp_path / "exclusive.yaml").write_text(wrong)
        with pytest.raises(GpushareError) as info:
            load_profile_file(tmp_path / "exclusive.yaml")
        assert info.value.problems[0].path == where and info.value.problems[0].fix


def test_shipped_files_carry_their_version() -> None:
    for path in [*SKELETON.rglob("*.yaml"), *(ROOT / "environments").glob("*.yaml"),
                 *(ROOT / "examples" / "demand").glob("*.yaml")]:
        if path.name.startswith(("Pulumi.", "PulumiPolicy.")):  # Pulumi's own project files
            continue
        assert yaml.safe_load(path.read_text())["apiVersion"] == "gpushare.io/v1", path
