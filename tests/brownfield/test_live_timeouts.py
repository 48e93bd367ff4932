"""`--kubeconfig` against an API server on 127.0.0.1 that accepts the connection and never answers, or answers
each list only slowly: the read stops at its bounds with a message naming the list that timed out, and the same
server answering at once is read (test_live.py holds the contents)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpushare.core.errors import GpushareError
from tests.brownfield.test_live import server_kubeconfig

pytest.importorskip("kubernetes")
pytestmark = pytest.mark.slow  # servers


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Callable[[float], Path]]:
    servers: list[ThreadingHTTPServer] = []

    def start(delay: float, trickle: float = 0.0) -> Path:
        """A server answering each list after `delay` s; with `trickle`, one byte of it every `trickle` s."""

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                time.sleep(delay)
                data = json.dumps({"kind": "List", "apiVersion": "v1", "metadata": {}, "items": []}).encode()
                if trickle:
                    data = data.ljust(200)
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    for i in range(len(data)) if trickle else ():
                        self.wfile.write(data[i:i + 1])
                        self.wfile.flush()
                        time.sleep(trickle)
                    if not trickle:
                        self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        httpd.daemon_threads = True
        servers.append(httpd)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        return server_kubeconfig(tmp_path / f"k{len(servers)}.kubeconfig", httpd.server_port)

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def test_an_api_server_that_never_answers_is_timed_out_per_call(server: Callable[..., Path],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from gpushare.ops.brownfield import live

    monkeypatch.setattr(live, "CALL_SECONDS", 1.0)
    import kubernetes.client  # noqa: F401 - imported before the clock starts (seconds on a busy machine)

    started = time.monotonic()
    with pytest.raises(GpushareError) as err:
        live.read_live(server(60.0), None)
    assert time.monotonic() - started < 5  # one call, no retries
    text = str(err.value)
    assert "did not answer the list of Nodes within the bound" in text and "kubectl get nodes" in text, text


def test_a_trickled_answer_is_timed_out_per_call(server: Callable[..., Path],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes every 0.1 s, each within the client's read timeout: only a bound on the whole call ends it (the
    answer would take 20 s)."""
    from gpushare.ops.brownfield import live

    monkeypatch.setattr(live, "CALL_SECONDS", 1.0)
    import kubernetes.client  # noqa: F401 - as above

    started = time.monotonic()
    with pytest.raises(GpushareError) as err:
        live.read_live(server(0.0, trickle=0.1), None)
    assert time.monotonic() - started < 5
    text = str(err.value)
    assert "did not answer the list of Nodes within the bound of 10 s to connect and 1 s per list call" in text, text


def test_slow_answers_are_bounded_in_total(server: Callable[..., Path]) -> None:
    import kubernetes.client  # noqa: F401 - as above

    from gpushare.ops.brownfield import live

    started = time.monotonic()
    with pytest.raises(GpushareError) as err:
        live.read_live(server(0.4), None, total=1.0)  # each list answers, ten of them do not fit
    assert time.monotonic() - started < 3
    assert "whole read's bound of 1 s" in str(err.value), str(err.value)


def test_a_server_that_answers_is_read(server: Callable[..., Path]) -> None:
    from gpushare.ops.brownfield import live

    state = live.read_live(server(0.0), None)
    assert state.of("Node") == []
