"""Rollout snapshots (gpushare.ops.rollout.snapshot): one round-trips and resolves the same, and one taken from Git
reads the committed files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpushare.core.errors import GpushareError
from gpushare.core.resolve import resolve
from gpushare.ops.rollout.snapshot import Snapshot
from tests.conftest import ROOT
from tests.unit.ops.rollout.helpers import six_host_env


def test_snapshot_round_trips_and_resolves_the_same(tmp_path: Path) -> None:
    env = six_host_env(tmp_path)
    snap = Snapshot.of(env)
    again = Snapshot.from_dict(json.loads(json.dumps(snap.as_dict())))
    assert again == snap and again.fingerprint == snap.fingerprint
    path = again.materialize(tmp_path / "copy")
    assert (path.parent / "group_vars" / "all.yml").exists() and path.parent.name == "environments"
    assert resolve(path).as_dict()["pools"] == resolve(env).as_dict()["pools"]


def test_snapshot_from_git_reads_the_committed_files() -> None:
    import subprocess

    env = ROOT / "environments" / "pilot.yaml"
    head = Snapshot.from_git(ROOT, "HEAD", env)
    committed = subprocess.run(["git", "-C", str(ROOT), "show", "HEAD:environments/pilot.yaml"],
                               capture_output=True, text=True, check=True).stdout
    assert head.text == committed and "mig-balanced.yaml" in head.profiles
    with pytest.raises(GpushareError) as err:
        Snapshot.from_git(ROOT, "no-such-revision", env)
    assert err.value.problems[0].path == "--previous" and err.value.exit_code == 2
