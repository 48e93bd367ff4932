"""Every dcgm-exporter counters file gpushare renders, read by Go's own encoding/csv set up as dcgm-exporter sets it
up (dcgmcounters/main.go), and the Python model (gpushare.render.monitoring.counters) agreeing with Go on every case
of tests/unit/render/monitoring/test_counters.py.

NVIDIA's own reader (dcgm-exporter internal/pkg/counters) is not built: the module proxy serves no version of
github.com/NVIDIA/dcgm-exporter or github.com/NVIDIA/go-dcgm, and that package links DCGM through cgo.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpushare.core.errors import GpushareError
from gpushare.render.monitoring.counters import FIELDS_FILE, read_counters
from gpushare.render.monitoring.fields import REQUIRED_FIELDS
from tests.nvidia.programs import ENVIRONMENT_FILES, ENVIRONMENT_IDS, ROOT, rendered
from tests.unit.render.monitoring.test_counters import CASES

pytestmark = pytest.mark.slow  # builds a Go program
SOURCE = Path(__file__).parent / "dcgmcounters"
FIELDS = ROOT / "gpushare" / "render" / "monitoring" / FIELDS_FILE
COUNTERS = "monitoring/dcgm-exporter-counters.csv"


@pytest.fixture(scope="module")
def dcgmcounters(tmp_path_factory: pytest.TempPathFactory) -> Path:
    go = shutil.which("go")
    if go is None:
        pytest.skip("Go is not installed: the Go check of dcgm-exporter counters files needs it (apt-get install "
                    "golang-go, or Go from https://go.dev/dl/ on PATH); "
                    "tests/unit/render/monitoring/test_counters.py still runs the Python check")
    out = tmp_path_factory.mktemp("dcgmcounters") / "dcgmcounters"
    # Standard library only: nothing to download, so no proxy at all.
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOPROXY": "off"}
    subprocess.run([go, "build", "-trimpath", "-o", str(out), "."], cwd=SOURCE, env=env, check=True, timeout=300)
    return out


def go_read(tool: Path, files: list[Path]) -> list[dict[str, Any]]:
    done = subprocess.run([tool, "-fields", FIELDS, *files], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode in (0, 1), done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["file"] for r in results] == [str(f) for f in files]
    return results


def python_rows(text: str) -> list[dict[str, Any]]:
    return [{"line": r.line, "name": r.name, "type": r.type, "help": r.help} for r in read_counters(text, "c.csv")]


def test_go_and_the_python_model_agree_on_every_case(dcgmcounters: Path, tmp_path: Path) -> None:
    paths = []
    for name, text, _, _ in CASES:
        path = tmp_path / f"{name}.csv"
        path.write_bytes(text.encode())  # as written: no newline translation
        paths.append(path)
    disagree = {}
    for (name, text, verdict, _), got in zip(CASES, go_read(dcgmcounters, paths), strict=True):
        go_takes = not got.get("error")
        if go_takes != (verdict in ("ok", "gpushare")):
            disagree[name] = f"Go: {got.get('error') or 'takes it'}; expected {verdict}"
        elif verdict == "ok" and got["records"] != python_rows(text):
            disagree[name] = f"Go read {got['records']}, Python {python_rows(text)}"
        elif verdict != "ok":
            with pytest.raises(GpushareError):
                read_counters(text, "c.csv")
    assert disagree == {}


@pytest.mark.parametrize("env_file", ENVIRONMENT_FILES, ids=ENVIRONMENT_IDS)
def test_every_rendered_counters_file_is_taken_by_gos_reader(dcgmcounters: Path, env_file: Path,
                                                              tmp_path: Path) -> None:
    text = rendered(env_file)[COUNTERS]
    path = tmp_path / "dcgm-metrics.csv"
    path.write_text(text)
    (got,) = go_read(dcgmcounters, [path])
    assert got.get("error") is None
    assert got["records"] == python_rows(text)
    assert REQUIRED_FIELDS <= {r["name"] for r in got["records"]}
