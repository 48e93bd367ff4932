"""The Prometheus HTTP API, the one place that knows it: instant and range queries, series, the server's query
limits, timings, and errors that name the URL and the fix. Also whole-window statistics as Prometheus computes them,
read in chunks the server accepts. Used by capacity, promote, showback and backfill."""

from __future__ import annotations

import http.client
import json
import math
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, TypeAdapter, ValidationError

from gpushare.core.errors import EXCERPT_CHARS, GpushareError, Problem
from gpushare.core.guardrails import duration_seconds
from gpushare.ops.http import Aborted, Client, Refused, TimedOut, TooLarge
from gpushare.ops.timeouts import DEFAULT_TIMEOUT, TIMEOUT_FIX

# One answer's bound: a day of 30 s steps over 5,000 GPUs is about 20 MB of JSON; a larger answer is split like
# one Prometheus refused at its sample limit (read_steps halves it), so memory stays near this per reader.
MAX_ANSWER_BYTES = 32 * 1024 * 1024
# One query's bound, connection to last byte: --timeout (or $GPUSHARE_TIMEOUT), the bound every command that reads a
# server takes. Queries of gpushare's recording rules and day-long chunks answer in seconds; silence or a trickle
# beyond the bound is not a slow query but a server that does not work (a slow one: raise --timeout).
QUERY_SECONDS = DEFAULT_TIMEOUT
# Every query of one command together (capacity's halving retries included).
TOTAL_SECONDS = 900.0
# Every series gpushare reads counts or measures something (GPUs, GPU-hours, ratios, seconds, bytes, errors): none
# is negative, and no finite one reaches this (a timestamp is ~1.8e9, a fleet-year of GPU-hours ~1e8).
MAX_SAMPLE = 1e15

# Prometheus's query limits (the flag that sets each) and the words of its error when a query reaches one.
SERVER_LIMITS = (
    ("--query.max-samples", "too many samples"),
    ("--query.timeout", "query timed out"),
    ("the 11,000 points per series of a range query", "exceeded maximum resolution"),
)


# The longest --window read: a year and a month (Prometheus keeps 15 days by default; long-term stores a year or so).
# Past it the chunked reads alone would take hours, and the window holds nothing gpushare could use.
MAX_WINDOW_SECONDS = 400 * 86400


def check_window(window: str) -> None:
    """A --window that already matched [1-9][0-9]*[smhdw], at most MAX_WINDOW_SECONDS."""
    if len(window) > 12 or duration_seconds(window) > MAX_WINDOW_SECONDS:
        raise GpushareError(Problem(f"--window {window[:40]!r} is longer than {MAX_WINDOW_SECONDS // 86400} days",
                                    fix="use a window the server's retention holds, e.g. 30d"), exit_code=2)


class ServerLimit(GpushareError):
    """A query Prometheus refused at one of its limits: the reader splits it and retries, or names the limit."""

    def __init__(self, flag: str, query: str, detail: str) -> None:
        self.flag, self.query, self.detail = flag, query, detail
        super().__init__(Problem(
            f"Prometheus refused the {query} query at its {flag} limit ({detail})",
            fix=f"raise {flag} on the server, or deploy gpushare's recording rules (and backfill them over older "
                "history with `gpushare capacity --backfill-rules`) so that capacity reads pool-level series"),
            exit_code=2)


class AnswerTooLarge(ServerLimit):
    """An answer above MAX_ANSWER_BYTES: split and retried like a server limit, or named where it cannot be."""

    def __init__(self, query: str, detail: str) -> None:
        self.flag, self.query, self.detail = "the answer-size bound", query, detail
        GpushareError.__init__(self, Problem(
            f"Prometheus's answer to the {query} query is larger than gpushare reads at once ({detail})",
            fix="deploy gpushare's recording rules (and backfill them with `gpushare capacity --backfill-rules`) so "
                "that it reads pool-level series, or shorten --window"), exit_code=2)


