"""`gpushare validate`, `plan`, `render` and `schema` through Typer's CliRunner: exit codes, JSON contracts, tables
at every width, and nothing written on bad input; and `plan` on an environment with a device-plugin cluster and a
DRA cluster: per cluster and profile, what each path gives and what does not carry over (docs/dra.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from gpushare.cli import app
from tests.conftest import ENVIRONMENTS, ROOT, SHIPPED_ENVIRONMENTS, host_named, pool_named, tenant_named

runner = CliRunner()


def test_plan_table_shows_pools_and_ratio() -> None:
    result = runner.invoke(app, ["plan", "--env", "dev"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for text in ("a100-inference", "h100-training", "l4-notebooks", "mig-balanced", "nvidia.com/gpu.shared x16",
                 "4.00", "environment dev", "1.27"):
        assert text in result.output


def _pool_blocks(output: str) -> dict[str, dict[str, str]]:
    """The narrow plan's pool blocks: `pool NAME` then `key: value` lines, continuation lines joined."""
    blocks: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    key = ""
    for line in output.splitlines():
        if line.startswith("pool "):
            current = blocks.setdefault(line.removeprefix("pool "), {})
        elif current is not None and line.startswith("  ") and line.strip():
            name, sep, value = line.strip().partition(": ")
            if sep and not line.startswith("   "):
                key, current[name] = name, value.strip()
            else:
                current[key] += "\n" + line.strip()
        else:
            current = None
    return blocks


