"""The Pulumi program under the SDK's own mock engine, loaded the way `pulumi up` loads it (runpy)."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml
from pulumi.runtime import stack as pulumi_stack

from tests.conftest import ROOT


class EchoMocks(pulumi.runtime.Mocks):
    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        return f"{args.name}_id", args.inputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        return {}


def run_program(stack: str, config: dict[str, str]) -> dict[str, Any]:
    pulumi_stack.set_root_resource(None)  # type: ignore[arg-type]
    pulumi.runtime.set_mocks(EchoMocks(), project="gpushare", stack=stack, preview=True)
    pulumi.runtime.set_all_config(config)
    runpy.run_path(str(ROOT / "infra" / "__main__.py"), run_name="__main__")
    root = pulumi_stack.get_root_resource()
    assert root is not None
    return dict(root.outputs)  # type: ignore[attr-defined]


@pytest.mark.parametrize("env", ["dev", "pilot", "prod"])
def test_each_stack_names_its_environment(env: str) -> None:
    config = yaml.safe_load((ROOT / f"Pulumi.{env}.yaml").read_text())["config"]
    outputs = run_program(env, config)
    assert outputs["environment"]["name"] == env
    pools = {k.removeprefix("pool:") for k in outputs if k.startswith("pool:")}
    env_data = yaml.safe_load((ROOT / "environments" / f"{env}.yaml").read_text())
    assert pools == {p["name"] for p in env_data["pools"]}


def test_outputs_carry_capacity() -> None:
    outputs = run_program("dev", {"gpushare:environment": "environments/dev.yaml"})
    l4 = outputs["pool:l4-notebooks"]
    assert l4["physical_gpus"] == 4 and l4["oversubscription"] == 4.0
    assert outputs["environment"]["hardware_units"] == 44


def test_invalid_environment_fails_the_program(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "environments" / "dev.yaml").read_text())
    data["pools"][0]["gpu_model"] = "NVIDIA H100 90GB"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(pulumi.RunError, match=r"pools\[0\]\.gpu_model"):
        run_program("dev", {"gpushare:environment": str(path)})


def test_missing_environment_file_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(pulumi.RunError, match="file not found"):
        run_program("dev", {"gpushare:environment": str(tmp_path / "nope.yaml")})


def test_stack_without_environment_setting_fails() -> None:
    with pytest.raises(pulumi.ConfigMissingError):
        run_program("dev", {})