def _sample_text(text: str) -> str:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"sample value {text[:40]!r} is not a number") from None
    if math.isnan(value) or value == math.inf:
        # Prometheus's answer where there is nothing to divide, or a quantile in the +Inf bucket: the readers
        # take it as no value (sample_value), never as a number.
        return text
    if value < 0:
        raise ValueError(f"sample value {text[:40]} is negative, which nothing gpushare reads can be")
    if value > MAX_SAMPLE:
        raise ValueError(f"sample value {text[:40]} is above {MAX_SAMPLE:g}, more than any fleet counts")
    return text


class _Strict(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


# [time, "value"]: JSON has no tuples, so the pair itself is read laxly (from a list) and its items strictly.
Sample = Annotated[tuple[Annotated[float, Strict(), Field(allow_inf_nan=False)],
                         Annotated[str, Strict(), AfterValidator(_sample_text)]], Strict(False)]


class _Vector(_Strict):
    metric: dict[str, str] = Field(default_factory=dict)
    value: Sample


class _Matrix(_Strict):
    metric: dict[str, str] = Field(default_factory=dict)
    values: list[Sample]


class _VectorData(_Strict):
    resultType: Literal["vector"]
    result: list[_Vector]


class _MatrixData(_Strict):
    resultType: Literal["matrix"]
    result: list[_Matrix]


class _Answer(_Strict):
    status: Literal["success"]
    data: Any = None


_DATA: dict[str, type[_Strict]] = {"vector": _VectorData, "matrix": _MatrixData}


@dataclass
class QueryTiming:
    name: str
    seconds: float  # what Prometheus reports (evalTotalTime), or wall time where it reports none
    wall: float


class Prometheus:
    """The /api/v1/query and /api/v1/query_range endpoints. Errors name the URL and what to do."""

    def __init__(self, url: str, timeout: float = QUERY_SECONDS, total: float = TOTAL_SECONDS) -> None:
        try:
            parsed = urllib.parse.urlsplit(url)
            ok = parsed.scheme in ("http", "https") and bool(parsed.hostname) and parsed.port != 0
        except ValueError:  # an unclosed IPv6 bracket, a port that is not a number or above 65535
            ok = False
        if not ok:
            raise GpushareError(Problem(f"--prometheus {url[:200]!r} is not an http(s) URL",
                                        fix="give the Prometheus base URL, e.g. http://prometheus:9090"), exit_code=2)
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.deadline = time.monotonic() + total  # for every query of this client together
        self.total = total
        self.timings: list[QueryTiming] = []
        self._client = Client()

    def query(self, name: str, expr: str, at: float) -> list[dict[str, Any]]:
        """One value per series at `at` (an instant vector)."""
        return self._call("query", name, {"query": expr, "time": f"{at:.3f}"}, "vector")

    def query_range(self, name: str, expr: str, start: float, end: float, step: int) -> list[dict[str, Any]]:
        """Values per series every `step` seconds from start to end (a matrix: `values` of [time, text])."""
        return self._call("query_range", name, {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                "step": str(step)}, "matrix")

    def series(self, name: str, selector: str, start: float, end: float) -> list[dict[str, Any]]:
        """The label sets of the series a selector matches between start and end (/api/v1/series): no samples are
        read, so it costs the same at any scrape interval and window. Returned as {"metric": labels} like a query."""
        return self._call("series", name, {"match[]": selector, "start": f"{start:.3f}", "end": f"{end:.3f}"},
                          "series")

    def _call(self, endpoint: str, name: str, params: dict[str, str], result_type: str) -> list[dict[str, Any]]:
        body = urllib.parse.urlencode({**params, "stats": "all"}).encode()
        request = urllib.request.Request(f"{self.url}/api/v1/{endpoint}", data=body, method="POST",
                                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        started = time.perf_counter()
        try:
            raw = self._read(request, name)
        except Refused as exc:
            detail = exc.body[:4096].decode(errors="replace")
            try:
                detail = json.loads(detail).get("error", detail)
            except (ValueError, AttributeError):
                pass
            detail = str(detail)
            flag = next((flag for flag, marker in SERVER_LIMITS if marker in detail), None)
            if flag is not None:
                raise ServerLimit(flag, name, f"{self.url}: {detail[:EXCERPT_CHARS]}") from None
            raise GpushareError(Problem(
                f"Prometheus at {self.url} refused the {name} query: HTTP {exc.code}: {detail[:EXCERPT_CHARS]}",
                fix="check that --prometheus is the Prometheus server's base URL (no /graph or /api path)"),
                exit_code=2) from None
        except TimedOut as exc:
            raise self._timed_out(name, started, exc.received) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            raise GpushareError(Problem(f"cannot reach Prometheus at {self.url}: {reason}",
                                        fix="check --prometheus (scheme, host, port) and that the server is up"),
                                exit_code=2) from None
        wall = time.perf_counter() - started
        try:
            doc = json.loads(raw)
        except RecursionError:
            raise self._wrong(name, "JSON nested deeper than any Prometheus answer") from None
        except ValueError:
            raise GpushareError(Problem(f"{self.url} did not answer like a Prometheus API (no JSON)",
                                        fix="point --prometheus at a Prometheus server"), exit_code=2) from None
        if isinstance(doc, dict) and doc.get("status") == "error":
            raise GpushareError(Problem(f"Prometheus at {self.url}: {str(doc.get('error', doc))[:EXCERPT_CHARS]}",
                                        fix="check the query's series and labels exist on this server"), exit_code=2)
        try:
            data = _Answer.model_validate(doc).data
            if result_type == "series":  # a list of label sets, no stats
                labels = _SERIES.validate_python(data)
                self.timings.append(QueryTiming(name, wall, wall))
                return [{"metric": item} for item in labels]
            if not isinstance(data, dict):
                raise self._wrong(name, f"data is a {type(data).__name__}, not a mapping")
            if data.get("resultType") != result_type:
                raise GpushareError(Problem(f"Prometheus answered the {name} query with {data.get('resultType')}",
                                            fix=f"check that {self.url} is a Prometheus server"), exit_code=2)
            _DATA[result_type].model_validate(data)
        except ValidationError as exc:
            raise self._wrong(name, _first_error(exc)) from None
        stats = data.get("stats")
        reported = ((stats.get("timings") or {}) if isinstance(stats, dict) else {}).get("evalTotalTime")
        seconds = float(reported) if isinstance(reported, (int, float)) and math.isfinite(reported) else wall
        self.timings.append(QueryTiming(name, seconds, wall))
        result: list[dict[str, Any]] = data["result"]
        return result

    def abort(self) -> None:
        """Ctrl-C: every query in flight (in any thread) ends now, and none starts after."""
        self._client.abort()

    def _read(self, request: urllib.request.Request, name: str) -> bytes:
        """The whole answer, within this query's and this client's time bounds and MAX_ANSWER_BYTES: from the
        connection to the last byte (gpushare/ops/http.py), so neither silence nor a trickle of bytes holds it."""
        deadline = min(time.monotonic() + self.timeout, self.deadline)
        if deadline <= time.monotonic():
            raise self._over_total(name)
        try:
            return self._client.fetch(request, deadline, MAX_ANSWER_BYTES)
        except TooLarge:
            raise AnswerTooLarge(name, f"more than {MAX_ANSWER_BYTES} bytes from {self.url}") from None
        except Aborted:
            raise KeyboardInterrupt from None

    def _timed_out(self, name: str, started: float, size: int) -> GpushareError:
        if time.monotonic() >= self.deadline:
            return self._over_total(name)
        waited = time.perf_counter() - started
        got = f"sent {size} bytes of its answer" if size else "sent no answer"
        return GpushareError(Problem(
            f"Prometheus at {self.url} {got} to the {name} query within {waited:.0f} s, gpushare's bound on one "
            f"query (--timeout {self.timeout:g} s, from the connection to the answer's last byte)",
            fix="check that the server is up and not overloaded (its /-/ready page) and that nothing between "
                f"(a proxy, a port-forward) holds the connection open; {TIMEOUT_FIX}"), exit_code=2)

    def _over_total(self, name: str) -> GpushareError:
        return GpushareError(Problem(
            f"the queries to Prometheus at {self.url} took more than {self.total:.0f} s in all, gpushare's bound for "
            f"one command ({len(self.timings)} answered before the {name} query)",
            fix="deploy gpushare's recording rules (and backfill them with `gpushare capacity --backfill-rules`) so "
                "that it reads pool-level series, shorten --window, or check the server's load"), exit_code=2)

    def _wrong(self, name: str, detail: str) -> GpushareError:
        return GpushareError(Problem(f"Prometheus at {self.url} answered the {name} query in a shape its HTTP API "
                                     f"does not have: {detail}",
                                     fix="point --prometheus at a Prometheus server (or one that speaks its API)"),
                             exit_code=2)


_SERIES = TypeAdapter(list[dict[str, str]])


def _first_error(exc: ValidationError) -> str:
    item = exc.errors()[0]
    where = ".".join(str(p) for p in item["loc"] if not (isinstance(p, str) and p.startswith(("function-",
                                                                                               "literal["))))
    return f"{where or 'the answer'}: {item['msg']}"


def sample_value(sample: dict[str, Any]) -> float | None:
    value = float(sample["value"][1])
    return None if math.isnan(value) or math.isinf(value) else value


# ---------------------------------------------------------------- window statistics, read in chunks the server accepts

CHUNK_SECONDS = 86400  # one range query reads at most a day of steps; a refused chunk is halved until it passes
READERS = 4  # chunks in flight at once (Prometheus runs 20 queries at a time by default)
_WINDOW_STAT = re.compile(r"(avg|max|count|quantile)_over_time\((?:([0-9.]+), )?\((.*)\)\[(\w+):(\w+)\]\)", re.S)
Series = dict[tuple[tuple[str, str], ...], list[float]]  # labels -> values at the steps where the series has one


@dataclass(frozen=True)
class WindowStat:
    """`fn_over_time((inner)[window:step])` taken apart: gpushare reads `inner` at the steps and applies `fn`."""

    fn: str  # avg, max, count or quantile
    inner: str
    phi: float = 0.0


def window_stat(expr: str, window: str, step: str) -> WindowStat | None:
    """The statistic and inner expression of a whole-window subquery, or None for any other query."""
    match = _WINDOW_STAT.fullmatch(expr.strip())
    if match is None or (match.group(4), match.group(5)) != (window, step):
        return None
    fn, phi, inner = match.group(1), match.group(2), match.group(3)
    depth = 0
    for char in re.sub(r'"(?:[^"\\]|\\.)*"', '""', inner):  # `(a)[w:s]) or f((b)` is two subqueries, not one
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return None
    if depth or (fn == "quantile") != (phi is not None):
        return None
    return WindowStat(fn, inner, float(phi or 0.0))


def apply_stat(stat: WindowStat, values: list[float]) -> float:
    """What Prometheus's `<fn>_over_time` gives over these values (NaN where it would give NaN)."""
    if stat.fn == "count":
        return float(len(values))
    if stat.fn == "avg":
        return math.fsum(values) / len(values)
    finite = sorted(v for v in values if not math.isnan(v))
    if not finite:
        return math.nan
    if stat.fn == "max":
        return finite[-1]
    rank = stat.phi * (len(finite) - 1)  # Prometheus's quantile: linear between the two closest ranks
    lower = max(0, math.floor(rank))
    upper = min(len(finite) - 1, lower + 1)
    return finite[lower] + (finite[upper] - finite[lower]) * (rank - math.floor(rank))


def window_steps(window: str, step: str, at: float) -> tuple[int, int, int]:
    """(first, last, step) in ms: the steps a `[window:step]` subquery evaluated at `at` reads (aligned to step)."""
    step_ms = duration_seconds(step) * 1000
    at_ms = round(at * 1000)
    first = -(-(at_ms - duration_seconds(window) * 1000) // step_ms) * step_ms
    return first, at_ms // step_ms * step_ms, step_ms


def finite_times(prom: Prometheus, name: str, expr: str, start: float, end: float, step: int
                 ) -> dict[tuple[tuple[str, str], ...], list[float]]:
    """Per series (its sorted labels), the times from start to end (every `step` seconds) at which `expr` had a
    finite value. A range Prometheus refuses at a limit, or whose answer is above MAX_ANSWER_BYTES, is halved and
    read in parts, down to a single step; only the times are kept, so memory follows the series, not the answers."""
    out: dict[tuple[tuple[str, str], ...], list[float]] = {}

    def read(first: float, last: float) -> None:
        try:
            answer = prom.query_range(name, expr, first, last, step)
        except ServerLimit:
            steps = int(round((last - first) / step))
            if steps < 1:
                raise
            middle = first + steps // 2 * step
            read(first, middle)
            read(middle + step, last)
            return
        for series in answer:
            key = tuple(sorted((str(k), str(v)) for k, v in series.get("metric", {}).items()))
            times = out.setdefault(key, [])
            for t, v in series.get("values", []):
                try:
                    value = float(v)
                except (TypeError, ValueError):
                    continue
                if math.isfinite(value):
                    times.append(float(t))

    read(start, end)
    return out


def read_steps(prom: Prometheus, name: str, expr: str, steps: tuple[int, int, int]) -> Series:
    """`expr` at every step from first to last, as range queries of at most CHUNK_SECONDS each, READERS at a time;
    a chunk Prometheus refuses at a limit is halved and retried, down to a single step.

    The readers are threads of their own. A failed chunk stops the others from starting more (those in flight end
    within their bound) and is raised. Ctrl-C ends every read in flight at once (their connections are shut down,
    Prometheus.abort) and is raised without waiting for them: a pool that joined its threads would hold the
    command until each blocked read ran into its timeout."""
    first, last, step_ms = steps
    per_chunk = max(1, CHUNK_SECONDS * 1000 // step_ms)
    chunks = [(s, min(last, s + (per_chunk - 1) * step_ms)) for s in range(first, last + 1, per_chunk * step_ms)]

    def read(chunk: tuple[int, int]) -> list[dict[str, Any]]:
        start, end = chunk
        try:
            return prom.query_range(name, expr, start / 1000, end / 1000, step_ms // 1000)
        except ServerLimit:
            if start == end:
                raise
            middle = start + (end - start) // step_ms // 2 * step_ms
            return read((start, middle)) + read((middle + step_ms, end))

    answers: list[list[dict[str, Any]]] = [[] for _ in chunks]
    failures: list[BaseException] = []
    pending = iter(range(len(chunks)))
    lock = threading.Lock()

    def reader(done: threading.Event) -> None:
        try:
            while True:
                with lock:
                    index = None if failures else next(pending, None)
                if index is None:
                    return
                try:
                    answers[index] = read(chunks[index])
                except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
                    with lock:
                        failures.append(exc)
                    return
        finally:
            done.set()

    # Each reader's end is an Event, waited for (not a join: a Ctrl-C that interrupts Thread.join, in Python 3.11,
    # releases the running thread's own lock, and the interpreter aborts with SIGABRT as that thread ends).
    ends = [threading.Event() for _ in range(min(READERS, len(chunks)))]
    try:
        for done in ends:
            threading.Thread(target=reader, args=(done,), daemon=True, name="gpushare-prometheus-reader").start()
        for done in ends:
            done.wait()
    except BaseException:  # Ctrl-C (KeyboardInterrupt; SIGTERM and SIGHUP are raised as one too)
        prom.abort()
        give_up = time.monotonic() + 1.0
        for done in ends:  # each read ends as its connection is shut down: moments, not its bound
            done.wait(max(0.0, give_up - time.monotonic()))
        raise
    if failures:
        raise failures[0]
    out: Series = {}
    for result in answers:
        for series in result:
            key = tuple(sorted(series.get("metric", {}).items()))
            out.setdefault(key, []).extend(float(v) for _t, v in series["values"])
    return out
