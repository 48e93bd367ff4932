"""The cluster read live through the official Kubernetes Python client (the `live` extra): the same objects the
dumps hold, as `kubectl get -o yaml` would show them. Only list calls: it never writes to the cluster."""

from __future__ import annotations

import math
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpushare.core.errors import GpushareError, Problem
from gpushare.ops.brownfield.cluster import ClusterState, add_objects
from gpushare.ops.brownfield.kubeconfig import load_kubeconfig
from gpushare.ops.timeouts import DEFAULT_TIMEOUT, TIMEOUT_FIX

# (group, versions to try, plural, kind): custom resources; a CRD the cluster lacks is skipped.
CUSTOM = (
    ("nvidia.com", ("v1",), "clusterpolicies", "ClusterPolicy"),
    ("nvidia.com", ("v1alpha1",), "nvidiadrivers", "NVIDIADriver"),
    ("kueue.x-k8s.io", ("v1beta2", "v1beta1"), "resourceflavors", "ResourceFlavor"),
    ("kueue.x-k8s.io", ("v1beta2", "v1beta1"), "clusterqueues", "ClusterQueue"),
    ("kueue.x-k8s.io", ("v1beta2", "v1beta1"), "localqueues", "LocalQueue"),
)


# Time bounds: to connect, for each list call (connection to the last byte of the answer: --timeout, or
# $GPUSHARE_TIMEOUT, the bound every command that reads a server takes), and for the whole read. One list of 5,000
# nodes takes a few seconds on a busy API server; an answer that does not come within these is not coming.
CONNECT_SECONDS = 10.0
CALL_SECONDS = DEFAULT_TIMEOUT
TOTAL_SECONDS = 300.0


# Answers the API server asks to have retried (API Priority and Fairness sends both under load): 429 Too Many
# Requests always, 503 Service Unavailable only with a Retry-After. Each wait is the Retry-After's seconds (1 s where
# it is absent or unparsable, at least 0.1 s so that a 0 does not spin, at most 10 s) and counts against the bounds
# above: a retry whose wait would not end within them is not made, and the read stops.
RETRY_DEFAULT_SECONDS = 1.0
RETRY_MIN_SECONDS = 0.1
RETRY_MAX_SECONDS = 10.0


class _CallTimedOut(Exception):
    """A list call that outlasted its own bound (the whole read's bound is TimeoutError)."""


class _Throttled(Exception):
    """The API server kept answering a list call with 429 (or 503 with a Retry-After) until the next wait would
    pass a bound."""

    def __init__(self, answers: list[str], seconds: float, wait: float, whole: bool) -> None:
        super().__init__(answers[-1])
        self.answers, self.seconds, self.wait, self.whole = answers, seconds, wait, whole


def _retry_after(exc: BaseException) -> float | None:
    """The seconds to wait before retrying the call that raised `exc`, or None where it is not to be retried."""
    status = getattr(exc, "status", None)
    headers = getattr(exc, "headers", None) or {}
    value = next((v for k, v in headers.items() if str(k).lower() == "retry-after"), None)
    if status != 429 and (status != 503 or value is None):
        return None
    try:
        seconds = float(str(value))
    except ValueError:  # absent, or not a number
        return RETRY_DEFAULT_SECONDS
    if not math.isfinite(seconds) or seconds < 0:  # `nan`, `inf`, `-1`: not seconds
        return RETRY_DEFAULT_SECONDS
    return min(max(seconds, RETRY_MIN_SECONDS), RETRY_MAX_SECONDS)


