"""The cluster read live through the official Kubernetes Python client (the `live` extra): the same objects the
dumps hold, as `kubectl get -o yaml` would show them. Only list calls: it never writes to the cluster."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpushare.core.errors import GpushareError, Problem
from gpushare.ops.brownfield.cluster import ClusterState, add_objects

# (group, versions to try, plural, kind): custom resources; a CRD the cluster lacks is skipped.
CUSTOM = (
    ("nvidia.com", ("v1",), "clusterpolicies", "ClusterPolicy"),
    ("nvidia.com", ("v1alpha1",), "nvidiadrivers", "NVIDIADriver"),
    ("kueue.x-k8s.io", ("v1beta2", "v1beta1"), "resourceflavors", "ResourceFlavor"),
    ("kueue.x-k8s.io", ("v1beta2", "v1beta1"), "clusterqueues", "ClusterQueue"),
    ("kueue.x-k8s.io", ("v1beta2", "v1beta1"), "localqueues", "LocalQueue"),
)


# Time bounds: to connect, for each list call (connection to answer), and for the whole read. One list of 5,000 nodes
# takes a few seconds on a busy API server; an answer that does not come within these is not coming.
CONNECT_SECONDS = 10.0
CALL_SECONDS = 120.0
TOTAL_SECONDS = 300.0


class _CallTimedOut(Exception):
    """A list call that outlasted its own bound (the whole read's bound is TimeoutError)."""


class _Clock:
    """The request timeout for the next call: its own bound, cut to what is left of the whole read's."""

    def __init__(self, total: float) -> None:
        self.deadline = time.monotonic() + total
        self.total = total

    def timeout(self) -> tuple[float, float]:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        return min(CONNECT_SECONDS, left), min(CALL_SECONDS, left)

    def call(self, api: Any, call: Callable[..., Any], *args: Any) -> Any:
        """`call(*args)` within its bound in total. The client's read timeout bounds each wait for bytes, so a
        server that trickles an answer would hold a call for as long as it likes: the call runs in a thread, and
        past its bound the client's connections are closed (which ends that thread's read) and it times out."""
        timeout = self.timeout()
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["value"] = call(*args, _request_timeout=timeout)
            except BaseException as exc:  # handed to the caller's thread
                outcome["error"] = exc

        worker = threading.Thread(target=run, daemon=True, name="gpushare-kube-list")
        worker.start()
        worker.join(timeout[1])  # the call bound runs from the connection to the whole answer
        if worker.is_alive():
            api.rest_client.pool_manager.clear()
            raise TimeoutError if time.monotonic() >= self.deadline else _CallTimedOut
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]


def read_live(kubeconfig: Path, context: str | None, total: float = TOTAL_SECONDS) -> ClusterState:
    try:
        from kubernetes import client, config
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
        config.load_kube_config(config_file=str(kubeconfig), context=context, client_configuration=settings,
                                persist_config=False)
        # No retries inside a call: urllib3 would repeat a timed-out list three times, past every bound below.
        settings.retries = False
        api = client.ApiClient(settings)
    except ConfigException as exc:
        raise GpushareError(Problem(f"unusable kubeconfig: {exc}", file=str(kubeconfig), path="--context",
                                    fix="check the file and the context name (kubectl config get-contexts)"),
                            exit_code=2) from None
    state = ClusterState(source=f"{kubeconfig}" + (f" (context {context})" if context else ""))
    core, scheduling, custom = client.CoreV1Api(api), client.SchedulingV1Api(api), client.CustomObjectsApi(api)
    typed = ((core.list_node, "Node"), (core.list_config_map_for_all_namespaces, "ConfigMap"),
             (core.list_resource_quota_for_all_namespaces, "ResourceQuota"), (core.list_namespace, "Namespace"),
             (scheduling.list_priority_class, "PriorityClass"))
    clock = _Clock(total)
    listing = "the API server"
    try:
        for call, kind in typed:
            listing = f"the list of {kind}s"
            items = [api.sanitize_for_serialization(item) for item in clock.call(api, call).items]
            add_objects(state, {"kind": "List", "items": [{"kind": kind, **i} for i in items]}, state.source)
        for group, versions, plural, kind in CUSTOM:
            listing = f"the list of {kind}s"
            items = _custom(api, custom, group, versions, plural, ApiException, clock)
            add_objects(state, {"kind": "List", "items": [{"kind": kind, **i} for i in items]}, state.source)
    except NewConnectionError:  # urllib3 makes it a timeout too, but the server refused or is not there
        raise GpushareError(Problem("cannot reach the API server: NewConnectionError", file=state.source,
                                    fix="check the kubeconfig's server address and your network"),
                            exit_code=2) from None
    except (TimeoutError, TimeoutErrors, _CallTimedOut) as exc:
        bound = (f"the whole read's bound of {total:.0f} s" if time.monotonic() >= clock.deadline or
                 isinstance(exc, TimeoutError) else f"the bound of {CONNECT_SECONDS:.0f} s to connect and "
                 f"{CALL_SECONDS:.0f} s per list call")
        raise GpushareError(Problem(f"the API server did not answer {listing} within {bound}", file=state.source,
                                    fix="check that the kubeconfig's server is the cluster's API server and that it "
                                        "answers (kubectl get nodes), or dump the objects with kubectl and pass "
                                        "--from DIR (docs/adoption.md)"), exit_code=2) from None
    except ApiException as exc:
        raise GpushareError(Problem(f"the API server answered {exc.status} {exc.reason}", file=state.source,
                                    fix="check that the context may list nodes, configmaps, resourcequotas, "
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
            clock: _Clock) -> list[dict[str, Any]]:
    for version in versions:
        try:
            answer = clock.call(api, custom.list_cluster_custom_object, group, version, plural)
        except not_found as exc:
            if getattr(exc, "status", None) == 404:
                continue
            raise
        return list(answer.get("items") or [])
    return []
