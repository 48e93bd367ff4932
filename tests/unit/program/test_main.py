"""The Pulumi program under the SDK's own mock engine, loaded the way `pulumi up` loads it (runpy), through the
preview engine's `collect_plan`: stack files, outputs, and bad stack input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.errors import GpushareError
from gpushare.ops.preview import Plan, collect_plan, stack_config
from tests.conftest import ENVIRONMENTS, WORKSPACE, cluster_named, pool_named

STACKS = ["dev", "pilot", "prod"]


def stack(env: str) -> dict[str, Any]:
    return dict(yaml.safe_load((WORKSPACE / f"Pulumi.{env}.yaml").read_text())["config"])


def plan_with(env: str, **changes: Any) -> Plan:
    """The stack's plan with some `gpushare:*` settings replaced (None removes one)."""
    config = stack(env)
    for key, value in changes.items():
        name = f"gpushare:{key}"
        if value is None:
            config.pop(name, None)
        else:
            config[name] = value
    return collect_plan(env, config)


@pytest.mark.parametrize("env", STACKS)
def test_each_stack_names_its_environment(env: str) -> None:
    outputs = collect_plan(env).outputs
    assert outputs["environment"]["name"] == env
    pools = {k.removeprefix("pool:") for k in outputs if k.startswith("pool:")}
    env_data = yaml.safe_load((ENVIRONMENTS / f"{env}.yaml").read_text())
    assert pools == {p["name"] for p in env_data["pools"]}


def test_outputs_carry_capacity() -> None:
    outputs = collect_plan("dev").outputs
    l4 = outputs["pool:l4-notebooks"]
    assert l4["physical_gpus"] == 4 and l4["oversubscription"] == 4.0
    assert outputs["environment"]["hardware_units"] == 44
    assert outputs["environment"]["advertised"] == {
        "nvidia.com/gpu": 8, "nvidia.com/gpu.shared": 16, "nvidia.com/mig-1g.10gb": 16,
        "nvidia.com/mig-2g.20gb": 8, "nvidia.com/mig-3g.40gb": 8}


@pytest.mark.parametrize("env", STACKS)
def test_every_cluster_gets_its_own_provider_stack_and_monitoring(env: str) -> None:
    plan = collect_plan(env)
    env_data = yaml.safe_load((ENVIRONMENTS / f"{env}.yaml").read_text())
    clusters = {c["name"]: c for c in env_data["clusters"]}
    providers = {r.name: r for r in plan.of_type("pulumi:providers:kubernetes")}
    assert set(providers) == set(clusters)
    for name, cluster in clusters.items():
        expected = cluster.get("kubeconfig_context") or stack(env)["gpushare:clusters"][name]["kubeconfigContext"]
        assert providers[name].inputs["context"] == expected
        releases = [r for r in plan.of_type("helm.sh/v3:Release")
                    if plan.cluster_of(r) == name and r.inputs["chart"] == "gpu-operator"]
        assert len(releases) == 1
        assert [r for r in plan.of_type(":PrometheusRule") if plan.cluster_of(r) == name]


def test_prod_protects_the_operator_release_and_dev_does_not() -> None:
    for env, protected in (("prod", True), ("dev", False)):
        releases = [r for r in collect_plan(env).of_type("helm.sh/v3:Release") if r.inputs["chart"] == "gpu-operator"]
        assert releases and all(r.protect is protected for r in releases)


def test_invalid_environment_fails_the_program(tmp_path: Path) -> None:
    data = yaml.safe_load((ENVIRONMENTS / "dev.yaml").read_text())
    pool_named(data, "a100-inference")["gpu_model"] = "NVIDIA H100 90GB"
    path = tmp_path / "dev.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(GpushareError, match=r"pools\[0\]\.gpu_model"):
        plan_with("dev", environment=str(path))


def test_missing_environment_file_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(GpushareError, match="file not found") as err:
        plan_with("dev", environment=str(tmp_path / "nope.yaml"))
    assert err.value.exit_code == 2


def test_stack_without_environment_setting_fails() -> None:
    with pytest.raises(GpushareError, match="gpushare:environment") as err:
        plan_with("dev", environment=None)
    assert err.value.exit_code == 2


def test_unknown_stack_is_refused() -> None:
    with pytest.raises(GpushareError, match="no stack named 'staging'") as err:
        stack_config("staging")
    assert err.value.exit_code == 2
    assert "dev, pilot, prod" in str(err.value)


def test_misspelt_stack_setting_is_an_error() -> None:
    with pytest.raises(GpushareError, match="gpushare:monitorng"):
        plan_with("dev", monitorng={"mode": "install"})


def test_a_stack_without_a_monitoring_stack_is_refused() -> None:
    with pytest.raises(GpushareError, match="no monitoring stack is named for cluster 'dev-metal'"):
        plan_with("dev", monitoring=None)


def test_a_gke_cluster_needs_its_cloud_settings() -> None:
    with pytest.raises(GpushareError, match="GKE cluster 'pilot-gke' needs its project") as err:
        plan_with("pilot", clusters={"pilot-gke": {"kubeconfigContext": "gke-pilot"}})
    assert "Pulumi.pilot.yaml" in str(err.value)


def test_cluster_settings_must_name_a_cluster_of_the_environment() -> None:
    clusters = stack("pilot")["gpushare:clusters"]
    with pytest.raises(GpushareError, match="pilot-gek"):
        plan_with("pilot", clusters={**clusters, "pilot-gek": {"kubeconfigContext": "x"}})


def test_a_cluster_without_a_kubeconfig_context_is_refused(tmp_path: Path) -> None:
    data = yaml.safe_load((ENVIRONMENTS / "dev.yaml").read_text())
    del cluster_named(data, "dev-metal")["kubeconfig_context"]
    path = tmp_path / "dev.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(GpushareError, match="no kubeconfig context"):
        plan_with("dev", environment=str(path))
    plan = plan_with("dev", environment=str(path), clusters={"dev-metal": {"kubeconfigContext": "from-stack"}})
    assert plan.of_type("pulumi:providers:kubernetes")[0].inputs["context"] == "from-stack"


def test_the_program_runs_twice_in_one_process_with_the_same_plan() -> None:
    first, second = collect_plan("pilot"), collect_plan("pilot")
    assert [(r.type, r.name, r.inputs) for r in first.resources] == \
        [(r.type, r.name, r.inputs) for r in second.resources]
