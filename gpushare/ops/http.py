"""HTTP requests that a silent or trickling server cannot hold: each one ends by its deadline, from the connection
to the last byte of the answer, and a Ctrl-C ends every one in flight at once. Used by the Prometheus client and the
AWX client; `--timeout` (or $GPUSHARE_TIMEOUT) sets the deadline of each request for every command that reads a
server (the Kubernetes API reads of `import` and `drift` take the same bound, gpushare/ops/brownfield/live.py).

A socket's own timeout bounds only each wait for bytes, so a server that sends one byte a second would hold a read
for as long as it likes, and http.client reads the status line and headers with no bound of its own. Here every
connection a request opens is registered with its request: a watchdog shuts it down at the deadline (which ends a
read blocked on it in any thread) and the reader lowers the socket's timeout before every read of the answer.
`Client.abort()` shuts down every registered connection at once, which is what Ctrl-C does to the readers of
`capacity` (they run in threads: gpushare/ops/prometheus.py read_steps)."""

from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from typing import Any

ERROR_BODY_BYTES = 64 * 1024  # of an error answer, what is read for its message


class TimedOut(Exception):
    """A request that did not end by its deadline: `received` bytes of its answer came (0: none, not even the
    status line), in `waited` seconds."""

    def __init__(self, received: int, waited: float) -> None:
        super().__init__(f"{received} bytes in {waited:.1f} s")
        self.received, self.waited = received, waited


class Aborted(Exception):
    """A request ended by Client.abort() (Ctrl-C)."""


class TooLarge(Exception):
    """An answer above the request's byte limit."""


@dataclass
class Refused(Exception):
    """An answer with an HTTP error status; `body` is at most ERROR_BODY_BYTES of it."""

    code: int
    reason: str
    body: bytes
    headers: Message = field(default_factory=Message)

    def __str__(self) -> str:
        return f"HTTP {self.code} {self.reason}"


class _Request:
    """One request in flight: its connections and its deadline's watchdog."""

    def __init__(self, client: Client, deadline: float) -> None:
        self.client, self.deadline = client, deadline
        self.sockets: list[socket.socket] = []
        self.expired = False
        self.lock = threading.Lock()
        self.watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), self.expire)
        self.watchdog.daemon = True

    def add(self, sock: socket.socket) -> None:
        with self.lock:
            self.sockets.append(sock)
            ended = self.expired or self.client.aborted
        if ended:
            _shut(sock)

    def expire(self) -> None:
        with self.lock:
            self.expired = True
            sockets = list(self.sockets)
        for sock in sockets:
            _shut(sock)

    def end(self) -> None:
        self.watchdog.cancel()
        with self.lock:
            sockets, self.sockets = self.sockets, []
        for sock in sockets:
            try:
                sock.close()
            except OSError:
                pass


