"""`gpushare check`: its JSON and exit code, and `check --base REF`, which says what the change does against REF:
rules newly failing and newly passing, waivers added, removed, changed and expiring, and the pools and nodes that
change, in text (whole at 80 columns) and JSON. Each --base test works in a throwaway Git repository that
`gpushare init` made."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpushare.cli import app

# ---------------------------------------------------------------- the CLI


def test_check_cli_json_and_exit_code(tmp_path: Path, dev_data: dict[str, Any]) -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["check", "--env", "dev", "--json", "--no-plan"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["ok"] is True
    dev_data["defaults"]["toolkit_version"] = "1.17.4"  # below the toolkit's CVE floor
    path = tmp_path / "dev.yaml"
    path.write_text(yaml.safe_dump(dev_data))
    bad = runner.invoke(app, ["check", "--env", str(path), "--json", "--no-plan"])
    assert bad.exit_code == 1
    data = json.loads(bad.output)
    assert data["ok"] is False
    assert data["violations"][0].keys() == {"rule", "level", "where", "message", "fix"}
    assert data["violations"][0]["rule"] == "toolkit-cve-floor"
    table = runner.invoke(app, ["check", "--env", str(path), "--no-plan"], env={"COLUMNS": "200"})
    assert table.exit_code == 1 and "toolkit-cve-floor" in table.output and "FAIL" in table.output

# ---------------------------------------------------------------- check --base


runner = CliRunner()


TODAY = "2026-12-10"
WAIVER = """waivers:
  - rule: toolkit-cve-floor
    environment: dev
    where: "pool l4-notebooks"
    reason: the L4 hosts move to the fixed toolkit with the next image build
    approved_by: platform-team
    expires: "2026-12-20"
"""


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.net", *args],
                          check=True, capture_output=True, text=True).stdout


def init(directory: Path) -> None:
    result = runner.invoke(app, ["init", str(directory)])
    assert result.exit_code == 0, result.output


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace `gpushare init` made, which is a Git repository with init's first commit."""
    root = tmp_path / "fleet"
    init(root)
    assert git(root, "log", "--format=%s").strip() == "gpushare init: a new workspace"
    monkeypatch.setenv("GPUSHARE_ROOT", str(root))
    return root


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, (path, old)
    path.write_text(text.replace(old, new))


def change(root: Path) -> None:
    """A pool's profile (with the tenant quota that follows it), a replica count and a new waiver."""
    env = root / "environments" / "dev.yaml"
    edit(env, "    profile: mig-balanced\n", "    profile: mig-small\n")
    edit(env, "      nvidia.com/mig-3g.40gb: 4\n      nvidia.com/mig-2g.20gb: 4\n", "      nvidia.com/mig-1g.10gb: 8\n")
    edit(root / "profiles" / "notebooks-ts4.yaml", "  replicas: 4\n", "  replicas: 8\n")
    edit(root / "policies" / "waivers.yaml", "waivers: []\n", WAIVER)


def check(root: Path, *args: str, columns: int = 80) -> tuple[int, str]:
    result = runner.invoke(app, ["check", "--env", "dev", "--today", TODAY, *args],
                           env={"GPUSHARE_ROOT": str(root), "COLUMNS": str(columns)})
    return result.exit_code, result.stdout


def base_of(root: Path, *args: str) -> tuple[int, dict[str, Any]]:
    code, out = check(root, "--json", *args)
    report = json.loads(out)
    return code, report["base"]


A100 = {"nvidia.com/mig-1g.10gb": 16, "nvidia.com/mig-2g.20gb": 8, "nvidia.com/mig-3g.40gb": 8}
SHARED_RULE = {"rule": "shared-replicas-limit", "level": "mandatory", "where": "pool l4-notebooks",
               "message": "profile notebooks-ts4 shares each NVIDIA L4 (24 GiB, class small) 8 ways; dev allows 4"}
WAIVED = {"rule": "toolkit-cve-floor", "environment": "dev", "where": "pool l4-notebooks",
          "reason": "the L4 hosts move to the fixed toolkit with the next image build", "expires": "2026-12-20",
          "approved_by": "platform-team"}
POOLS = [
    {"pool": "a100-inference", "change": "changed", "fields": {
        "profile": {"base": "mig-balanced", "now": "mig-small"},
        "hardware_units": {"base": 32, "now": 56},
        "advertised": {"base": A100, "now": {"nvidia.com/mig-1g.10gb": 56}}}},
    {"pool": "l4-notebooks", "change": "changed", "fields": {
        "replicas": {"base": 4, "now": 8},
        "advertised": {"base": {"nvidia.com/gpu.shared": 16}, "now": {"nvidia.com/gpu.shared": 32}},
        "oversubscription": {"base": 4.0, "now": 8.0}}},
]
NODES = [
    {"node": "dev-a100-01", "change": "changed", "fields": {
        "profile": {"base": "mig-balanced", "now": "mig-small"},
        "mig_layout": {"base": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}, "now": {"1g.10gb": 7}},
        "advertised": {"base": A100, "now": {"nvidia.com/mig-1g.10gb": 56}}}},
    {"node": "dev-l4-01", "change": "changed", "fields": {
        "replicas": {"base": 4, "now": 8},
        "advertised": {"base": {"nvidia.com/gpu.shared": 16}, "now": {"nvidia.com/gpu.shared": 32}},
        "oversubscription": {"base": 4.0, "now": 8.0}}},
]


