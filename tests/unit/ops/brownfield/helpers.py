"""What the brownfield tests share: `kubectl get -o yaml` dumps of clusters (tests/data/brownfield/<name>/), and
gpushare run with --json. The fixture `imported` (tests/unit/conftest.py) imports one into a fresh workspace made by
`gpushare init`."""

from __future__ import annotations

import json
from typing import Any

from typer.testing import CliRunner

from gpushare.cli import app
from tests.conftest import ROOT

CLUSTERS = ROOT / "tests" / "data" / "brownfield"  # kubectl dumps of running clusters (read-only)
FIXTURES = ("default-operator", "timeslicing-mig", "not-taken-effect", "quotas-kueue", "default-and-custom")
ENV = "brown"

runner = CliRunner()


def cli(*args: str) -> tuple[int, Any]:
    """Run gpushare with --json; (exit code, the JSON it printed)."""
    result = runner.invoke(app, [*args, "--json"])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip() else None
