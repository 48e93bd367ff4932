"""The rollout's adapters (gpushare.ops.rollout.adapters): Pulumi runs the program with this gpushare's Python."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.ops.rollout.adapters import PulumiRunner
from gpushare.ops.rollout.plan import Step


def test_pulumi_runs_the_program_with_this_gpushare_s_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """A workspace's Pulumi.yaml names no interpreter of the machine that wrote it: the rollout tells Pulumi's
    Python language host to use the interpreter that runs gpushare (PULUMI_PYTHON_CMD), and keeps one a user set."""
    import sys
    from types import SimpleNamespace

    from pulumi import automation as auto

    seen: dict[str, Any] = {}

    def select_stack(stack_name: str, work_dir: str, opts: auto.LocalWorkspaceOptions) -> Any:
        seen.update(stack=stack_name, work_dir=work_dir, env=dict(opts.env_vars or {}))
        summary = SimpleNamespace(result="succeeded", resource_changes={})
        return SimpleNamespace(up=lambda **_: SimpleNamespace(summary=summary))

    monkeypatch.setattr(auto, "select_stack", select_stack)
    monkeypatch.delenv("PULUMI_PYTHON_CMD", raising=False)
    runner = PulumiRunner(confirm=lambda step: False)
    status, _ = runner._up(Step("pulumi-prune", {"stack": "dev", "commands": []}))
    assert status == "done" and seen["stack"] == "dev" and seen["env"] == {"PULUMI_PYTHON_CMD": sys.executable}
    monkeypatch.setenv("PULUMI_PYTHON_CMD", "/opt/python/bin/python3")
    runner._up(Step("pulumi-prune", {"stack": "dev", "commands": []}))
    assert seen["env"] == {"PULUMI_PYTHON_CMD": "/opt/python/bin/python3"}