def test_an_unchanged_workspace_changes_nothing(workspace: Path) -> None:
    code, base = base_of(workspace, "--base", "HEAD", "--no-plan")
    assert code == 0 and base["errors"] == [] and base["environment_at_base"] is True
    assert base["rules"] == {"newly_failing": [], "newly_passing": []}
    assert base["pools"] == base["nodes"] == [] and base["totals"] == {}
    _, text = check(workspace, "--base", "HEAD", "--no-plan")
    assert "no change against HEAD" in text


def test_the_json_base_section_shows_exactly_the_change(workspace: Path) -> None:
    change(workspace)
    code, base = base_of(workspace, "--base", "HEAD")  # with the offline plan, at the base too
    assert code == 1
    assert base["ref"] == "HEAD" and base["commit"] == git(workspace, "rev-parse", "HEAD").strip()
    assert base["errors"] == [] and base["environment_at_base"] is True
    assert base["rules"] == {"newly_failing": [{**SHARED_RULE, "base": "pass"}], "newly_passing": []}
    assert base["waivers"] == {"added": [WAIVED], "removed": [], "changed": [],
                               "expiring": [{**WAIVED, "days_left": 10}], "expiring_within_days": 14}
    assert base["pools"] == POOLS
    assert base["nodes"] == NODES
    assert base["totals"] == {
        "hardware_units": {"base": 36, "now": 60},
        "advertised": {"base": {"nvidia.com/gpu.shared": 16, **A100},
                       "now": {"nvidia.com/gpu.shared": 32, "nvidia.com/mig-1g.10gb": 56}},
        "oversubscription": {"base": 1.333, "now": 1.467}}


def test_the_text_shows_the_change_whole_at_80_columns(workspace: Path) -> None:
    change(workspace)
    code, text = check(workspace, "--base", "HEAD", "--no-plan")
    assert code == 1
    assert all(len(line) <= 80 for line in text.splitlines()), text
    after = text.split("against the base HEAD (", 1)[1]
    blocks = [b.strip() for b in re.split(r"\n\s*\n", after)]

    def block(heading: str) -> str:
        (found,) = [b for b in blocks if b.startswith(heading)]
        return " ".join(found.split())  # values wrapped at 80 columns, read as one line

    assert "newly failing (mandatory; base: pass) shared-replicas-limit where: pool l4-notebooks" in block(
        "newly failing")
    assert block("added, expires in 10 days").startswith(
        "added, expires in 10 days toolkit-cve-floor where: pool l4-notebooks expires: 2026-12-20")
    assert block("a100-inference") == (
        "a100-inference changed profile: mig-balanced -> mig-small hardware units: 32 -> 56 advertised: "
        "nvidia.com/mig-1g.10gb=16, nvidia.com/mig-2g.20gb=8, nvidia.com/mig-3g.40gb=8 -> nvidia.com/mig-1g.10gb=56")
    assert block("l4-notebooks") == (
        "l4-notebooks changed replicas: 4 -> 8 advertised: nvidia.com/gpu.shared=16 -> nvidia.com/gpu.shared=32 "
        "oversubscription: 4 -> 8")
    assert block("dev-a100-01").startswith(
        "dev-a100-01 changed profile: mig-balanced -> mig-small MIG layout: 3g.40gb=1, 2g.20gb=1, 1g.10gb=2 -> "
        "1g.10gb=7")
    assert block("dev-l4-01") == block("l4-notebooks").replace("l4-notebooks", "dev-l4-01", 1)
    # Nothing else changed: one block per rule, waiver, pool and node above, plus the environment's totals.
    headings = [b.splitlines()[0] for b in blocks]
    assert [h for h in headings if h.endswith(("changed", "added", "removed"))] == [
        "(environment)  changed", "a100-inference  changed", "l4-notebooks  changed", "dev-a100-01  changed",
        "dev-l4-01  changed"]


