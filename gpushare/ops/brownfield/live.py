"""The cluster read live through the official Kubernetes Python client (the `live` extra): the same objects the
dumps hold, as `kubectl get -o yaml` would show them. Only list calls: it never writes to the cluster."""

from __future__ import annotations

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


def read_live(kubeconfig: Path, context: str | None) -> ClusterState:
    try:
        from kubernetes import client, config
        from kubernetes.client.exceptions import ApiException
        from kubernetes.config.config_exception import ConfigException
        from urllib3.exceptions import HTTPError
    except ImportError:
        raise GpushareError(Problem("--kubeconfig needs the Kubernetes Python client, which is not installed",
                                    path="--kubeconfig", fix="pip install 'gpushare[live]', or dump the objects "
                                    "with kubectl and pass --from DIR (docs/adoption.md)"), exit_code=2) from None
    if not kubeconfig.is_file():
        raise GpushareError(Problem("file not found", file=str(kubeconfig), path="--kubeconfig",
                                    fix="give the cluster's kubeconfig"), exit_code=2)
    try:
        api = config.new_client_from_config(config_file=str(kubeconfig), context=context)
    except ConfigException as exc:
        raise GpushareError(Problem(f"unusable kubeconfig: {exc}", file=str(kubeconfig), path="--context",
                                    fix="check the file and the context name (kubectl config get-contexts)"),
                            exit_code=2) from None
    state = ClusterState(source=f"{kubeconfig}" + (f" (context {context})" if context else ""))
    core, scheduling, custom = client.CoreV1Api(api), client.SchedulingV1Api(api), client.CustomObjectsApi(api)
    typed = ((core.list_node, "Node"), (core.list_config_map_for_all_namespaces, "ConfigMap"),
             (core.list_resource_quota_for_all_namespaces, "ResourceQuota"), (core.list_namespace, "Namespace"),
             (scheduling.list_priority_class, "PriorityClass"))
    try:
        for call, kind in typed:
            items = [api.sanitize_for_serialization(item) for item in call().items]
            add_objects(state, {"kind": "List", "items": [{"kind": kind, **i} for i in items]}, state.source)
        for group, versions, plural, kind in CUSTOM:
            items = _custom(custom, group, versions, plural, ApiException)
            add_objects(state, {"kind": "List", "items": [{"kind": kind, **i} for i in items]}, state.source)
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
    except (OSError, HTTPError) as exc:
        raise GpushareError(Problem(f"cannot reach the API server: {type(exc).__name__}", file=state.source,
                                    fix="check the kubeconfig's server address and your network"),
                            exit_code=2) from None
    return state


def _custom(custom: Any, group: str, versions: tuple[str, ...], plural: str, not_found: type[Exception]
            ) -> list[dict[str, Any]]:
    for version in versions:
        try:
            answer = custom.list_cluster_custom_object(group, version, plural)
        except not_found as exc:
            if getattr(exc, "status", None) == 404:
                continue
            raise
        return list(answer.get("items") or [])
    return []
