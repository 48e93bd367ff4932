"""What every controller manager the tests run as a local process needs from the test cluster (Kueue's in
tests/cluster/kueue.py, JobSet's in tests/cluster/jobset.py): its own install manifest applied (CRDs first, each
Established before anything uses it), its webhooks reached at https://127.0.0.1:<port> instead of a Service, and a
kubeconfig holding a real token of its own ServiceAccount, so the API server, and gpushare's admission policies,
see the identity the Deployment would have."""

from __future__ import annotations

import base64
import copy
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.controlplane import Cluster, Process
from tests.cluster.kube import Kube, eventually

WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
AUDIENCE = "https://kubernetes.default.svc.cluster.local"  # the test API server's issuer and default audience


def url_config(client_config: dict[str, Any], base: str, ca_bundle: str) -> dict[str, Any]:
    """A webhook's clientConfig pointed at `base` (https://127.0.0.1:port), the Service's path kept."""
    path = client_config.get("service", {}).get("path", "")
    return {"url": f"{base}{path}", "caBundle": ca_bundle}


def localised(obj: dict[str, Any], base: str, ca_bundle: str) -> dict[str, Any]:
    """An object of a controller's manifest with every webhook (admission and CRD conversion) reached at `base`."""
    obj = copy.deepcopy(obj)
    if obj["kind"] in WEBHOOK_KINDS:
        for webhook in obj["webhooks"]:
            webhook["clientConfig"] = url_config(webhook["clientConfig"], base, ca_bundle)
    elif obj["kind"] == "CustomResourceDefinition":
        conversion = obj["spec"].get("conversion", {})
        if conversion.get("strategy") == "Webhook":
            conversion["webhook"]["clientConfig"] = url_config(conversion["webhook"]["clientConfig"], base, ca_bundle)
    return obj


def ca_bundle(cluster: Cluster) -> str:
    return base64.b64encode(Path(cluster.pki.path("ca.crt")).read_bytes()).decode()


def apply_manifest(kube: Kube, objects: Iterable[dict[str, Any]], manager: str) -> None:
    """Apply a controller's objects, CRDs first, and wait until each CRD is Established."""
    # A CRD written with an empty status (as kustomize leaves JobSet's) would clear what the API server sets.
    objects = [{k: v for k, v in o.items() if not (o["kind"] == "CustomResourceDefinition" and k == "status")}
               for o in objects]
    for obj in sorted(objects, key=lambda o: o["kind"] != "CustomResourceDefinition"):
        answer = kube.apply(obj, manager=manager)
        assert answer.allowed, f"{obj['kind']} {obj['metadata']['name']}: {answer.message}"
    for crd in (o for o in objects if o["kind"] == "CustomResourceDefinition"):
        name = crd["metadata"]["name"]
        eventually(lambda name=name: any(
            c["type"] == "Established" and c["status"] == "True" for c in
            (kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name) or {})
            .get("status", {}).get("conditions") or []), what=f"CRD {name} established")
    kube.dynamic.resources.invalidate_cache()


def service_account_token(kube: Kube, namespace: str, name: str, seconds: int = 86400) -> str:
    """A TokenRequest token valid for a whole test session (the controller holds it for as long as it runs)."""
    answer = kube.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": [AUDIENCE], "expirationSeconds": seconds}})
    assert answer.allowed, answer.message
    return str(answer.body["status"]["token"])


def write_kubeconfig(path: Path, cluster: Cluster, kube: Kube, namespace: str, service_account: str) -> None:
    """A kubeconfig for the ServiceAccount `namespace/service_account` (a real token of it) on the test cluster."""
    token = service_account_token(kube, namespace, service_account)
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": service_account,
        "clusters": [{"name": "test", "cluster": {"server": cluster.server,
                                                  "certificate-authority": cluster.pki.path("ca.crt")}}],
        "users": [{"name": service_account, "user": {"token": token}}],
        "contexts": [{"name": service_account, "context": {"cluster": "test", "user": service_account}}]}))


def ready(health_port: int) -> bool:
    """The controller manager's /readyz on its health port answers 200."""
    with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz", timeout=3) as answer:
        return bool(answer.status == 200)


def exited(name: str, process: Process | None) -> str:
    """'' while the process runs (or was never started), else its exit status and the end of its log."""
    if process is None or process.popen.poll() is None:
        return ""
    return f"{name} exited with {process.popen.returncode}:\n{process.tail(60)}"


def stop(kube: Kube, manifest: Iterable[dict[str, Any]], process: Process | None) -> None:
    """The controller's webhooks first (they fail closed: without it no object they match could be made), then
    the process the fixture started, by its PID."""
    for obj in manifest:
        if obj["kind"] in WEBHOOK_KINDS:
            kube.delete(obj)
    if process is not None:
        process.stop()
