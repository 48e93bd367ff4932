"""A small client over the official Kubernetes Python client for the control-plane tests: server-side apply of
manifests as written, requests as a tenant's ServiceAccount (a real token from the TokenRequest API), and the
server's whole answer (status, the denying message, every Warning header), which the generated API hides."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from kubernetes import client, config
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError

FIELD_MANAGER = "gpushare"


@dataclass
class Answer:
    """What the API server said to one request."""

    status: int
    body: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    @property
    def allowed(self) -> bool:
        return 200 <= self.status < 300

    @property
    def message(self) -> str:
        return str(self.body.get("message", "")) if not self.allowed else ""


def _warnings(headers: Any) -> list[str]:
    """Warning headers (RFC 7234: `299 - "text"`), one entry per warning."""
    if not headers:
        return []
    values = headers.getlist("Warning") if hasattr(headers, "getlist") else [
        v for k, v in headers.items() if k.lower() == "warning"]
    out: list[str] = []
    for value in values:
        for part in value.split(", 299 "):  # urllib3 joins repeated headers with ", "
            part = part.removeprefix("299 ").removeprefix("- ").strip()
            out.append(part.strip('"').replace('\\"', '"'))
    return out


class Kube:
    def __init__(self, kubeconfig: Path, token: str | None = None,
                 impersonate: str | None = None, impersonate_group: str | None = None) -> None:
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        # Discovery (which resource serves a kind: metadata, no object) goes as the admin, so a ServiceAccount's
        # client finds a custom resource without the discovery rights of its own; every request carries the token.
        discovery = client.ApiClient(configuration)
        if token is not None:  # the same server and CA, a ServiceAccount's identity instead of the admin's
            configuration = copy.copy(configuration)
            configuration.cert_file = configuration.key_file = None
            configuration.api_key = {}
        self.token = token
        self.impersonate = impersonate  # a user name, sent by the admin: identities no token can be had for
        self.impersonate_group = impersonate_group  # and a group for it (one: the header takes one value here)
        self.kubeconfig = kubeconfig
        self.api = client.ApiClient(configuration)
        self.dynamic = DynamicClient(discovery)

    # ---------------------------------------------------------------- discovery and raw requests

    def resource(self, api_version: str, kind: str) -> Any:
        for attempt in range(20):  # a CRD applied a moment ago may not be served yet
            try:
                return self.dynamic.resources.get(api_version=api_version, kind=kind)
            except ResourceNotFoundError:
                if attempt == 19:
                    raise
                self.dynamic.resources.invalidate_cache()
                time.sleep(0.5)
        raise AssertionError("unreachable")

    def path(self, obj: dict[str, Any], name: bool = True, subresource: str = "") -> str:
        res = self.resource(obj["apiVersion"], obj["kind"])
        meta = obj.get("metadata", {})
        namespace = meta.get("namespace") if res.namespaced else None
        path = str(res.path(name=meta.get("name") if name else None, namespace=namespace))
        return f"{path}/{subresource}" if subresource else path

    def request(self, method: str, path: str, body: Any = None, query: Iterable[tuple[str, str]] = (),
                content_type: str = "application/json") -> Answer:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.impersonate is not None:
            # the API server adds the groups of the user (a ServiceAccount's, system:authenticated) itself
            headers["Impersonate-User"] = self.impersonate
        if self.impersonate_group is not None:
            headers["Impersonate-Group"] = self.impersonate_group
        url = self.api.configuration.host + path + (f"?{urlencode(list(query))}" if query else "")
        response = self.api.call_api(method, url, header_params=headers, body=body, _request_timeout=60)
        data = response.read()
        try:
            parsed = json.loads(data) if data else {}
        except ValueError:
            parsed = {"message": data.decode(errors="replace")}
        return Answer(response.status, parsed, _warnings(response.headers))

    # ---------------------------------------------------------------- verbs

    def apply(self, obj: dict[str, Any], manager: str = FIELD_MANAGER, dry_run: bool = False,
              force: bool = True, subresource: str = "") -> Answer:
        """Server-side apply of the object exactly as written (PATCH application/apply-patch+yaml)."""
        query = [("fieldManager", manager), ("force", "true" if force else "false")]
        if dry_run:
            query.append(("dryRun", "All"))
        return self.request("PATCH", self.path(obj, subresource=subresource), obj, query,
                            "application/apply-patch+yaml")

    def create(self, obj: dict[str, Any], dry_run: bool = True) -> Answer:
        return self.request("POST", self.path(obj, name=False), obj, [("dryRun", "All")] if dry_run else [])

    def update(self, obj: dict[str, Any], subresource: str = "", dry_run: bool = True) -> Answer:
        return self.request("PUT", self.path(obj, subresource=subresource), obj,
                            [("dryRun", "All")] if dry_run else [])

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        res = self.resource(api_version, kind)
        answer = self.request("GET", str(res.path(name=name, namespace=namespace if res.namespaced else None)))
        return answer.body if answer.allowed else None

    def list(self, api_version: str, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        res = self.resource(api_version, kind)
        answer = self.request("GET", str(res.path(namespace=namespace)))
        assert answer.allowed, answer.body
        return list(answer.body.get("items", []))

    def delete(self, obj: dict[str, Any]) -> Answer:
        return self.request("DELETE", self.path(obj))

    def service_account_token(self, namespace: str, service_account: str) -> str:
        """A real token for the ServiceAccount (TokenRequest), as a pod or CI job of the tenant would hold."""
        core = client.CoreV1Api(self.api)
        request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=["https://kubernetes.default.svc.cluster.local"], expiration_seconds=3600))
        answer = core.create_namespaced_service_account_token(service_account, namespace, request)
        return str(answer.status.token)

    def as_user(self, user: str) -> Kube:
        """The admin acting as another user (impersonation): for identities such as the controller manager's."""
        return Kube(self.kubeconfig, impersonate=user)

    def patch(self, obj: dict[str, Any], operations: list[dict[str, Any]], subresource: str = "",
              dry_run: bool = True) -> Answer:
        """A JSON patch (RFC 6902) of the stored object."""
        return self.request("PATCH", self.path(obj, subresource=subresource), operations,
                            [("dryRun", "All")] if dry_run else [], "application/json-patch+json")

    def as_service_account(self, namespace: str, name: str) -> Kube:
        return Kube(self.kubeconfig, token=self.service_account_token(namespace, name))


def eventually(check: Callable[[], Any], timeout: float = 60.0, every: float = 0.5, what: str = "") -> Any:
    """The first truthy result of `check` within `timeout` seconds, or an AssertionError with the last one."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what or check}; last: {last!r}")
        time.sleep(every)
