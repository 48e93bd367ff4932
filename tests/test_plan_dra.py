"""`gpushare plan` on an environment with a device-plugin cluster and a DRA cluster: per cluster and profile, what
each path gives and what does not carry over (docs/dra.md)."""

from __future__ import annotations

import json
from typing import Any

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


def test_plan_says_what_the_clusters_minor_does_about_preemption_of_dra_pods(monkeypatch: Any) -> None:
    """No supported minor preempts a pod for the DRA devices it holds (tests/cluster/test_dra_partitionable.py shows
    1.37's scheduler leaving the victim alone): every DRA row says so for the cluster's own minor, device-plugin rows
    say nothing; a minor that did preempt would be named as doing so."""
    from gpushare.core import kubeversions

    rows = json.loads(plan("--env", str(EXAMPLE), "--json"))["allocation"]
    dra_rows = [r for r in rows if r["path"] == "dra"]
    assert dra_rows and all("priority preemption: Kubernetes 1.37's scheduler does not evict a lower-priority pod "
                            "for the DRA device it holds" in r["not carried over"] for r in dra_rows)
    assert all("preemption" not in r["not carried over"] for r in rows if r["path"] != "dra")
    assert "Kueue still preempts by quota" in " ".join(plan("--env", str(EXAMPLE), columns="90").split())
    monkeypatch.setattr(kubeversions, "PREEMPTS_DRA_PODS", frozenset({(1, 37)}))
    rows = json.loads(plan("--env", str(EXAMPLE), "--json"))["allocation"]
    assert all("Kubernetes 1.37's scheduler preempts pods for the DRA devices they hold" in r["not carried over"]
               for r in rows if r["path"] == "dra")
