"""`gpushare demo-metrics` run as a user runs it (slow): it serves the shipped history from a real Prometheus on
127.0.0.1, where the showback and capacity commands it prints report every pool and write their charts."""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gpushare.ops import demo
from tests.conftest import ROOT

pytestmark = pytest.mark.usefixtures("frozen_workspace")  # GPUSHARE_ROOT: the frozen workspace, as in tests/unit


# ---------------------------------------------------------------- the real command, a real Prometheus


class Running:
    """`gpushare demo-metrics` as a user runs it: its own process, output read line by line as it comes."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "gpushare", "demo-metrics", *args], cwd=ROOT, env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def until(self, text: str, timeout: float = 180) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                break
            self.output.append(line)
            if text in line:
                return "".join(self.output)
        raise AssertionError(f"no {text!r} from demo-metrics: {''.join(self.output)}")

    def interrupt(self) -> int:
        self.process.send_signal(signal.SIGINT)  # Ctrl-C
        code = self.process.wait(timeout=60)
        while (line := self.lines.get(timeout=10)) is not None:
            self.output.append(line)
        return code

    def stop(self) -> None:
        """After a failure: the command and the server it started, by their PIDs."""
        if self.process.poll() is None:
            self.process.terminate()  # as Ctrl-C: it stops its server and removes its temporary folder
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        served = re.search(r"Prometheus \(pid (\d+)\)", "".join(self.output))
        if served and not _gone(int(served[1])):
            os.kill(int(served[1]), signal.SIGTERM)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _query(url: str, expr: str, at: int) -> float:
    body = urllib.parse.urlencode({"query": expr, "time": str(at)}).encode()
    with urllib.request.urlopen(f"{url}/api/v1/query", data=body, timeout=60) as response:  # noqa: S310
        result = json.loads(response.read())["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


def _gpushare(command: str, env: dict[str, str], *extra: str) -> dict[str, Any]:
    """A command demo-metrics printed, run as printed with --json and the outputs into the test's folder."""
    args = shlex.split(command)
    assert args[0] == "gpushare", command
    result = subprocess.run([sys.executable, "-m", "gpushare", *args[1:], *extra, "--json"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, (command, result.stdout[-3000:], result.stderr[-3000:])
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@pytest.mark.slow  # a real Prometheus server over the shipped history
def test_demo_metrics_serves_the_history_that_showback_and_capacity_read(tmp_path: Path) -> None:
    if shutil.which("promtool") is None or shutil.which("prometheus") is None:
        pytest.fail("promtool and prometheus are needed: run `make promtool` (Debian's prometheus package)")
    history = demo.load_history()
    env = {**os.environ, "GPUSHARE_ROOT": str(ROOT)}  # the shipped dev environment, environments/dev.yaml
    data_dir = tmp_path / "tsdb"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:  # the asked port is in use
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        running = Running("--port", str(port), "--data-dir", str(data_dir), env=env)
        try:
            output = running.until("Ctrl-C stops Prometheus")
            ready = time.monotonic() - started
            assert f"port {port} on 127.0.0.1 is taken" in output, output
            served = re.search(r"Prometheus \(pid (\d+)\) is serving it at (http://127\.0\.0\.1:(\d+))", output)
            assert served is not None, output
            pid, url = int(served[1]), served[2]
            assert int(served[3]) != port
            # What the server holds: every GPU, MIG instance and time-sliced replica of dev, at the last sample.
            assert _query(url, "count(DCGM_FI_PROF_GR_ENGINE_ACTIVE)", history.end) == 8 * 4 + 8 + 4 * 4
            assert _query(url, "count(kube_node_labels)", history.end) == 3
            assert _query(url, "count(DCGM_FI_PROF_GR_ENGINE_ACTIVE)", history.start - history.step) == 0
            commands = [line.strip() for line in output.splitlines() if line.startswith("  gpushare ")]
            assert [c.split()[1] for c in commands] == ["showback", "capacity"], output
            for command in commands:
                assert f"--end {history.end} --window {history.window}" in command and url in command

            showback = _gpushare(commands[0], env, "--chart", str(tmp_path / "showback.png"))
            assert showback["coverage"] > 0.99 and showback["physical_gpu_hours"] == pytest.approx(
                (8 + 8 + 4) * history.span_seconds / 3600, rel=0.001)
            assert {r["tenant"] for r in showback["rows"]} == {"search", "research", "notebooks"}
            assert all(r["allocated_gpu_hours"] > 0 for r in showback["rows"])
            assert (tmp_path / "showback.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

            capacity = _gpushare(commands[1], env, "--chart", str(tmp_path / "capacity.png"),
                                 "--patch", str(tmp_path / "dev.patch"))
            pools = {p["pool"]: p for p in capacity["pools"]}
            assert set(pools) == set(history.pools), pools
            assert all(p["utilization_now"] and not p["gaps"] for p in pools.values()), pools
            assert pools["h100-training"]["gpus_proposed"] > 8  # busy, with work waiting in Kueue
            assert pools["a100-inference"]["mig_layout_proposed"] != pools["a100-inference"]["mig_layout_now"]
            assert "a100-inference" in (tmp_path / "dev.patch").read_text()
            assert (tmp_path / "capacity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

            assert running.interrupt() == 0, "".join(running.output)
            assert "stopped" in "".join(running.output)
            assert _gone(pid)  # the one server it started, stopped
        finally:
            running.stop()
    assert (data_dir / demo.MARKER).is_file()  # --data-dir is kept ...

    started = time.monotonic()
    again = Running("--port", str(port), "--data-dir", str(data_dir), env=env)
    try:
        output = again.until("Ctrl-C stops Prometheus")  # ... and reused: no promtool the second time
        reused = time.monotonic() - started
        assert "reusing the TSDB blocks" in output and "promtool wrote" not in output, output
        assert f"127.0.0.1:{port} " in output  # free again: the asked port
        assert again.interrupt() == 0
    finally:
        again.stop()
    print(f"demo-metrics ready in {ready:.1f} s with promtool, {reused:.1f} s reusing --data-dir")
