"""A real Prometheus server (Debian's package) on 127.0.0.1, on a free port, over a TSDB directory; started here
and stopped by its PID, also when the test fails."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gpushare.ops.demo import stop


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def prometheus_server(data_dir: Path, work: Path, rule_files: tuple[Path, ...] = (), retention: str = "60d",
                      max_samples: int = 200_000_000, scrape_configs: list[dict[str, Any]] | None = None,
                      evaluation_interval: str = "1m") -> Iterator[str]:
    """`max_samples` 50,000,000 is the server's own default (--query.max-samples). With `scrape_configs` it also
    scrapes live targets (Prometheus' own scrape_config entries)."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("prometheus is not installed: run `make promtool` (Debian's prometheus package)")
    config = work / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"evaluation_interval": evaluation_interval},
                                      "rule_files": [str(p) for p in rule_files],
                                      "scrape_configs": scrape_configs or []}))
    port = free_port()
    log = (work / "prometheus.log").open("w")
    process = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={data_dir}",
         f"--web.listen-address=127.0.0.1:{port}", f"--storage.tsdb.retention.time={retention}",
         f"--query.max-samples={max_samples}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {process.returncode}: "
                                   f"{(work / 'prometheus.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:  # noqa: S310 - our own server
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("prometheus did not become ready within 60 s")
            time.sleep(0.2)
        yield url
    finally:
        stop(process)  # the one process started here, as `gpushare demo-metrics` stops its own
        log.close()
