"""The Prometheus client against servers that misbehave, each a thread on 127.0.0.1 started here: answers of the
wrong shape or nested deeply, samples that are words, negative or huge, a server that accepts and never answers
or trickles bytes, and answers above the size bound. Each is a located error (exit 2) within the time bound; a
well-formed answer beside them still reads."""

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
from gpushare.ops import prometheus as p
from gpushare.ops.prometheus import Prometheus, read_steps, sample_value

pytestmark = pytest.mark.slow  # servers

Handler = Callable[[BaseHTTPRequestHandler, dict[str, str]], None]


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], str]]:
    servers: list[ThreadingHTTPServer] = []

    def start(handle: Handler) -> str:
        class _H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                from urllib.parse import parse_qsl

                body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
                try:
                    handle(self, dict(parse_qsl(body)))
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up, as it should

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), _H)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _send(handler: BaseHTTPRequestHandler, body: bytes, status: int = 200) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _answer(doc: Any) -> Handler:
    return lambda h, _params: _send(h, json.dumps(doc).encode() if not isinstance(doc, bytes) else doc)


def _vector(*values: str) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"pool": f"p{i}"}, "value": [1764600000.0, v]} for i, v in enumerate(values)]}}


def test_a_well_formed_answer_reads(serve: Callable[[Handler], str]) -> None:
    url = serve(_answer(_vector("0.5", "NaN", "+Inf", "0")))
    result = Prometheus(url).query("use", "up", 1764600000.0)
    assert [sample_value(s) for s in result] == [0.5, None, None, 0.0]


@pytest.mark.parametrize(("what", "doc", "said"), [
    ("a list", [1, 2, 3], "shape"),
    ("no data", {"status": "success"}, "not a mapping"),
    ("result as a map", {"status": "success", "data": {"resultType": "vector", "result": {"a": 1}}}, "result"),
    ("a value that is a word", _vector("lots"), "is not a number"),
    ("a value as a number, not text", {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {}, "value": [1764600000.0, 0.5]}]}}, "string"),
    ("labels that are not text", {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"pool": 3}, "value": [1764600000.0, "1"]}]}}, "metric"),
    ("a negative sample", _vector("-3.5"), "negative"),
    ("a huge sample", _vector("1e300"), "above"),
    ("minus infinity", _vector("-Inf"), "negative"),
    ("nested very deeply", b"[" * 200_000 + b"]" * 200_000, "nested"),
])
def test_an_answer_of_the_wrong_shape_is_an_error_naming_the_server(serve: Callable[[Handler], str], what: str,
                                                                    doc: Any, said: str) -> None:
    url = serve(_answer(doc))
    with pytest.raises(GpushareError) as err:
        Prometheus(url).query("use", "up", 1764600000.0)
    assert err.value.exit_code == 2
    text = str(err.value)
    assert url in text and said in text and "fix:" in text, text


def test_a_server_that_never_answers_is_timed_out_by_gpushare_not_blamed_on_query_timeout(
        serve: Callable[[Handler], str]) -> None:
    url = serve(lambda h, _p: time.sleep(30))
    started = time.monotonic()
    with pytest.raises(GpushareError) as err:
        Prometheus(url, timeout=1.0).query("use", "up", 1764600000.0)
    assert time.monotonic() - started < 3
    text = str(err.value)
    assert "sent no answer to the use query within 1 s" in text and url in text, text
    assert not isinstance(err.value, p.ServerLimit)  # nothing to halve: the server is not refusing a big query


def _trickle(h: BaseHTTPRequestHandler, _params: dict[str, str]) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.end_headers()
    for _ in range(300):
        h.wfile.write(b" ")
        h.wfile.flush()
        time.sleep(0.1)


def test_a_server_that_trickles_bytes_is_bounded_in_total(serve: Callable[[Handler], str]) -> None:
    url = serve(_trickle)
    started = time.monotonic()
    with pytest.raises(GpushareError) as err:
        Prometheus(url, timeout=1.0).query("use", "up", 1764600000.0)
    assert time.monotonic() - started < 3
    assert "bytes of its answer" in str(err.value), str(err.value)


def test_capacitys_halving_retry_is_bounded_in_total_time(serve: Callable[[Handler], str]) -> None:
    """A server refusing every chunk at its own --query.timeout after a while: read_steps halves a chunk down to one
    step, eleven queries one after the other (at Prometheus's default 2 min each, 22 minutes); the client's total
    bound stops it."""
    def refuse(h: BaseHTTPRequestHandler, _params: dict[str, str]) -> None:
        time.sleep(0.4)
        _send(h, json.dumps({"status": "error", "errorType": "timeout", "error": "query timed out"}).encode(), 503)

    url = serve(refuse)
    prom = Prometheus(url, timeout=5.0, total=1.0)
    started = time.monotonic()
    with pytest.raises(GpushareError) as err:
        read_steps(prom, "use", "up", (0, 86_400_000 - 60_000, 60_000))
    assert time.monotonic() - started < 2.5
    assert "in all" in str(err.value), str(err.value)