def test_plan_at_80_columns_prints_a_block_per_pool_with_every_column() -> None:
    result = runner.invoke(app, ["plan", "--env", "prod"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert not any(ch in result.output for ch in "┃│┏━"), "a squeezed table was printed"
    plan = json.loads(runner.invoke(app, ["plan", "--env", "prod", "--json"]).output)
    blocks = _pool_blocks(result.output)
    assert list(blocks) == [p["name"] for p in plan["pools"]]
    for pool in plan["pools"]:
        block = blocks[pool["name"]]
        assert set(block) == {"cluster", "nodes", "GPUs", "profile", "MIG layout per GPU", "advertised", "ratio",
                              "isolation"}
        assert block["cluster"] == pool["cluster"] and block["isolation"] == pool["isolation"]
        assert block["ratio"] == f"{pool['oversubscription']:.2f}"
        assert block["profile"] == f"{pool['profile']} ({pool['sharing']})"
        assert block["advertised"].splitlines() == [f"{k} x{v}" for k, v in sorted(pool["advertised"].items())]
    for cluster, shares in plan["tenancy"].items():
        for tenant in shares:
            assert any(line.startswith(f"tenant {tenant} in {cluster}: ") for line in lines), (tenant, cluster)
    assert "environment prod:" in result.output and lines[-1] == "full detail: gpushare plan --json"


def test_plan_at_200_columns_keeps_the_tables() -> None:
    result = runner.invoke(app, ["plan", "--env", "prod"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if "┃ pool" in line)
    assert [c.strip() for c in header.strip("┃ ").split("┃")] == [
        "pool", "cluster", "nodes", "GPUs", "profile", "MIG layout per GPU", "advertised", "ratio", "isolation"]
    assert any(line.startswith("│ gke-l4-inference") and "prod-gke" in line for line in result.output.splitlines())
    assert not _pool_blocks(result.output)
    assert result.output.splitlines()[-1] == "full detail: gpushare plan --json"


def test_plan_json() -> None:
    result = runner.invoke(app, ["plan", "--env", "pilot", "--json"])
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert data["ok"] is True and data["environment"] == "pilot"
    assert {p["name"] for p in data["pools"]} >= {"a100-inference", "gke-l4-inference"}
    assert data["totals"]["physical_gpus"] == sum(p["physical_gpus"] for p in data["pools"])


def test_plan_says_why_an_untrusted_tenants_shared_quota_is_withheld(dev_data: dict[str, Any],
                                                                     write_env: Any) -> None:
    tenant_named(dev_data, "partner-eval")["quota"]["nvidia.com/gpu.shared"] = 2
    path = write_env(dev_data)
    data = json.loads(runner.invoke(app, ["plan", "--env", str(path), "--json"]).stdout)
    assert data["tenancy"]["dev-metal"]["partner-eval"]["guaranteed"]["nvidia.com/gpu.shared"] == 0
    (why,) = [w for w in data["warnings"] if "withheld" in w]
    assert "partner-eval (untrusted): quota 2 nvidia.com/gpu.shared withheld in cluster dev-metal" in why
    assert "untrusted-tenants-hardware-isolated" in why
    for command in ("plan", "validate"):
        text = runner.invoke(app, [command, "--env", str(path)], env={"COLUMNS": "300"})
        assert "quota 2 nvidia.com/gpu.shared withheld" in text.output, command
    # A trusted tenant's quota on the same resource is given, and nothing is said about it.
    trusted = json.loads(runner.invoke(app, ["plan", "--env", "dev", "--json"]).stdout)
    assert trusted["tenancy"]["dev-metal"]["notebooks"]["guaranteed"]["nvidia.com/gpu.shared"] > 0
    assert not [w for w in trusted["warnings"] if "withheld" in w]


def test_env_takes_a_path() -> None:
    result = runner.invoke(app, ["validate", "--env", str(ENVIRONMENTS / "prod.yaml")])
    assert result.exit_code == 0, result.output
    assert "environment prod" in result.output


def test_validate_lists_every_error_and_exits_1(tmp_path: Path, dev_data: dict[str, Any]) -> None:
    host_named(dev_data, "dev-a100-01")["gpu_cuont"] = 8
    dev_data["defaults"]["driver_brunch"] = 570
    path = tmp_path / "dev.yaml"
    path.write_text(yaml.safe_dump(dev_data, sort_keys=False))
    result = runner.invoke(app, ["validate", "--env", str(path)])
    assert result.exit_code == 1
    assert "2 problems" in result.output
    assert "pools[0].hosts[0].gpu_cuont" in result.output and "defaults.driver_brunch" in result.output
    assert "fix" in result.output and "Traceback" not in result.output


def test_validate_json_errors(tmp_path: Path, dev_data: dict[str, Any]) -> None:
    pool_named(dev_data, "l4-notebooks")["profile"] = "mig-balanced"
    path = tmp_path / "dev.yaml"
    path.write_text(yaml.safe_dump(dev_data, sort_keys=False))
    result = runner.invoke(app, ["validate", "--env", str(path), "--json"])
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data["ok"] is False
    assert data["problems"][0]["path"] == "pools[2].profile" and data["problems"][0]["fix"]


def test_unknown_environment_exits_2() -> None:
    result = runner.invoke(app, ["plan", "--env", "staging"])
    assert result.exit_code == 2
    assert "no environment named 'staging'" in result.output


def test_render_writes_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = runner.invoke(app, ["render", "--env", "dev", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "mig-parted" / "config.yaml").exists()
    assert (out / "nvidia-container-toolkit" / "config.toml").exists()
    assert list((out / "device-plugin").glob("*.yaml"))
    assert list((out / "containerd").glob("*.toml"))


def test_render_bad_input_writes_nothing(tmp_path: Path, dev_data: dict[str, Any]) -> None:
    pool_named(dev_data, "a100-inference")["gpu_model"] = "NVIDIA H100 90GB"
    path = tmp_path / "dev.yaml"
    path.write_text(yaml.safe_dump(dev_data, sort_keys=False))
    out = tmp_path / "out"
    result = runner.invoke(app, ["render", "--env", str(path), "--out", str(out)])
    assert result.exit_code == 1
    assert not out.exists()


def test_schema_matches_the_committed_files(tmp_path: Path) -> None:
    result = runner.invoke(app, ["schema", "--out", str(tmp_path)])
    assert result.exit_code == 0
    for name in ("environment.schema.json", "profile.schema.json", "guardrails.schema.json"):
        assert (tmp_path / name).read_text() == (ROOT / "schema" / name).read_text(), (
            f"schema/{name} is stale: run `make schema`")


def test_shipped_files_validate_against_the_schema() -> None:
    import jsonschema

    env_schema = json.loads((ROOT / "schema" / "environment.schema.json").read_text())
    profile_schema = json.loads((ROOT / "schema" / "profile.schema.json").read_text())
    for path in SHIPPED_ENVIRONMENTS.glob("*.yaml"):
        jsonschema.validate(yaml.safe_load(path.read_text()), env_schema)
    for path in (ROOT / "profiles").glob("*.yaml"):
        jsonschema.validate(yaml.safe_load(path.read_text()), profile_schema)


def test_error_text_in_brackets_is_printed_as_written(tmp_path: Path, dev_data: dict[str, Any]) -> None:
    pool_named(dev_data, "a100-inference")["gpu_model"] = "[bold]NVIDIA X[/]"
    path = tmp_path / "dev.yaml"
    path.write_text(yaml.safe_dump(dev_data, sort_keys=False))
    result = runner.invoke(app, ["validate", "--env", str(path)], env={"COLUMNS": "300"})
    assert result.exit_code == 1
    assert "[bold]NVIDIA X[/]" in result.output

# ---------------------------------------------------------------- plan on a device-plugin cluster beside a DRA cluster


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
