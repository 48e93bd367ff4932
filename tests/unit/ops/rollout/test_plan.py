"""The rollout plan (gpushare.ops.rollout.plan): the device-plugin configs nodes still use are kept for the Pulumi
program."""

from __future__ import annotations

from pathlib import Path

from gpushare.core.resolve import resolve
from gpushare.ops.rollout.plan import kept_configs
from tests.conftest import ROOT
from tests.unit.ops.rollout.helpers import six_host_env


def test_kept_configs_are_written_for_the_pulumi_program(tmp_path: Path) -> None:
    old = resolve(six_host_env(tmp_path / "a"))
    new = resolve(six_host_env(tmp_path / "b", a100_profile="mig-small"))
    kept = kept_configs(old, new, tmp_path / "kept")
    assert [k["name"] for k in kept] == sorted(set(old.device_plugin_configs) - set(new.device_plugin_configs))
    from gpushare.core.resolve import device_plugin_digest
    from gpushare.render.fleet import parse_device_plugin

    for k in kept:
        content = parse_device_plugin((ROOT / k["file"]).read_text())
        assert k["name"].endswith(device_plugin_digest(content))
    assert kept_configs(None, new, tmp_path / "kept") == []
    assert kept_configs(new, new, tmp_path / "kept") == []