def test_an_answer_above_the_size_bound_is_split_and_a_small_one_reads(serve: Callable[[Handler], str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(p, "MAX_ANSWER_BYTES", 200_000)
    asked: list[int] = []

    def answer(h: BaseHTTPRequestHandler, params: dict[str, str]) -> None:
        start, end, step = float(params["start"]), float(params["end"]), int(params["step"])
        steps = int((end - start) // step) + 1
        asked.append(steps)
        values = [[start + i * step, "1"] for i in range(steps)]
        pad = "x" * (300_000 if steps > 100 else 0)  # a big answer for a big range
        _send(h, json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {"pool": "a", "pad": pad}, "values": values}]}}).encode())

    url = serve(answer)
    series = read_steps(Prometheus(url), "use", "up", (0, 399 * 60_000, 60_000))
    assert sum(len(v) for v in series.values()) == 400
    assert max(asked) == 400 and min(asked) <= 100

    with pytest.raises(GpushareError) as err:  # an instant query cannot be split
        monkeypatch.setattr(p, "MAX_ANSWER_BYTES", 10)
        Prometheus(url).query_range("use", "up", 0, 60, 60)
    assert "larger than gpushare reads at once" in str(err.value)


def _negative(h: BaseHTTPRequestHandler, params: dict[str, str]) -> None:
    """Every query answered with one series at -2 (a vector, or a matrix for range queries)."""
    metric = {"pool": "dev-metal-a100", "hostname": "dev-gpu-01", "node": "dev-gpu-01", "namespace": "research"}
    if "step" in params:
        steps = int((float(params["end"]) - float(params["start"])) // int(params["step"])) + 1
        data = {"resultType": "matrix", "result": [{"metric": metric, "values": [
            [float(params["start"]) + i * int(params["step"]), "-2"] for i in range(min(steps, 50))]}]}
    elif "match[]" in params:
        data = [metric]  # type: ignore[assignment]
    else:
        data = {"resultType": "vector", "result": [{"metric": metric, "value": [float(params["time"]), "-2"]}]}
    _send(h, json.dumps({"status": "success", "data": data}).encode())


@pytest.mark.parametrize("command", [["showback", "--env", "dev", "--window", "1d"],
                                     ["capacity", "--env", "dev", "--window", "1d"]])
def test_negative_samples_are_refused_not_reported_ok(serve: Callable[[Handler], str], command: list[str],
                                                      tmp_path: Path) -> None:
    """Whatever else the answers lack, a negative sample is named as such: GPU-hours and utilization cannot be
    negative (a scenario with complete data once came out of showback and capacity with ok: true)."""
    from typer.testing import CliRunner

    from gpushare.cli import app

    url = serve(_negative)
    extra = ["--patch", str(tmp_path / "out.patch")] if command[0] == "capacity" else []
    result = CliRunner().invoke(app, [*command, "--prometheus", url, "--end", "1764600000", "--json", *extra])
    assert result.exit_code == 2, result.output
    document = json.loads(result.stdout)
    assert document["ok"] is False and "negative" in document["errors"][0], document


def test_promotes_range_reads_split_an_answer_above_the_size_bound(serve: Callable[[Handler], str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`promote`'s run-time and coverage reads (finite_times): an answer above the bound is halved and read in
    parts, the times of every part kept, non-finite samples dropped; a single step that is still too large is
    named."""
    monkeypatch.setattr(p, "MAX_ANSWER_BYTES", 200_000)
    asked: list[int] = []

    def answer(h: BaseHTTPRequestHandler, params: dict[str, str]) -> None:
        start, end, step = float(params["start"]), float(params["end"]), int(params["step"])
        steps = int(round((end - start) / step)) + 1
        asked.append(steps)
        pad = "x" * (300_000 if steps > 50 else 0)
        result = [{"metric": {"node": f"n{k}", "pad": pad},
                   "values": [[start + i * step, "NaN" if (k, int(start) // step + i) == (1, 7) else "1"]
                              for i in range(steps)]} for k in range(2)]
        _send(h, json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode())

    url = serve(answer)
    times = p.finite_times(Prometheus(url), "run time", "up", 0, 299 * 60, 60)
    by_node = {dict(k)["node"]: v for k, v in times.items()}
    assert sorted(by_node["n0"]) == [i * 60.0 for i in range(300)]
    assert sorted(by_node["n1"]) == [i * 60.0 for i in range(300) if i != 7]  # its NaN dropped
    assert max(asked) == 300 and min(asked) <= 50

    monkeypatch.setattr(p, "MAX_ANSWER_BYTES", 10)
    with pytest.raises(GpushareError) as err:
        p.finite_times(Prometheus(url), "run time", "up", 0, 0, 60)
    assert "larger than gpushare reads at once" in str(err.value)
