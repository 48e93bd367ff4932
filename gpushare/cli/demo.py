"""`gpushare demo-metrics`: serve the recorded DCGM history of the dev environment from a local Prometheus on
127.0.0.1, and print the showback and capacity commands that read it (docs/showback.md, "Try it without a
cluster")."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpushare.cli.common import fail
from gpushare.core.errors import GpushareError, Problem

if TYPE_CHECKING:
    import subprocess

START_TRIES = 3  # a port found free can be taken before Prometheus binds it: try another


def _say(line: str = "") -> None:
    print(line, flush=True)


def _utc(seconds: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _serve(prometheus: str, data: Path, work: Path, port: int) -> tuple[subprocess.Popen[bytes], str, float]:
    """Prometheus started on `port`, or on a free one where that is taken; (process, URL, seconds to ready)."""
    from gpushare.ops import demo  # lazy: http.server and ssl, ~25 ms to import

    for _ in range(START_TRIES):
        chosen = port if demo.port_free(port) else demo.free_port()
        if chosen != port:
            _say(f"port {port} on 127.0.0.1 is taken: serving on {chosen} instead")
        url = f"http://127.0.0.1:{chosen}"
        started = time.perf_counter()
        process = demo.start_prometheus(prometheus, data, work, chosen)
        try:
            ready = demo.wait_ready(process, url, work)
        except BaseException:
            demo.stop(process)
            raise
        if ready:
            return process, url, time.perf_counter() - started
        if "address already in use" not in demo.log_tail(work):
            raise GpushareError(Problem(f"prometheus exited with {process.returncode} while starting: "
                                        f"{demo.log_tail(work)}"))
    raise GpushareError(Problem(f"no free port for prometheus on 127.0.0.1 after {START_TRIES} tries",
                                fix="give another --port"))


def demo_metrics_command(
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port on 127.0.0.1 to serve on; a free one "
                                      "is taken instead where this one is in use.")] = 9090,
    data_dir: Annotated[Path | None, typer.Option(
        "--data-dir", help="Keep the TSDB blocks in this folder (new, empty, or one an earlier run wrote, which is "
        "reused) instead of a temporary folder removed on exit.")] = None,
) -> None:
    """Serve a recorded DCGM history of the dev environment from a local Prometheus (127.0.0.1), to try showback
    and capacity without a cluster; needs promtool and prometheus; Ctrl-C stops it."""
    import shutil
    import signal
    import tempfile
    import threading

    from gpushare.ops import demo  # lazy: http.server and ssl, ~25 ms to import

    work = Path(tempfile.mkdtemp(prefix="gpushare-demo-"))
    process: subprocess.Popen[bytes] | None = None
    try:
        try:
            history = demo.load_history()
            promtool, prometheus = demo.tools()
            if data_dir is not None:
                demo.check_data_dir(history, data_dir)
            data = data_dir if data_dir is not None else work / "data"
            _say(f"gpushare demo-metrics: the recorded history of environment {history.environment} "
                 f"({', '.join(history.pools)}): DCGM, kube-state-metrics and Kueue series from "
                 f"{_utc(history.start)} to {_utc(history.end)}, every {history.step // 60} minutes "
                 f"({history.samples:,} samples)")
            if data_dir is not None and demo.prepared(history, data_dir):
                _say(f"reusing the TSDB blocks in {data_dir}")
            else:
                started = time.perf_counter()
                demo.build_blocks(history, promtool, data, work)
                _say(f"promtool wrote the TSDB blocks into {data} in {time.perf_counter() - started:.1f} s")
            process, url, seconds = _serve(prometheus, data, work, port)
        except GpushareError as err:
            raise fail(err, False) from None
        try:  # from here on, Ctrl-C is the way to stop: not an interruption
            _say(f"Prometheus (pid {process.pid}) is serving it at {url} (ready in {seconds:.1f} s)")
            _say()
            _say(f"Try, in a workspace whose {history.environment} environment has these pools (this checkout's; "
                 "the one `gpushare init` writes has two of them):")
            for line in demo.commands(history, url):
                _say(f"  {line}")
            _say(f"--end and --window are the recorded window's; a longer window reads only {history.window} of "
                 "data.")
            _say()
            _say("Ctrl-C stops Prometheus" + (f"; the blocks stay in {data_dir} for the next run." if data_dir else
                                              " and removes its temporary data folder."))
            code = process.wait()
        except KeyboardInterrupt:
            _say(f"\nstopping Prometheus (pid {process.pid})")
            demo.stop(process)
            _say("stopped")
            return
        raise fail(GpushareError(Problem(f"prometheus (pid {process.pid}) exited with {code}: "
                                         f"{demo.log_tail(work)}")), False)
    finally:
        # A second Ctrl-C while stopping must not leave the server running: hold SIGINT until it has stopped.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) \
            if threading.current_thread() is threading.main_thread() else None
        try:
            if process is not None:
                demo.stop(process)
            shutil.rmtree(work, ignore_errors=True)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