def test_undoing_the_change_makes_the_rule_newly_pass_and_removes_the_waiver(workspace: Path) -> None:
    originals = {p: p.read_text() for p in (workspace / "environments" / "dev.yaml",
                                            workspace / "profiles" / "notebooks-ts4.yaml",
                                            workspace / "policies" / "waivers.yaml")}
    change(workspace)
    git(workspace, "commit", "-q", "-am", "the change")
    for path, text in originals.items():
        path.write_text(text)
    code, base = base_of(workspace, "--base", "HEAD", "--no-plan")
    assert code == 0
    assert base["rules"] == {"newly_failing": [], "newly_passing": [{**SHARED_RULE, "now": "pass"}]}
    assert base["waivers"]["removed"] == [WAIVED] and base["waivers"]["added"] == base["waivers"]["expiring"] == []
    assert [(p["pool"], p["fields"]["advertised"]["now"]) for p in base["pools"]] == [
        ("a100-inference", A100), ("l4-notebooks", {"nvidia.com/gpu.shared": 16})]


def test_a_renewed_waiver_is_changed_not_added(workspace: Path) -> None:
    edit(workspace / "policies" / "waivers.yaml", "waivers: []\n", WAIVER)
    git(workspace, "commit", "-q", "-am", "waiver")
    edit(workspace / "policies" / "waivers.yaml", 'expires: "2026-12-20"', 'expires: "2027-02-01"')
    _, base = base_of(workspace, "--base", "HEAD", "--no-plan")
    assert base["waivers"]["added"] == base["waivers"]["removed"] == base["waivers"]["expiring"] == []
    (changed,) = base["waivers"]["changed"]
    assert (changed["base"]["expires"], changed["now"]["expires"]) == ("2026-12-20", "2027-02-01")


@pytest.mark.parametrize("ref", ["no-such-branch", "HEAD~5"])
def test_an_unknown_ref_is_exit_2_naming_the_ref_and_the_fix(workspace: Path, ref: str) -> None:
    code, out = check(workspace, "--base", ref, "--no-plan", "--json")
    problems = json.loads(out)["problems"]
    assert code == 2 and len(problems) == 1
    assert problems[0]["path"] == "--base" and f"{ref!r} names no commit" in problems[0]["message"]
    assert "git fetch" in problems[0]["fix"]
    code, _ = check(workspace, "--base", ref, "--no-plan")
    assert code == 2


def test_a_workspace_in_a_subdirectory_and_an_environment_new_since_the_base(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    repository = tmp_path / "infra-repo"
    repository.mkdir()
    git(repository, "init", "-q")
    git(repository, "commit", "-q", "--allow-empty", "-m", "before the fleet")
    init(repository / "gpu" / "fleet")  # inside a repository: init makes no new one
    root = repository / "gpu" / "fleet"
    assert not (root / ".git").exists()
    git(repository, "add", "-A")
    git(repository, "commit", "-q", "-m", "the fleet")
    monkeypatch.chdir(root / "environments")
    edit(root / "profiles" / "notebooks-ts4.yaml", "  replicas: 4\n", "  replicas: 8\n")
    code, base = base_of(root, "--base", "HEAD", "--no-plan")
    assert code == 1 and base["environment_at_base"] is True
    assert [p["pool"] for p in base["pools"]] == ["l4-notebooks"]
    # The same by the file's path (from environments/, where the test runs).
    result = runner.invoke(app, ["check", "--env", "dev.yaml", "--today", TODAY, "--base", "HEAD", "--no-plan",
                                 "--json"], env={"GPUSHARE_ROOT": str(root)})
    assert json.loads(result.stdout)["base"]["pools"] == base["pools"]
    # At the first commit the workspace did not exist: every pool and node is added, every violation new.
    code, base = base_of(root, "--base", "HEAD~1", "--no-plan")
    assert base["environment_at_base"] is False and base["errors"] == []
    assert {p["pool"]: p["change"] for p in base["pools"]} == {"a100-inference": "added", "l4-notebooks": "added"}
    assert [(r["rule"], r["base"]) for r in base["rules"]["newly_failing"]] == [("shared-replicas-limit", "absent")]
    _, text = check(root, "--base", "HEAD~1", "--no-plan")
    assert "the environment does not exist at HEAD~1" in text


def test_a_base_that_cannot_be_judged_says_why_and_compares_nothing(workspace: Path) -> None:
    edit(workspace / "environments" / "dev.yaml", "    profile: mig-balanced\n", "    profile: no-such-profile\n")
    git(workspace, "commit", "-q", "-am", "a broken base")
    edit(workspace / "environments" / "dev.yaml", "    profile: no-such-profile\n", "    profile: mig-balanced\n")
    code, base = base_of(workspace, "--base", "HEAD", "--no-plan")
    assert code == 0 and base["rules"] is None and base["pools"] == []
    assert any("no-such-profile" in e and "environments/dev.yaml" in e for e in base["errors"]), base["errors"]
    assert not any("gpushare-base-" in e for e in base["errors"])  # the scratch copy's paths are not shown
