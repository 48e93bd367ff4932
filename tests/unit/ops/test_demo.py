"""`gpushare demo-metrics` (gpushare.ops.demo): the shipped DCGM history is what scripts/demo_history.py writes from
the test suite's generator, it is small and packaged, and missing tools and a foreign --data-dir are refused with
exit 2 (the command against a real Prometheus: tests/prometheus/test_demo_metrics.py)."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import lzma
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpushare.cli import app
from gpushare.core.errors import GpushareError
from gpushare.ops import demo
from tests.conftest import ROOT

DEMO = ROOT / "gpushare" / "data" / "demo"
runner = CliRunner()


def test_shipped_history_is_what_the_generator_writes() -> None:
    from scripts.demo_history import history

    text, meta = history()
    assert json.loads((DEMO / "dev-history.json").read_text()) == meta, \
        "gpushare/data/demo/dev-history.json is out of date: run .venv/bin/python scripts/demo_history.py"
    unpacked = lzma.decompress((DEMO / "dev-history.om.xz").read_bytes())
    assert hashlib.sha256(unpacked).hexdigest() == meta["sha256"] == hashlib.sha256(text.encode()).hexdigest(), \
        "gpushare/data/demo/dev-history.om.xz is out of date: run .venv/bin/python scripts/demo_history.py"


def test_shipped_history_is_small_packaged_and_covers_its_window() -> None:
    history = demo.load_history()
    files = sorted(DEMO.iterdir())
    assert sum(f.stat().st_size for f in files) < 512 * 1024  # well under 1 MiB in the package
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["gpushare"]
    for f in files:  # in the wheel, not only in a checkout
        assert any(fnmatch.fnmatch(str(f.relative_to(ROOT / "gpushare")), g) for g in globs), (f, globs)
    assert history.span_seconds == {"d": 86400, "h": 3600}[history.window[-1]] * int(history.window[:-1])
    assert history.end % history.step == 0 and history.step <= 300  # every 5-minute query step reads a sample
    assert demo.history_text(history).endswith(b"# EOF\n")


def test_the_init_skeletons_dev_environment_is_part_of_the_recorded_one() -> None:
    """demo-metrics says its commands work in a `gpushare init` workspace too: its dev pools are dev's."""
    def pools(path: Path) -> dict[str, Any]:
        data = yaml.safe_load(path.read_text())
        return {p["name"]: {k: p[k] for k in ("gpu_model", "profile", "hosts")} for p in data["pools"]}

    shipped = pools(ROOT / "environments" / "dev.yaml")
    skeleton = pools(ROOT / "gpushare" / "data" / "workspace" / "environments" / "dev.yaml")
    assert skeleton and all(shipped.get(name) == pool for name, pool in skeleton.items()), (skeleton, shipped)


def test_missing_promtool_or_prometheus_exits_2_with_the_fix(tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo-metrics"], env={"PATH": str(tmp_path)})
    assert result.exit_code == 2, result.output
    assert "promtool and prometheus are not installed" in result.output
    assert "make promtool" in result.output and "apt-get install prometheus" in result.output
    (tmp_path / "promtool").write_text("#!/bin/sh\n")
    (tmp_path / "promtool").chmod(0o755)
    result = runner.invoke(app, ["demo-metrics"], env={"PATH": str(tmp_path)})
    assert result.exit_code == 2, result.output
    assert "prometheus is not installed or not on PATH" in result.output and "promtool and" not in result.output


def test_a_data_dir_holding_other_files_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo, "tools", lambda: ("promtool", "prometheus"))
    (tmp_path / "someone-elses.db").write_text("x")
    result = runner.invoke(app, ["demo-metrics", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "neither empty nor a folder an earlier demo-metrics run wrote" in result.output
    assert (tmp_path / "someone-elses.db").read_text() == "x"


def test_a_failed_build_leaves_the_data_dir_as_it_was(tmp_path: Path) -> None:
    """Blocks are written beside and moved in only whole: a later run with the same --data-dir is not refused."""
    promtool = tmp_path / "promtool"
    promtool.write_text("#!/bin/sh\necho 'out of space' >&2\nexit 1\n")
    promtool.chmod(0o755)
    work, data_dir = tmp_path / "work", tmp_path / "tsdb"
    work.mkdir()
    with pytest.raises(GpushareError, match="out of space"):
        demo.build_blocks(demo.load_history(), str(promtool), data_dir, work)
    assert not data_dir.exists() and list(work.iterdir()) == []
