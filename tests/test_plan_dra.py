"""`gpushare plan` on an environment with a device-plugin cluster and a DRA cluster: per cluster and profile, what
each path gives and what does not carry over (docs/dra.md)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from gpushare.cli import app
from tests.conftest import ROOT

runner = CliRunner()
EXAMPLE = ROOT / "examples" / "environments" / "dra.yaml"


def plan(*args: str, columns: str = "250") -> str:
    result = runner.invoke(app, ["plan", *args], env={"COLUMNS": columns})
    assert result.exit_code == 0, result.output
    return result.stdout


def test_plan_json_shows_each_path_per_cluster_and_profile() -> None:
    rows = {(r["cluster"], r["profile"].split()[0]): r for r in json.loads(plan("--env", str(EXAMPLE), "--json"))
            ["allocation"]}
    assert rows[("lab-plugin", "notebooks-ts4")]["path"] == "device-plugin"
    assert rows[("lab-plugin", "notebooks-ts4")]["gives"] == "nvidia.com/gpu.shared x16"
    dra_ts = rows[("lab-dra", "notebooks-ts4")]
    assert dra_ts["gives"] == "gpushare-notebooks-ts4 -> quota nvidia.com/gpu.shared"  # the same quota name
    assert "ConsumableShares" in dra_ts["not carried over"] and "memory" in dra_ts["not carried over"]
    assert "alpha driver gates: ConsumableShares, TimeSlicingSettings" in dra_ts["not carried over"]
    mig = rows[("lab-dra", "mig-balanced")]
    assert "gpushare-mig-balanced-3g.40gb -> quota nvidia.com/mig-3g.40gb" in mig["gives"]
    assert "one device" in mig["not carried over"]
    assert "nvidia.com/gpu" in rows[("lab-dra", "exclusive")]["not carried over"]


def test_plan_text_in_both_layouts() -> None:
    for columns in ("250", "90"):
        out = " ".join(plan("--env", str(EXAMPLE), columns=columns).split())
        assert "GPU allocation per cluster and profile" in out
        assert "gpushare-exclusive -> quota nvidia.com/gpu" in out


def test_device_plugin_only_environments_show_no_allocation_section() -> None:
    assert "allocation" not in json.loads(plan("--env", "dev", "--json"))
    assert "GPU allocation" not in plan("--env", "dev")
