"""The GKE and EKS node-pool rules live in the library (gpushare/core/cloud_pools.py): resolution refuses what
`pulumi up` would, so `gpushare validate` names the file, line, setting and fix, and the Pulumi program compiles its
node pools with the same functions."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core import spec
from gpushare.core.catalog import load_catalog
from gpushare.core.cloud_pools import CloudPool, PoolRefused, eks_scaling, gke_sharing, per_zone, refusals
from gpushare.core.errors import GpushareError
from gpushare.core.resolve import resolve
from tests.conftest import ROOT, pool_named

GKE_FIXTURE = ROOT / "tests" / "data" / "infra" / "gke-operator.yaml"
EKS_FIXTURE = ROOT / "tests" / "data" / "infra" / "eks.yaml"
TS64 = {"name": "ts-64", "kind": "time-slicing", "time_slicing": {"replicas": 64}}


def gke_data() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(GKE_FIXTURE.read_text())
    return data


def validate(env: Path) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(app, ["validate", "--env", str(env), "--json"])
    return result.exit_code, json.loads(result.stdout)


def line_of(path: Path, line: int) -> str:
    return path.read_text().splitlines()[line - 1]


def test_validate_refuses_a_gke_pool_that_pulumi_up_would_reject(write_env: Callable[..., Path]) -> None:
    data = gke_data()
    data["profiles"] = [TS64]
    pool_named(data, "l4-gke-mps")["profile"] = "ts-64"  # GKE-managed time-sharing allows 48 clients per GPU
    env = write_env(data)
    code, doc = validate(env)
    assert code == 1 and doc["ok"] is False
    (error,) = doc["problems"]
    assert error["file"] == str(env) and error["path"] == "pools[2].profile"
    assert "'l4-gke-mps'" in error["message"] and "above GKE's limit of 48" in error["message"]
    assert "at most 48 replicas" in error["fix"]
    assert "profile: ts-64" in line_of(env, error["line"])


def test_validate_refuses_gke_node_counts_that_do_not_spread_over_the_zones(write_env: Callable[..., Path]) -> None:
    data = gke_data()
    pool_named(data, "a100-gke-mig")["cloud"]["node_count"] = 3
    env = write_env(data)
    code, doc = validate(env)
    assert code == 1
    (error,) = doc["problems"]
    assert error["path"] == "pools[1].cloud.node_count" and "over 2 zones" in error["message"]
    assert "node_count: 3" in line_of(env, error["line"])


def test_validate_refuses_a_partition_size_gke_cannot_create(write_env: Callable[..., Path]) -> None:
    data = gke_data()
    data["profiles"] = [{"name": "mig-four", "kind": "mig", "mig": {"layouts": {"NVIDIA A100-SXM4-80GB": "1g.10gb=4"}}}]
    pool_named(data, "a100-gke-mig")["profile"] = "mig-four"
    code, doc = validate(write_env(data))
    assert code == 1
    assert [e["path"] for e in doc["problems"]] == ["pools[1].profile"]
    assert "always creates 7" in doc["problems"][0]["message"] and "1g.10gb=7" in doc["problems"][0]["fix"]


def test_validate_refuses_a_gpu_model_gke_does_not_offer(write_env: Callable[..., Path]) -> None:
    data = gke_data()
    pool_named(data, "a100-operator")["gpu_model"] = "NVIDIA A100 80GB PCIe"
    code, doc = validate(write_env(data))
    assert code == 1
    assert [e["path"] for e in doc["problems"]] == ["pools[0].gpu_model"]
    assert "GKE offers no accelerator type" in doc["problems"][0]["message"]


def test_validate_refuses_an_eks_node_count_outside_its_bounds(write_env: Callable[..., Path]) -> None:
    data: dict[str, Any] = yaml.safe_load(EKS_FIXTURE.read_text())
    cloud = data["pools"][0]["cloud"]
    cloud.update(node_count=5, min_node_count=0, max_node_count=4)
    code, doc = validate(write_env(data))
    assert code == 1
    assert [e["path"] for e in doc["problems"]] == ["pools[0].cloud.node_count"]
    assert "outside 0..4" in doc["problems"][0]["message"]


def test_the_unchanged_fixtures_pass_the_cloud_rules() -> None:
    for path in (GKE_FIXTURE, EKS_FIXTURE):
        fleet = resolve(path)
        assert fleet.pools and all(p.cloud is not None for p in fleet.pools)


# ---------------------------------------------------------------- the functions the program compiles with


def shape(profile: Any, layout: dict[str, int] | None = None, kind: str = "gke", **cloud: Any) -> CloudPool:
    nodes = spec.CloudNodes(**{"machine_type": "a2-highgpu-1g", "gpus_per_node": 1, "node_count": 2,
                               "sharing": "gke-managed", **cloud})
    return CloudPool("p", kind, nodes, load_catalog().lookup("NVIDIA A100-SXM4-80GB"), profile, layout)


def test_gke_sharing_compiles_partitions_and_time_sharing() -> None:
    mig = spec.MigProfile.model_validate({"name": "m", "kind": "mig", "mig": {"layouts": {}}})
    assert gke_sharing(shape(mig, {"1g.10gb": 7})) == {"gpu_partition_size": "1g.10gb"}
    ts = spec.TimeSlicingProfile.model_validate({"name": "t", "kind": "time-slicing", "time_slicing": {"replicas": 4}})
    assert gke_sharing(shape(ts)) == {"gpu_sharing_config": {"gpu_sharing_strategy": "TIME_SHARING",
                                                              "max_shared_clients_per_gpu": 4}}
    with pytest.raises(PoolRefused) as refused:
        gke_sharing(shape(mig, {"1g.10gb+me": 1}))
    assert refused.value.refusal.where == ("profile",) and isinstance(refused.value, GpushareError)


def test_zone_and_eks_bounds_rules() -> None:
    ts = spec.TimeSlicingProfile.model_validate({"name": "t", "kind": "time-slicing", "time_slicing": {"replicas": 4}})
    assert per_zone(shape(ts, node_count=4), 2) == 2
    with pytest.raises(PoolRefused, match="cannot be spread evenly over 3 zones"):
        per_zone(shape(ts, node_count=4), 3)
    eks = shape(ts, kind="eks", sharing="operator", node_count=2, max_node_count=5)
    assert eks_scaling(eks) == {"desired_size": 2, "min_size": 2, "max_size": 5}
    empty = dataclasses.replace(eks, cloud=eks.cloud.model_copy(update={"node_count": 0, "max_node_count": 0}))
    assert [r.where for r in refusals(empty)] == [("cloud", "max_node_count")]


# ---------------------------------------------------------------- the operator's device-plugin settings, computed once


@pytest.mark.parametrize(("cdi", "mig_strategy", "strategy"), [
    (True, "mixed", ["cdi-annotations", "cdi-cri"]), (False, "single", ["volume-mounts"])])
def test_device_plugin_values_give_the_configs_settings(cdi: bool, mig_strategy: str, strategy: list[str]) -> None:
    from gpushare.policy.device_plugin import device_plugin_values, effective_settings, settings_problems

    cluster = spec.Cluster(name="lab", kind="bare-metal", kubernetes_version="1.33", mig_strategy=mig_strategy,
                           cdi=cdi)  # type: ignore[arg-type]
    values = device_plugin_values(cluster)
    effective = effective_settings(values)
    assert effective.device_list_strategy == strategy and effective.mig_strategy == mig_strategy
    assert settings_problems(values, cluster) == []
    # Left to the operator without CDI, the plugin would run with its asset default: envvar.
    bare = {**values, "devicePlugin": {}}
    assert cdi or any("envvar" in p for p in settings_problems(bare, cluster))
