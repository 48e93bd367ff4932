"""Resolution: resource names exactly as the device plugin advertises them, ratios, labels and their owners."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.catalog import load_catalog
from gpushare.core.labels import DEVICE_PLUGIN_CONFIG_LABEL, MIG_CONFIG_LABEL, OPERATOR_MIG_CONFIG_LABEL
from gpushare.core.mig import check_layout, layout_from_counts
from gpushare.core.resolve import SHARED_GPU_TAINT, generic_layout, resolve, resolve_env
from tests.conftest import PROFILES, ROOT, cluster_named


def fleet_with(write_env: Any, data: dict[str, Any]) -> Any:
    return resolve(write_env(data), PROFILES)


def test_dev_advertised_resources_and_ratios() -> None:
    fleet = resolve_env("dev")
    a100 = fleet.pool("a100-inference")
    # mig-balanced on an A100-80GB: 3g.40gb + 2g.20gb + 2x 1g.10gb per GPU, 8 GPUs
    assert a100.totals.advertised == {"nvidia.com/mig-3g.40gb": 8, "nvidia.com/mig-2g.20gb": 8,
                                      "nvidia.com/mig-1g.10gb": 16}
    assert a100.totals.hardware_units == 32 and a100.totals.oversubscription == 1.0
    h100 = fleet.pool("h100-training")
    assert h100.totals.advertised == {"nvidia.com/gpu": 8} and h100.totals.oversubscription == 1.0
    l4 = fleet.pool("l4-notebooks")
    assert l4.totals.advertised == {"nvidia.com/gpu.shared": 16}
    assert l4.totals.hardware_units == 4 and l4.totals.oversubscription == 4.0
    assert l4.isolation == "none" and a100.isolation == "hardware"
    assert fleet.totals.advertised_total == 56 and fleet.totals.hardware_units == 44
    assert fleet.totals.oversubscription == round(56 / 44, 3)


def _single_pool(dev_data: dict[str, Any], profile: str, model: str = "NVIDIA H100 80GB HBM3",
                 strategy: str = "mixed", extra_profiles: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    cluster_named(dev_data, "dev-metal")["mig_strategy"] = strategy
    dev_data["pools"] = [{"name": "p", "cluster": "dev-metal", "purpose": "inference", "gpu_model": model,
                          "profile": profile, "hosts": [{"name": "h1", "address": "10.0.0.1", "gpu_count": 2}]}]
    dev_data["tenants"] = []
    if extra_profiles:
        dev_data["profiles"] = extra_profiles
    return dev_data


@pytest.mark.parametrize(("profile", "strategy", "expected", "units"), [
    ("mig-balanced", "mixed", {"nvidia.com/mig-3g.40gb": 2, "nvidia.com/mig-2g.20gb": 2,
                               "nvidia.com/mig-1g.10gb": 4}, 8),
    ("mig-small", "single", {"nvidia.com/gpu": 14}, 14),
    ("mig-small", "mixed", {"nvidia.com/mig-1g.10gb": 14}, 14),
    ("mig-small-ts2", "mixed", {"nvidia.com/mig-1g.10gb.shared": 28}, 14),
    ("mig-small-ts2", "single", {"nvidia.com/gpu.shared": 28}, 14),
    ("notebooks-ts4", "mixed", {"nvidia.com/gpu.shared": 8}, 2),
    ("mps-4", "single", {"nvidia.com/gpu.shared": 8}, 2),
    ("exclusive", "mixed", {"nvidia.com/gpu": 2}, 2),
])
def test_resource_names_follow_the_device_plugin(dev_data: dict[str, Any], write_env: Any, profile: str,
                                                 strategy: str, expected: dict[str, int], units: int) -> None:
    fleet = fleet_with(write_env, _single_pool(dev_data, profile, strategy=strategy))
    node = fleet.nodes[0]
    assert node.advertised == expected
    assert node.hardware_units == units
    assert fleet.totals.oversubscription == round(sum(expected.values()) / units, 3)


def test_without_rename_shared_replicas_look_like_whole_gpus(dev_data: dict[str, Any], write_env: Any) -> None:
    extra = [{"name": "ts-plain", "kind": "time-slicing", "time_slicing": {"replicas": 3, "rename_by_default": False}}]
    fleet = fleet_with(write_env, _single_pool(dev_data, "ts-plain", extra_profiles=extra))
    assert fleet.nodes[0].advertised == {"nvidia.com/gpu": 6}


def test_media_extension_profile_name_turns_plus_into_dot(dev_data: dict[str, Any], write_env: Any) -> None:
    extra = [{"name": "mig-me", "kind": "mig",
              "mig": {"layouts": {"NVIDIA H100 80GB HBM3": "1g.10gb+me=1,1g.10gb=6"}}}]
    fleet = fleet_with(write_env, _single_pool(dev_data, "mig-me", extra_profiles=extra))
    assert fleet.nodes[0].advertised == {"nvidia.com/mig-1g.10gb.me": 2, "nvidia.com/mig-1g.10gb": 12}


def test_bare_metal_labels_split_between_pulumi_and_ansible() -> None:
    node = next(n for n in resolve_env("dev").nodes if n.name == "dev-a100-01")
    ansible = node.labels_owned_by("ansible")
    pulumi = node.labels_owned_by("pulumi")
    assert set(ansible) == {DEVICE_PLUGIN_CONFIG_LABEL, MIG_CONFIG_LABEL, "gpushare.io/mig-config.state",
                            "gpushare.io/toolkit-version"}
    assert ansible["gpushare.io/toolkit-version"] == node.toolkit_version
    assert ansible[DEVICE_PLUGIN_CONFIG_LABEL] == node.device_plugin_config
    assert ansible[MIG_CONFIG_LABEL] == node.mig_config
    assert pulumi["gpushare.io/pool"] == "a100-inference"
    assert pulumi["gpushare.io/isolation"] == "hardware"
    assert not set(ansible) & set(pulumi)
    assert OPERATOR_MIG_CONFIG_LABEL not in node.labels


def test_non_mig_gpu_has_no_mig_config() -> None:
    node = next(n for n in resolve_env("dev").nodes if n.name == "dev-l4-01")
    assert node.mig_config is None and MIG_CONFIG_LABEL not in node.labels


def test_mig_capable_gpu_used_whole_gets_mig_disabled() -> None:
    node = next(n for n in resolve_env("dev").nodes if n.name == "dev-h100-01")
    assert node.mig_config == "all-disabled"


def test_gke_managed_shared_pool_is_tainted_and_opted_out() -> None:
    pool = resolve_env("pilot").pool("gke-l4-inference")
    node = pool.nodes[0]
    assert node.managed_by == "gke" and node.count == 2
    assert SHARED_GPU_TAINT in node.taints
    # GKE's plugin names shared replicas nvidia.com/gpu
    assert node.advertised == {"nvidia.com/gpu": 4}
    assert node.labels["nvidia.com/gpu.deploy.operands"].value == "false"
    assert node.device_plugin_config is None
    assert pool.totals.physical_gpus == 4 and pool.totals.oversubscription == 2.0


def test_operator_managed_cloud_pool_owns_operator_labels(dev_data: dict[str, Any], write_env: Any) -> None:
    dev_data["clusters"].append({"name": "dev-gke", "kind": "gke", "kubernetes_version": "1.33"})
    dev_data["pools"].append({"name": "gke-a100", "cluster": "dev-gke", "purpose": "inference",
                              "gpu_model": "nvidia-a100-80gb", "profile": "mig-balanced",
                              "cloud": {"machine_type": "a2-ultragpu-1g", "gpus_per_node": 1, "node_count": 3}})
    pool = fleet_with(write_env, dev_data).pool("gke-a100")
    labels = pool.nodes[0].labels
    assert labels[OPERATOR_MIG_CONFIG_LABEL].owner == "pulumi"
    assert labels[DEVICE_PLUGIN_CONFIG_LABEL].owner == "pulumi"
    assert labels["gke-no-default-nvidia-gpu-device-plugin"].value == "true"
    assert pool.totals.physical_gpus == 3 and pool.totals.hardware_units == 12


def test_gke_managed_pool_takes_one_partition_size(dev_data: dict[str, Any], write_env: Any) -> None:
    from gpushare.core.errors import GpushareError

    dev_data["clusters"].append({"name": "dev-gke", "kind": "gke", "kubernetes_version": "1.33"})
    dev_data["pools"].append({"name": "gke-a100", "cluster": "dev-gke", "purpose": "inference",
                              "gpu_model": "nvidia-a100-80gb", "profile": "mig-balanced",
                              "cloud": {"machine_type": "a2-ultragpu-1g", "gpus_per_node": 1, "node_count": 3,
                                        "sharing": "gke-managed"}})
    with pytest.raises(GpushareError, match="one partition size"):
        fleet_with(write_env, dev_data)


def test_changed_profile_changes_config_names(dev_data: dict[str, Any], write_env: Any) -> None:
    before = fleet_with(write_env, _single_pool(dev_data, "notebooks-ts4"))
    extra = [{"name": "notebooks-ts4x", "kind": "time-slicing", "time_slicing": {"replicas": 5}}]
    after = fleet_with(write_env, _single_pool(dev_data, "notebooks-ts4x", extra_profiles=extra))
    assert before.nodes[0].device_plugin_config != after.nodes[0].device_plugin_config
    assert before.nodes[0].device_plugin_config.startswith("notebooks-ts4-")


def _nvidia_configs() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "tests" / "data" / "default_mig_configs.yaml").read_text())["mig-configs"]


def _per_model(config: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    catalog = load_catalog()
    out: dict[str, dict[str, int]] = {}
    for entry in config:
        filters = entry.get("device-filter", [])
        for f in [filters] if isinstance(filters, str) else filters:
            try:
                out[catalog.lookup(f).name] = entry["mig-devices"]
            except Exception:  # noqa: BLE001 - NVIDIA lists GPUs the catalog does not carry
                continue
    return out


@pytest.mark.parametrize("model", sorted(_per_model(_nvidia_configs()["all-balanced"])))
def test_balanced_equals_nvidia_all_balanced(model: str) -> None:
    expected = _per_model(_nvidia_configs()["all-balanced"])[model]
    gpu = load_catalog().models[model]
    assert generic_layout(gpu, "balanced") == expected


@pytest.mark.parametrize("model", [m.name for m in load_catalog().models.values() if m.mig_capable])
@pytest.mark.parametrize("form", ["balanced", "all-smallest", "whole"])
def test_generic_layouts_are_valid_everywhere(model: str, form: str) -> None:
    gpu = load_catalog().models[model]
    check = check_layout(gpu, layout_from_counts(generic_layout(gpu, form)))
    assert check.ok, check.errors


def test_all_smallest_uses_every_compute_slice() -> None:
    catalog = load_catalog()
    assert generic_layout(catalog.lookup("NVIDIA H100 80GB HBM3"), "all-smallest") == {"1g.10gb": 7}
    assert generic_layout(catalog.lookup("NVIDIA A100-SXM4-40GB"), "all-smallest") == {"1g.5gb": 7}
    assert generic_layout(catalog.lookup("NVIDIA A30"), "all-smallest") == {"1g.6gb": 4}


def test_resolves_synthetic_fleet(tmp_path: Path) -> None:
    from benchmarks.foundation import synthetic_environment

    path = synthetic_environment(tmp_path, gpus=400)
    fleet = resolve(path, PROFILES)
    assert fleet.totals.physical_gpus == 400
