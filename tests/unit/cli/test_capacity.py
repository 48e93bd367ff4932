"""`gpushare capacity` from the command line, without a Prometheus: a URL where none listens is a clear error
(the command against a real Prometheus: tests/prometheus/test_capacity.py)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gpushare.cli import app
from tests.unit.ops.capacity.helpers import ENV

runner = CliRunner()


def test_wrong_url_is_a_clear_error(tmp_path: Path) -> None:
    from tests.prometheus.server import free_port

    result = runner.invoke(app, ["capacity", "--env", str(ENV), "--prometheus", f"http://127.0.0.1:{free_port()}",
                                 "--json"])
    assert result.exit_code == 2
    data = json.loads(result.stdout)
    assert "cannot reach Prometheus" in data["errors"][0]