def _shut(sock: socket.socket) -> None:
    """End every read and write on the connection, whatever thread is blocked in one (not a TLS close: the
    socket's own shutdown, which works on a TLS socket's descriptor too)."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


def _connection_class(client: Client, base: type[http.client.HTTPConnection]) -> Any:
    class Tracked(base):  # type: ignore[valid-type, misc]
        def connect(self) -> None:
            super().connect()
            request = client.current()
            if request is not None and self.sock is not None:
                request.add(self.sock)

    return Tracked


class _HTTP(urllib.request.HTTPHandler):
    def __init__(self, client: Client) -> None:
        super().__init__()
        self._class = _connection_class(client, http.client.HTTPConnection)

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._class, req)


class _HTTPS(urllib.request.HTTPSHandler):
    def __init__(self, client: Client) -> None:
        super().__init__()
        self._class = _connection_class(client, http.client.HTTPSConnection)

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._class, req, context=getattr(self, "_context", None))


def _socket_of(response: Any) -> socket.socket | None:
    """The socket under an answer (http.client's response, or the one inside an HTTPError)."""
    for _ in range(3):
        sock = getattr(getattr(response, "fp", None), "raw", None)
        found = getattr(sock, "_sock", None)
        if isinstance(found, socket.socket):
            return found
        response = getattr(response, "fp", None)
        if response is None:
            return None
    return None


class Client:
    """The requests of one command to one server. Each `fetch` ends by its deadline; `abort()` ends all of them (and
    any started later) at once."""

    def __init__(self, *handlers: urllib.request.BaseHandler) -> None:
        self.aborted = False
        self._local = threading.local()
        self._lock = threading.Lock()
        self._requests: set[_Request] = set()
        self._opener = urllib.request.build_opener(*handlers, _HTTP(self), _HTTPS(self))

    def current(self) -> _Request | None:
        request: _Request | None = getattr(self._local, "request", None)
        return request

    def abort(self) -> None:
        """Ctrl-C: every request in flight ends now (its connections shut down), and none starts after."""
        self.aborted = True
        with self._lock:
            requests = list(self._requests)
        for request in requests:
            request.expire()

    def fetch(self, request: urllib.request.Request, deadline: float, limit: int,
              on_open: Callable[[Any], None] | None = None) -> bytes:
        """The whole answer by `deadline` (time.monotonic()), at most `limit` bytes. Raises TimedOut, Aborted,
        TooLarge, Refused (an HTTP error status) or OSError / urllib.error.URLError (no connection); urllib's own
        errors of a redirect handler pass through."""
        if self.aborted:
            raise Aborted
        started = time.monotonic()
        if deadline <= started:
            raise TimedOut(0, 0.0)
        state = _Request(self, deadline)
        self._local.request = state
        with self._lock:
            self._requests.add(state)
        state.watchdog.start()
        try:
            try:
                response = self._opener.open(request, timeout=deadline - started)
            except urllib.error.HTTPError as exc:
                try:
                    body = self._read(exc, state, ERROR_BODY_BYTES, started, truncate=True)
                finally:
                    exc.close()
                raise Refused(exc.code, str(exc.reason), body, exc.headers) from None
            except (OSError, urllib.error.URLError, http.client.HTTPException) as exc:
                self._ended(state, started, 0)
                if isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError):
                    raise TimedOut(0, time.monotonic() - started) from None
                raise
            with response:
                if on_open is not None:
                    on_open(response)
                return self._read(response, state, limit, started)
        finally:
            self._local.request = None
            with self._lock:
                self._requests.discard(state)
            state.end()

    def _ended(self, state: _Request, started: float, received: int) -> None:
        """Raise Aborted or TimedOut where the request was ended from outside; else nothing."""
        if self.aborted:
            raise Aborted
        if state.expired or time.monotonic() >= state.deadline:
            raise TimedOut(received, time.monotonic() - started)

    def _read(self, response: Any, state: _Request, limit: int, started: float, truncate: bool = False) -> bytes:
        sock = _socket_of(response)
        parts: list[bytes] = []
        size = 0
        while True:
            left = state.deadline - time.monotonic()
            if left <= 0:
                self._ended(state, started, size)
            if sock is not None:
                try:
                    sock.settimeout(max(left, 0.001))
                except OSError:
                    pass
            try:
                part = response.read1(1 << 20) if hasattr(response, "read1") else response.read(1 << 20)
            except (OSError, http.client.HTTPException, ValueError, AttributeError) as exc:
                # ValueError / AttributeError: http.client reading a connection shut down under it
                self._ended(state, started, size)
                if isinstance(exc, TimeoutError):  # the socket's timeout, a moment before the watchdog's
                    raise TimedOut(size, time.monotonic() - started) from None
                if truncate:
                    return b"".join(parts)
                raise
            if not part:
                self._ended(state, started, size)  # a shutdown at the deadline reads as the end: not an answer
                return b"".join(parts)
            size += len(part)
            if size > limit:
                if truncate:
                    return b"".join(parts)[:limit]
                raise TooLarge(f"more than {limit} bytes")
            parts.append(part)
