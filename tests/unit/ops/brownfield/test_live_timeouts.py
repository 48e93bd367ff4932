"""`--kubeconfig` against an API server on 127.0.0.1 that accepts the connection and never answers, or answers
each list only slowly: the read stops at its bounds with a message naming the list that timed out, and the same
server answering at once is read (test_live.py holds the contents). One that throttles (429, or 503 with a
Retry-After, as API Priority and Fairness does) is retried after the wait it asks for, within the same bounds."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpushare.core.errors import GpushareError
from tests.unit.ops.brownfield.test_live import server_kubeconfig

pytest.importorskip("kubernetes")
pytestmark = pytest.mark.slow  # servers


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Callable[[float], Path]]:
    servers: list[ThreadingHTTPServer] = []

    def start(delay: float, trickle: float = 0.0, refuse: Iterable[tuple[int, str | None]] = (),
              seen: list[tuple[str, float]] | None = None) -> Path:
        """A server answering each list after `delay` s; with `trickle`, one byte of it every `trickle` s. The first
        requests are refused with `refuse`'s (status, Retry-After header or None) in turn, each with a Status; each
        request's (path, time.monotonic()) goes to `seen`."""
        refusals = iter(refuse)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if seen is not None:
                    seen.append((self.path.split("?")[0], time.monotonic()))
                refusal = next(refusals, None)
                if refusal is not None:
                    code, retry_after = refusal
                    status = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                                         "message": "too many requests, please try again later"}).encode()
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(status)))
                    if retry_after is not None:
                        self.send_header("Retry-After", retry_after)
                    self.end_headers()
                    self.wfile.write(status)
                    return
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
    assert "did not answer the list of Nodes within the bound of 1 s to connect and 1 s per list call (--timeout)" \
        in text, text


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


def test_a_429_is_retried_after_its_retry_after(server: Callable[..., Path]) -> None:
    """Two 429s with Retry-After: 1, then the list: read, after the two waits, each retry shown."""
    from gpushare.ops.brownfield import live

    seen: list[tuple[str, float]] = []
    said: list[str] = []
    state = live.read_live(server(0.0, refuse=[(429, "1"), (429, "1")], seen=seen), None, say=said.append)
    assert state.of("Node") == []
    nodes = [at for path, at in seen if path == "/api/v1/nodes"]
    assert len(nodes) == 3 and all(b - a >= 0.95 for a, b in itertools.pairwise(nodes)), nodes
    assert said == [f"gpushare: the API server answered 429 Too Many Requests to the list of Nodes; waiting 1 s "
                    f"before retry {n}" for n in (1, 2)], said
    assert "/api/v1/namespaces" in {path for path, _ in seen}  # and the read went on


def test_the_retries_are_shown_on_stderr(server: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    from gpushare.ops.brownfield import live

    live.read_live(server(0.0, refuse=[(429, "0.2")]), None)
    err = capsys.readouterr().err
    assert "429 Too Many Requests to the list of Nodes; waiting 0.2 s before retry 1" in err, err


def test_a_429_without_retry_after_waits_1_s(server: Callable[..., Path]) -> None:
    from gpushare.ops.brownfield import live

    seen: list[tuple[str, float]] = []
    said: list[str] = []
    live.read_live(server(0.0, refuse=[(429, None), (429, "soon")], seen=seen), None, say=said.append)
    nodes = [at for path, at in seen if path == "/api/v1/nodes"]
    assert len(nodes) == 3 and all(b - a >= 0.95 for a, b in itertools.pairwise(nodes)), nodes
    assert len(said) == 2 and all("waiting 1 s before retry" in line for line in said), said


def test_a_503_with_retry_after_is_retried(server: Callable[..., Path]) -> None:
    from gpushare.ops.brownfield import live

    seen: list[tuple[str, float]] = []
    said: list[str] = []
    state = live.read_live(server(0.0, refuse=[(503, "1")], seen=seen), None, say=said.append)
    assert state.of("Node") == []
    nodes = [at for path, at in seen if path == "/api/v1/nodes"]
    assert len(nodes) == 2 and nodes[1] - nodes[0] >= 0.95, nodes
    assert said == ["gpushare: the API server answered 503 Service Unavailable to the list of Nodes; waiting 1 s "
                    "before retry 1"], said


def test_a_503_without_retry_after_is_not_retried(server: Callable[..., Path]) -> None:
    """Nothing asked for a retry: the read stops at once, and an API server failing is not a missing permission."""
    from gpushare.ops.brownfield import live

    seen: list[tuple[str, float]] = []
    with pytest.raises(GpushareError) as err:
        live.read_live(server(0.0, refuse=[(503, None)], seen=seen), None, say=pytest.fail)
    assert [path for path, _ in seen] == ["/api/v1/nodes"]
    text = str(err.value)
    assert "answered 503 Service Unavailable" in text and "healthy" in text and "may list" not in text, text


@pytest.mark.parametrize(("bound", "said"), [("total", "the whole read's bound of 2.5 s"),
                                             ("call", "the bound of 2.5 s per list call")])
def test_a_server_that_keeps_answering_429_is_given_up_within_the_bound(
        server: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, bound: str, said: str) -> None:
    """The waits count against the bounds: with 2.5 s, the third wait of 1 s would pass them; exit 2, saying how
    often and how long the server throttled, and what to do about it (not the RBAC fix)."""
    from gpushare.ops.brownfield import live

    if bound == "call":
        monkeypatch.setattr(live, "CALL_SECONDS", 2.5)
    import kubernetes.client  # noqa: F401 - imported before the clock starts (seconds on a busy machine)

    seen: list[tuple[str, float]] = []
    lines: list[str] = []
    started = time.monotonic()
    with pytest.raises(GpushareError) as err:
        live.read_live(server(0.0, refuse=itertools.repeat((429, "1")), seen=seen), None,
                       total=2.5 if bound == "total" else live.TOTAL_SECONDS, say=lines.append)
    assert time.monotonic() - started < 2.5 + 1.5  # within the bound, and no wait past it
    assert err.value.exit_code == 2
    assert [path for path, _ in seen] == ["/api/v1/nodes"] * 3 and len(lines) == 2, (seen, lines)
    text = str(err.value)
    assert ("the API server kept answering 429 Too Many Requests to the list of Nodes: 3 times in 2." in text
            and "s (2 retries), and the next wait of 1 s would pass " + said in text), text
    assert "Priority and Fairness" in text and "retry later" in text and "FlowSchema" in text, text
    assert "may list" not in text, text


def test_a_long_retry_after_is_capped_and_not_waited_past_the_bound(server: Callable[..., Path]) -> None:
    """An hour asked for is 10 s at most; with 5 s left it is not waited for at all."""
    from gpushare.ops.brownfield import live

    started = time.monotonic()
    with pytest.raises(GpushareError) as err:
        live.read_live(server(0.0, refuse=itertools.repeat((429, "3600"))), None, total=5.0, say=pytest.fail)
    assert time.monotonic() - started < 3
    assert "1 time in 0." in str(err.value) and "(0 retries), and the next wait of 10 s would pass the whole " \
        "read's bound of 5 s" in str(err.value), str(err.value)
