"""Configs inside the operator's ConfigMaps that NVIDIA's own programs refuse: a device-plugin config with replicas
below 2 or an unusable `devices` (k8s-device-plugin api/config/v1 replicas.go), replicas past what a gpushare profile
holds, a mig-parted entry with a negative GPU index, a negative or all-zero `mig-devices`, `mig-devices` beside
`mig-enabled: false` (mig-parted api/spec/v1, pkg/types), a config that is not a list, and a `mig-configs` that is
not a mapping. Each is reported, naming the ConfigMap, the config (key) and the field, and never imported as a count
the cluster never ran; the import itself goes on (exit 0) and never ends in an internal error."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from gpushare.cli.init import write_workspace
from tests.unit.ops.brownfield.helpers import CLUSTERS, ENV, cli

TS_2 = "                replicas: 2\n"  # the only replicas of config ts-2, which node l40s-01 uses
BALANCED = ("              mig-enabled: true\n              mig-devices:\n                \"1g.10gb\": 2\n"
            "                \"2g.20gb\": 1\n                \"3g.40gb\": 1\n")  # all-balanced: a100-01, a100-03


def _import(tmp_path: Path, old: str, new: str, fixture: str = "timeslicing-mig",
            nodes: tuple[str, str] | None = None) -> dict[str, Any]:
    dumps = tmp_path / "dumps"
    shutil.copytree(CLUSTERS / fixture, dumps)
    text = (dumps / "configmaps.yaml").read_text()
    assert old in text, old
    (dumps / "configmaps.yaml").write_text(text.replace(old, new, 1))
    if nodes is not None:
        node_text = (dumps / "nodes.yaml").read_text()
        assert nodes[0] in node_text
        (dumps / "nodes.yaml").write_text(node_text.replace(*nodes))
    write_workspace(tmp_path / "ws")
    code, out = cli("import", "--from", str(dumps), "--env", ENV, "--out", str(tmp_path / "ws"))
    assert code == 0, out
    return out


def _said(out: dict[str, Any], obj: str) -> str:
    return " | ".join(f"{u['field']}: {u['reason']}" for u in out["unsupported"] if u["object"] == obj)


def _profiles(tmp_path: Path) -> str:
    return "\n".join(p.read_text() for p in sorted((tmp_path / "ws" / "profiles").glob("*.yaml")))


NO_REPLICAS = ("              - name: nvidia.com/gpu\n" + TS_2, "              - name: nvidia.com/gpu\n")


@pytest.mark.parametrize(("old", "new", "field"), [
    (TS_2, "                replicas: 0\n",
     "sharing.timeSlicing.resources[0].replicas: replicas is 0: the device plugin refuses fewer than 2"),
    (TS_2, "                replicas: -3\n", "replicas is -3: the device plugin refuses fewer than 2"),
    (TS_2, "                replicas: 1\n", "replicas is 1: the device plugin refuses fewer than 2"),
    (*NO_REPLICAS, "sharing.timeSlicing.resources[0].replicas: Field required"),
    (TS_2, TS_2 + "                devices: garbage\n",
     "sharing.timeSlicing.resources[0].devices: devices is 'garbage': the device plugin takes 'all'"),
    (TS_2, TS_2 + "                devices: 0\n", "devices is 0: a count of devices must be above 0"),
    (TS_2, TS_2 + "                devices: [0, \"GPU-abc\\n\"]\n", "devices[1] is 'GPU-abc\\n'"),
], ids=["zero", "negative", "one", "none", "devices a word", "devices zero", "devices a UUID and a newline"])
def test_a_device_plugin_config_the_plugin_refuses_is_reported_not_imported(tmp_path: Path, old: str, new: str,
                                                                             field: str) -> None:
    out = _import(tmp_path, old, new)
    said = _said(out, "Node/l40s-01")
    assert "labels[nvidia.com/device-plugin.config]" in said and "'ts-2'" in said, said
    assert "ConfigMap 'time-slicing-config'" in said and field in said and "the node is left out" in said, said
    environment = (tmp_path / "ws" / "environments" / f"{ENV}.yaml").read_text()
    assert "name: l40s-01" not in environment and "name: l4-01" in environment  # the rest imports


def test_replicas_past_a_gpushare_profile_are_reported_not_a_crash(tmp_path: Path) -> None:
    out = _import(tmp_path, TS_2, "                replicas: 100000000\n")
    said = _said(out, "Node/l40s-01")
    assert "config 'ts-2' in ConfigMap 'time-slicing-config'" in said and "replicas 100000000" in said, said
    assert "allows at most 64" in said and "the node is left out" in said, said
    assert "100000000" not in _profiles(tmp_path)


@pytest.mark.parametrize(("new", "field"), [
    (BALANCED.replace('"1g.10gb": 2', '"1g.10gb": -2'), "mig-configs.all-balanced[0].mig-devices: mig-devices[1g.10gb] "
                                                      "is -2: mig-parted refuses a negative count"),
    (BALANCED.replace('"1g.10gb": 2\n                "2g.20gb": 1\n                "3g.40gb": 1',
                      '"1g.10gb": 0'), "mig-devices: every count is 0"),
    ("              mig-enabled: true\n", "mig-enabled is true but mig-devices is missing"),
], ids=["negative count", "all zero", "enabled without devices"])
def test_mig_devices_mig_parted_refuses_are_reported_naming_configmap_config_and_field(
        tmp_path: Path, new: str, field: str) -> None:
    out = _import(tmp_path, BALANCED, new)
    said = _said(out, "Node/a100-01")
    assert "MIG config 'all-balanced'" in said and "ConfigMap 'custom-mig-config'" in said, said
    assert field in said and "the node is left out" in said, said
    assert "=-2" not in _profiles(tmp_path) and "=0" not in _profiles(tmp_path)


def test_a_negative_gpu_index_in_devices_is_reported(tmp_path: Path) -> None:
    out = _import(tmp_path, "              devices: all\n" + BALANCED, "              devices: [-1, 0]\n" + BALANCED)
    said = _said(out, "Node/a100-01")
    assert "mig-configs.all-balanced[0].devices: devices[0] is -1: a GPU index is 0 or more" in said, said


def test_a_zero_count_beside_others_is_left_out_of_the_layout(tmp_path: Path) -> None:
    """mig-parted takes a 0 beside positive counts (that profile is absent); gpushare's layout leaves it out
    instead of writing `1g.10gb=0`, which its own check refuses (the whole import failed with exit 1)."""
    _import(tmp_path, BALANCED, BALANCED.replace('"1g.10gb": 2', '"1g.10gb": 0'))
    assert "2g.20gb=1,3g.40gb=1" in _profiles(tmp_path)


def test_mig_devices_beside_mig_enabled_false_in_an_unused_config_is_reported(tmp_path: Path) -> None:
    out = _import(tmp_path, "              mig-enabled: false\n",
                  "              mig-enabled: false\n              mig-devices: {\"1g.10gb\": 7}\n")
    said = _said(out, "ConfigMap/custom-mig-config")
    assert "all-disabled: config no node uses, which cannot be read" in said, said
    assert "mig-devices is set but mig-enabled is false" in said, said


def test_a_mig_config_that_is_not_a_list_is_reported(tmp_path: Path) -> None:
    old = "          all-balanced:\n            - device-filter: [\"0x20B210DE\", \"0x20B510DE\"]\n"
    out = _import(tmp_path, old + "              devices: all\n",
                  "          all-balanced:\n            device-filter: [\"0x20B210DE\", \"0x20B510DE\"]\n"
                  "            devices: all\n            unused:\n")
    said = _said(out, "Node/a100-01")
    assert "ConfigMap 'custom-mig-config'" in said and "mig-configs.all-balanced: Input should be a valid list" \
        in said, said


def test_mig_configs_that_are_not_a_mapping_are_reported_where_no_node_names_one(tmp_path: Path) -> None:
    """Nodes without a MIG label do not bring the ConfigMap up: the import says so itself."""
    out = _import(tmp_path, "        mig-configs:\n          all-disabled:\n",
                  "        mig-configs:\n        - all-disabled:\n",
                  nodes=("      nvidia.com/mig.config:", "      example.com/was-mig.config:"))
    said = _said(out, "ConfigMap/custom-mig-config")
    assert "config.yaml: spec.migManager.config.name names it, but its config.yaml is not a mig-parted file" in said, \
        said
