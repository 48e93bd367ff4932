"""`gpushare demo-metrics`: a recorded DCGM history of the dev environment, served by a local Prometheus, so that
showback and capacity can be tried without a cluster.

The history ships in the package (data/demo/dev-history.om.xz: OpenMetrics, xz-compressed, with the window and the
SHA-256 of its text in dev-history.json beside it); scripts/demo_history.py writes both from the test suite's series
generator. promtool turns it into TSDB blocks in a data folder, and Debian's `prometheus` serves that folder on
127.0.0.1 only, in a session of its own (Ctrl-C reaches gpushare, which stops it), with Linux's parent-death signal
set so that it also stops if gpushare is killed."""

from __future__ import annotations

import json
import lzma
import math
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.paths import package_data

HISTORY = ("demo", "dev-history.om.xz")
METADATA = ("demo", "dev-history.json")
MARKER = "gpushare-demo.json"  # written into a data folder once its blocks are built: which history they hold
READY_TIMEOUT = 60.0
PROMTOOL_TIMEOUT = 600
INSTALL_FIX = "run `make promtool` in a gpushare checkout, or `apt-get install prometheus` (Debian/Ubuntu: it has both)"


@dataclass(frozen=True)
class DemoHistory:
    environment: str
    pools: tuple[str, ...]
    start: int  # Unix seconds of the first and last sample
    end: int
    step: int
    window: str  # from the first sample to the last, as a Prometheus duration (what --window should say)
    samples: int
    sha256: str  # of the uncompressed OpenMetrics text

    @property
    def span_seconds(self) -> int:
        return self.end - self.start + self.step


def load_history() -> DemoHistory:
    meta: dict[str, Any] = json.loads(package_data(*METADATA).read_text())
    return DemoHistory(environment=meta["environment"], pools=tuple(meta["pools"]), start=int(meta["start"]),
                       end=int(meta["end"]), step=int(meta["step"]), window=str(meta["window"]),
                       samples=int(meta["samples"]), sha256=str(meta["sha256"]))


def history_text(history: DemoHistory) -> bytes:
    """The shipped OpenMetrics text, checked against its recorded SHA-256."""
    import hashlib

    text = lzma.decompress(package_data(*HISTORY).read_bytes())
    if hashlib.sha256(text).hexdigest() != history.sha256:
        raise GpushareError(Problem("the shipped demo history does not match its recorded SHA-256",
                                    file=str(package_data(*HISTORY)),
                                    fix="reinstall gpushare, or in a checkout run scripts/demo_history.py"))
    return text


def tools() -> tuple[str, str]:
    """(promtool, prometheus), or exit 2 naming what is missing and how to install it."""
    found = {name: shutil.which(name) for name in ("promtool", "prometheus")}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise GpushareError(Problem(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed "
                                    "or not on PATH; demo-metrics needs both", fix=INSTALL_FIX), exit_code=2)
    return found["promtool"] or "", found["prometheus"] or ""


def prepared(history: DemoHistory, data_dir: Path) -> bool:
    """Whether data_dir already holds this history's blocks (a previous run with the same --data-dir)."""
    marker = data_dir / MARKER
    try:
        return bool(json.loads(marker.read_text()).get("sha256") == history.sha256)
    except (OSError, ValueError, AttributeError):
        return False


def check_data_dir(history: DemoHistory, data_dir: Path) -> None:
    if data_dir.exists() and not data_dir.is_dir():
        raise GpushareError(Problem("--data-dir is not a folder", file=str(data_dir),
                                    fix="name a new or empty folder"), exit_code=2)
    if data_dir.is_dir() and any(data_dir.iterdir()) and not prepared(history, data_dir):
        raise GpushareError(Problem("--data-dir is neither empty nor a folder an earlier demo-metrics run wrote; "
                                    "it is left alone", file=str(data_dir),
                                    fix="name a new or empty folder, or leave --data-dir out for a temporary one"),
                            exit_code=2)


def build_blocks(history: DemoHistory, promtool: str, data_dir: Path, work: Path) -> None:
    """The history as TSDB blocks (promtool create-blocks-from openmetrics) written in `work`, then moved into
    data_dir with the marker: a run stopped half-way leaves data_dir as it was."""
    source, blocks = work / "dev-history.om", work / "blocks"
    source.write_bytes(history_text(history))
    hours = max(2, math.ceil(history.span_seconds / 3600) + 2)
    try:
        result = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics",
                                 f"--max-block-duration={hours}h", str(source), str(blocks)],
                                capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise GpushareError(Problem(f"promtool did not write the blocks within {PROMTOOL_TIMEOUT} s")) from None
    finally:
        source.unlink(missing_ok=True)
    if result.returncode != 0:
        raise GpushareError(Problem(f"promtool could not write the blocks: {(result.stderr or result.stdout)[-600:]}",
                                    fix="check that promtool is Prometheus 2.x or newer (`promtool --version`)"))
    data_dir.mkdir(parents=True, exist_ok=True)
    for block in sorted(blocks.iterdir()):
        shutil.move(str(block), str(data_dir / block.name))
    (data_dir / MARKER).write_text(json.dumps({"sha256": history.sha256, "start": history.start,
                                               "end": history.end}) + "\n")


def port_free(port: int) -> bool:
    """Whether prometheus could listen on 127.0.0.1:port. SO_REUSEADDR as Go's listeners set it: a port whose last
    connections are still in TIME_WAIT is free, one another program listens on (on any address) is not."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when gpushare's process ends, however it ends."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_prometheus(prometheus: str, data_dir: Path, work: Path, port: int) -> subprocess.Popen[bytes]:
    """Prometheus on 127.0.0.1:port over data_dir, no scrape targets, log in work/prometheus.log."""
    config = work / "prometheus.yml"
    config.write_text("# gpushare demo-metrics: serves the recorded history only; no scrape targets.\nglobal: {}\n")
    with (work / "prometheus.log").open("ab") as log:
        return subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={data_dir}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=3650d", "--log.level=warn"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)


def log_tail(work: Path, chars: int = 1500) -> str:
    try:
        return (work / "prometheus.log").read_text(errors="replace")[-chars:].strip()
    except OSError:
        return ""


def wait_ready(process: subprocess.Popen[bytes], url: str, work: Path, timeout: float = READY_TIMEOUT) -> bool:
    """True once /-/ready answers 200; False if the process exited first; an error after `timeout`."""
    deadline = time.monotonic() + timeout
    while process.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:  # noqa: S310 - our own server
                if response.status == 200:
                    return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise GpushareError(Problem(f"prometheus did not become ready within {timeout:.0f} s: {log_tail(work)}"))
        time.sleep(0.2)
    return False


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the one process started here, SIGKILL if it has not stopped in 30 s."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def commands(history: DemoHistory, url: str) -> list[str]:
    """What to run against the served history: its window, ending at its last sample."""
    common = f"--env {history.environment} --prometheus {url} --end {history.end} --window {history.window}"
    return [f"gpushare showback {common} --chart showback.png",
            f"gpushare capacity {common} --chart capacity.png"]