class _Connections:
    """The sockets of the client's connections, registered as each is opened (a connection class of the client's
    urllib3 pools): at a call's bound, or at Ctrl-C, they are shut down, which ends a read blocked on one in the
    call's thread at once. A thread left blocked in a read would hold its socket open until the server answers, and
    one still blocked when the interpreter exits aborts it (SIGABRT instead of exit 2 or 130)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []

    def add(self, sock: Any) -> None:
        if isinstance(sock, socket.socket):
            with self.lock:
                self.sockets = [s for s in self.sockets if s.fileno() != -1]
                self.sockets.append(sock)

    def shut(self) -> None:
        with self.lock:
            sockets = list(self.sockets)
        for sock in sockets:
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)  # a TLS socket's descriptor too, without a TLS close
            except OSError:
                pass

    def track(self, pool_manager: Any) -> None:
        """Make `pool_manager` (urllib3's, under the Kubernetes client) open its connections through classes that
        register their sockets here."""
        from urllib3.connection import HTTPConnection, HTTPSConnection
        from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

        connections = self

        class Tracked(HTTPConnection):
            def connect(self) -> None:
                super().connect()
                connections.add(self.sock)

        class TrackedTLS(HTTPSConnection):
            def connect(self) -> None:
                super().connect()
                connections.add(self.sock)

        class Pool(HTTPConnectionPool):
            ConnectionCls = Tracked

        class PoolTLS(HTTPSConnectionPool):
            ConnectionCls = TrackedTLS

        pool_manager.pool_classes_by_scheme = {"http": Pool, "https": PoolTLS}
        pool_manager.clear()


class _Clock:
    """Each list call within its own bound, cut to what is left of the whole read's, retries included."""

    def __init__(self, total: float, call: float, api_error: type[Exception], say: Callable[[str], None],
                 connections: _Connections) -> None:
        self.deadline = time.monotonic() + total
        self.total = total
        self.bound = call
        self.api_error = api_error
        self.say = say
        self.connections = connections

    def call(self, api: Any, what: str, call: Callable[..., Any], *args: Any) -> Any:
        """`call(*args)`, retried while the API server asks for it (429, or 503 with a Retry-After) after the wait
        it asks for; the attempts and the waits between them all within the call's bound and the whole read's."""
        started = time.monotonic()
        deadline = min(started + self.bound, self.deadline)
        answers: list[str] = []
        while True:
            try:
                return self._once(api, deadline, call, *args)
            except self.api_error as exc:
                wait = _retry_after(exc)
                if wait is None:
                    raise
                answers.append(f"{getattr(exc, 'status', '')} {getattr(exc, 'reason', '') or ''}".strip())
                now = time.monotonic()
                if now + wait >= deadline:
                    raise _Throttled(answers, now - started, wait, deadline >= self.deadline) from None
                self.say(f"gpushare: the API server answered {answers[-1]} to {what}; waiting {wait:g} s before "
                         f"retry {len(answers)}")
                time.sleep(wait)

    def _once(self, api: Any, deadline: float, call: Callable[..., Any], *args: Any) -> Any:
        """`call(*args)` once, ending by `deadline`. The client's read timeout bounds each wait for bytes, so a
        server that trickles an answer would hold a call for as long as it likes: the call runs in a thread, and
        past its bound, or at Ctrl-C, the client's connections are shut down (which ends that thread's read at once)
        and it times out."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError if time.monotonic() >= self.deadline else _CallTimedOut
        timeout = (min(CONNECT_SECONDS, left), left)
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def run() -> None:
            try:
                outcome["value"] = call(*args, _request_timeout=timeout)
            except BaseException as exc:  # handed to the caller's thread
                outcome["error"] = exc
            finally:
                done.set()

        worker = threading.Thread(target=run, daemon=True, name="gpushare-kube-list")
        worker.start()
        # Waited for on an Event, not by joining the thread: a Ctrl-C that interrupts Thread.join (Python 3.11)
        # releases the running thread's own lock, and the interpreter then aborts (SIGABRT) as the thread ends.
        try:
            finished = done.wait(timeout[1])  # the call bound runs from the connection to the whole answer
        except BaseException:  # Ctrl-C (KeyboardInterrupt), or SIGTERM raised as one: end the read, then go
            self._end(api, worker, done)
            raise
        if not finished:
            self._end(api, worker, done)
            raise TimeoutError if time.monotonic() >= self.deadline else _CallTimedOut
        worker.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def _end(self, api: Any, worker: threading.Thread, done: threading.Event) -> None:
        """The call's read ended from here: its connection shut down, the pool emptied, the thread given a moment to
        see it (it raises in the thread, which nobody reads) and to end, so that none is left reading when the
        interpreter exits."""
        self.connections.shut()
        api.rest_client.pool_manager.clear()
        if done.wait(2.0):
            worker.join(0.5)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def read_live(kubeconfig: Path, context: str | None, total: float = TOTAL_SECONDS,
              say: Callable[[str], None] = _to_stderr, timeout: float | None = None) -> ClusterState:
    """The cluster's objects, read by list calls within the bounds above (`timeout`, each list call's, is
    --timeout; CALL_SECONDS where not given); `say` hears each retry (stderr)."""
    bound = CALL_SECONDS if timeout is None else timeout
    try:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException
        from kubernetes.config.config_exception import ConfigException
        from urllib3.exceptions import HTTPError, MaxRetryError, NewConnectionError
        from urllib3.exceptions import TimeoutError as TimeoutErrors
    except ImportError:
        raise GpushareError(Problem("--kubeconfig needs the Kubernetes Python client, which is not installed",
                                    path="--kubeconfig", fix="pip install 'gpushare[live]', or dump the objects "
                                    "with kubectl and pass --from DIR (docs/adoption.md)"), exit_code=2) from None
    if not kubeconfig.is_file():
        raise GpushareError(Problem("file not found", file=str(kubeconfig), path="--kubeconfig",
                                    fix="give the cluster's kubeconfig"), exit_code=2)
    try:
        settings = client.Configuration()
        load_kubeconfig(kubeconfig, context, settings, persist_config=False)  # not a kubeconfig: exit 2
        # No retries inside a call: urllib3 would repeat a timed-out list three times, past every bound below.
        settings.retries = False
        api = client.ApiClient(settings)
        connections = _Connections()
        connections.track(api.rest_client.pool_manager)
    except ConfigException as exc:
        raise GpushareError(Problem(f"unusable kubeconfig: {exc}", file=str(kubeconfig), path="--context",
                                    fix="check the file and the context name (kubectl config get-contexts)"),
                            exit_code=2) from None
    state = ClusterState(source=f"{kubeconfig}" + (f" (context {context})" if context else ""))
    core, scheduling, custom = client.CoreV1Api(api), client.SchedulingV1Api(api), client.CustomObjectsApi(api)
    typed = ((core.list_node, "Node"), (core.list_config_map_for_all_namespaces, "ConfigMap"),
             (core.list_resource_quota_for_all_namespaces, "ResourceQuota"), (core.list_namespace, "Namespace"),
             (scheduling.list_priority_class, "PriorityClass"))
    clock = _Clock(total, bound, ApiException, say, connections)
    listing = "the API server"
    try:
        for call, kind in typed:
            listing = f"the list of {kind}s"
            items = [api.sanitize_for_serialization(item) for item in clock.call(api, listing, call).items]
            add_objects(state, {"kind": "List", "items": [{"kind": kind, **i} for i in items]}, state.source)
        for group, versions, plural, kind in CUSTOM:
            listing = f"the list of {kind}s"
            items = _custom(api, custom, group, versions, plural, ApiException, clock, listing)
            add_objects(state, {"kind": "List", "items": [{"kind": kind, **i} for i in items]}, state.source)
    except NewConnectionError:  # urllib3 makes it a timeout too, but the server refused or is not there
        raise GpushareError(Problem("cannot reach the API server: NewConnectionError", file=state.source,
                                    fix="check the kubeconfig's server address and your network"),
                            exit_code=2) from None
    except (TimeoutError, TimeoutErrors, _CallTimedOut) as exc:
        said = (f"the whole read's bound of {total:.0f} s" if time.monotonic() >= clock.deadline or
                isinstance(exc, TimeoutError) else f"the bound of {min(CONNECT_SECONDS, bound):g} s to connect and "
                f"{bound:g} s per list call (--timeout)")
        raise GpushareError(Problem(f"the API server did not answer {listing} within {said}", file=state.source,
                                    fix="check that the kubeconfig's server is the cluster's API server and that it "
                                        "answers (kubectl get nodes), or dump the objects with kubectl and pass "
                                        f"--from DIR (docs/adoption.md); {TIMEOUT_FIX}"), exit_code=2) from None
    except _Throttled as exc:
        said = (f"the whole read's bound of {total:g} s" if exc.whole else
                f"the bound of {bound:g} s per list call")
        kinds, times = " and ".join(dict.fromkeys(exc.answers)), len(exc.answers)
        raise GpushareError(Problem(f"the API server kept answering {kinds} to {listing}: {times} "
                                    f"time{'s' if times > 1 else ''} in {exc.seconds:.1f} s ({times - 1} "
                                    f"retr{'ies' if times != 2 else 'y'}), and the next wait of {exc.wait:g} s "
                                    f"would pass {said}", file=state.source,
                                    fix="the API server is overloaded, or its API Priority and Fairness limits "
                                        "throttle this user: retry later, or raise the share of the priority level "
                                        "this user's FlowSchema maps it to (kubectl get flowschemas,"
                                        "prioritylevelconfigurations)"), exit_code=2) from None
    except ApiException as exc:
        failed = isinstance(exc.status, int) and exc.status >= 500  # a 503 with a Retry-After was retried above
        raise GpushareError(Problem(f"the API server answered {exc.status} {exc.reason}", file=state.source,
                                    fix="the API server failed: check that it is healthy (kubectl get --raw "
                                        "/readyz?verbose) and retry later" if failed else
                                        "check that the context may list nodes, configmaps, resourcequotas, "
                                        "namespaces and priorityclasses (read-only access suffices)"),
                            exit_code=2) from None
    except ValueError as exc:  # the client's models refused an answer (pydantic's ValidationError is a ValueError)
        first = str(exc).splitlines()[0][:200]
        raise GpushareError(Problem(f"the API server's answer does not fit the client's schema: {first}",
                                    file=state.source, fix="use a kubernetes client that matches the cluster's "
                                    "minor (pip install 'gpushare[live]')"), exit_code=2) from None
    except MaxRetryError as exc:
        raise GpushareError(Problem(f"cannot reach the API server: {type(exc.reason).__name__}", file=state.source,
                                    fix="check the kubeconfig's server address and your network"),
                            exit_code=2) from None
    except (OSError, HTTPError) as exc:
        raise GpushareError(Problem(f"cannot reach the API server: {type(exc).__name__}", file=state.source,
                                    fix="check the kubeconfig's server address and your network"),
                            exit_code=2) from None
    return state


def _custom(api: Any, custom: Any, group: str, versions: tuple[str, ...], plural: str, not_found: type[Exception],
            clock: _Clock, listing: str) -> list[dict[str, Any]]:
    for version in versions:
        try:
            answer = clock.call(api, listing, custom.list_cluster_custom_object, group, version, plural)
        except not_found as exc:
            if getattr(exc, "status", None) == 404:
                continue
            raise
        return list(answer.get("items") or [])
    return []
