"""Rendering: every artifact parses back to the model it came from, and nothing is half-written."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.errors import GpushareError
from gpushare.core.resolve import resolve, resolve_env
from gpushare.render.fleet import (
    MARKER,
    DevicePluginConfigFile,
    containerd_runtime,
    parse_containerd_runtime,
    parse_device_plugin,
    parse_mig_parted,
    parse_toolkit,
    render_fleet,
    toolkit_settings,
    write_rendered,
)
from tests.conftest import PROFILES, cluster_named


@pytest.mark.parametrize("env", ["dev", "pilot", "prod"])
def test_round_trip(env: str, shipped_workspace: Path) -> None:
    fleet = resolve_env(env)
    files = render_fleet(fleet).files
    parsed = parse_mig_parted(files["mig-parted/config.yaml"])
    assert parsed.pop("all-disabled") == {}
    assert parsed == fleet.mig_configs
    for name, cfg in fleet.device_plugin_configs.items():
        assert parse_device_plugin(files[f"device-plugin/{name}.yaml"]) == cfg.content
    assert parse_toolkit(files["nvidia-container-toolkit/config.toml"]) == toolkit_settings(fleet)
    for version in {n.containerd_version for n in fleet.nodes if n.managed_by == "ansible"}:
        runtime = containerd_runtime(version)
        text = files[f"containerd/{runtime.filename}"]
        assert parse_containerd_runtime(text, runtime.containerd) == runtime


def test_every_node_config_is_rendered() -> None:
    fleet = resolve_env("pilot")
    files = render_fleet(fleet).files
    mig = yaml.safe_load(files["mig-parted/config.yaml"])["mig-configs"]
    for node in fleet.nodes:
        if node.mig_config:
            assert node.mig_config in mig
        if node.device_plugin_config:
            assert f"device-plugin/{node.device_plugin_config}.yaml" in files


def test_mig_parted_config_selects_gpus_by_pci_id() -> None:
    files = render_fleet(resolve_env("dev")).files
    configs = yaml.safe_load(files["mig-parted/config.yaml"])
    assert configs["version"] == "v1"
    (entry,) = next(v for k, v in configs["mig-configs"].items() if k.startswith("mig-balanced-a100-sxm4-80gb"))
    assert "0x20B210DE" in entry["device-filter"]
    assert entry["mig-devices"] == {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}
    assert configs["mig-configs"]["all-disabled"] == [{"devices": "all", "mig-enabled": False}]


def test_device_plugin_time_slicing_config() -> None:
    fleet = resolve_env("dev")
    node = next(n for n in fleet.nodes if n.name == "dev-l4-01")
    text = render_fleet(fleet).files[f"device-plugin/{node.device_plugin_config}.yaml"]
    cfg = DevicePluginConfigFile.model_validate(yaml.safe_load(text))
    assert cfg.version == "v1" and cfg.flags.migStrategy == "mixed"
    assert cfg.flags.plugin is not None and cfg.flags.plugin.deviceListStrategy == ["cdi-annotations", "cdi-cri"]
    assert cfg.sharing is not None and cfg.sharing.timeSlicing is not None
    ts = cfg.sharing.timeSlicing
    assert ts.renameByDefault and ts.failRequestsGreaterThanOne
    assert [(r.name, r.replicas) for r in ts.resources] == [("nvidia.com/gpu", 4)]


def test_device_list_strategy_is_never_envvar(dev_data: dict[str, Any], write_env: Any) -> None:
    cluster_named(dev_data, "dev-metal")["cdi"] = False
    fleet = resolve(write_env(dev_data), PROFILES)
    for cfg in fleet.device_plugin_configs.values():
        assert cfg.content["flags"]["plugin"]["deviceListStrategy"] == ["volume-mounts"]


def test_toolkit_config_is_hardened() -> None:
    text = render_fleet(resolve_env("dev")).files["nvidia-container-toolkit/config.toml"]
    data = tomllib.loads(text)
    assert data["accept-nvidia-visible-devices-envvar-when-unprivileged"] is False
    assert data["accept-nvidia-visible-devices-as-volume-mounts"] is True
    assert data["nvidia-container-runtime"]["mode"] == "cdi"


def test_containerd_dropin_per_version() -> None:
    v16 = tomllib.loads(render_fleet_dropin("1.6"))
    cri = v16["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert v16["version"] == 2 and cri["default_runtime_name"] == "nvidia"
    assert cri["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True
    v17 = tomllib.loads(render_fleet_dropin("1.7"))
    assert "default_runtime_name" not in v17["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    v2 = tomllib.loads(render_fleet_dropin("2.1"))
    assert v2["version"] == 3
    assert v2["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["nvidia"]["options"][
        "BinaryName"] == "/usr/bin/nvidia-container-runtime"


def render_fleet_dropin(version: str) -> str:
    from gpushare.render.templating import environment

    return environment().get_template("containerd-nvidia-runtime.toml.j2").render(r=containerd_runtime(version))


def test_write_replaces_the_whole_directory(tmp_path: Path) -> None:
    out = tmp_path / "build" / "dev"
    rendered = render_fleet(resolve_env("dev"))
    write_rendered(rendered, out)
    (out / "device-plugin" / "stale.yaml").write_text("old")
    write_rendered(rendered, out)
    assert not (out / "device-plugin" / "stale.yaml").exists()
    assert (out / MARKER).exists()
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and p.name != MARKER) == sorted(
        rendered.files)


def test_write_refuses_a_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("keep")
    with pytest.raises(GpushareError) as info:
        write_rendered(render_fleet(resolve_env("dev")), tmp_path)
    assert info.value.exit_code == 2
    assert (tmp_path / "mine.txt").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]
