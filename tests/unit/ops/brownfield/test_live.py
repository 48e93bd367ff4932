"""The live path (`--kubeconfig`) through the official Kubernetes Python client, against the fixture data served by
a small API server on 127.0.0.1 that records every request: it gives what the dumps give, and only lists."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.ops.brownfield.helpers import CLUSTERS, ENV, cli

pytest.importorskip("kubernetes")  # the `live` extra; `dev` installs it, so CI runs these

Imported = Callable[[str], tuple[Path, dict[str, Any]]]
# API paths the client lists, and the kind each answers with.
PATHS = {
    "/api/v1/nodes": "Node", "/api/v1/configmaps": "ConfigMap", "/api/v1/resourcequotas": "ResourceQuota",
    "/api/v1/namespaces": "Namespace", "/apis/scheduling.k8s.io/v1/priorityclasses": "PriorityClass",
    "/apis/nvidia.com/v1/clusterpolicies": "ClusterPolicy",
    "/apis/kueue.x-k8s.io/v1beta1/resourceflavors": "ResourceFlavor",
    "/apis/kueue.x-k8s.io/v1beta1/clusterqueues": "ClusterQueue",
    "/apis/kueue.x-k8s.io/v1beta1/localqueues": "LocalQueue",
}


def objects_of(folder: Path) -> dict[str, list[dict[str, Any]]]:
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(folder.glob("*.yaml")):
        for item in yaml.safe_load(path.read_text())["items"]:
            by_kind.setdefault(item["kind"], []).append(item)
    return by_kind


@pytest.fixture
def api_server(tmp_path: Path) -> Iterator[Callable[[str], tuple[Path, list[tuple[str, str]]]]]:
    """Serve a fixture cluster's objects; (kubeconfig, the recorded (method, path) requests)."""
    servers: list[ThreadingHTTPServer] = []

    def start(name: str) -> tuple[Path, list[tuple[str, str]]]:
        objects = objects_of(CLUSTERS / name)
        seen: list[tuple[str, str]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server hook's name
                path = self.path.split("?")[0]
                seen.append(("GET", path))
                kind = PATHS.get(path)
                body = {"kind": f"{kind}List", "apiVersion": "v1", "metadata": {}, "items": objects.get(kind, [])} \
                    if kind else {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404}
                data = json.dumps(body).encode()
                self.send_response(200 if kind else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server_kubeconfig(tmp_path / f"{name}.kubeconfig", server.server_port), seen

    yield start
    for server in servers:
        server.shutdown()


def server_kubeconfig(path: Path, port: int) -> Path:
    """A kubeconfig (context `fixture`, a bearer token) for a plain-HTTP stand-in API server on 127.0.0.1."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fixture",
        "clusters": [{"name": "fixture", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "reader", "user": {"token": "read-only"}}],
        "contexts": [{"name": "fixture", "context": {"cluster": "fixture", "user": "reader"}}]}))
    return path


def without_source(text: str) -> Any:
    data = yaml.safe_load(text)
    data.pop("description", None)
    data.pop("source", None)
    return data


@pytest.mark.parametrize("name", ["timeslicing-mig", "quotas-kueue"])
def test_live_import_equals_the_dump_import(imported: Imported, api_server: Any, tmp_path: Path, name: str) -> None:
    workspace, from_dumps = imported(name)
    kubeconfig, seen = api_server(name)
    live_ws = tmp_path / "live"
    from gpushare.cli.init import write_workspace

    write_workspace(live_ws)
    code, live = cli("import", "--kubeconfig", str(kubeconfig), "--context", "fixture", "--env", ENV,
                     "--out", str(live_ws))
    assert code == 0, live
    assert live["mapping"] == from_dumps["mapping"] and live["unsupported"] == from_dumps["unsupported"]
    assert live["files"] == from_dumps["files"]
    for rel in live["files"]:
        mine = without_source((live_ws / rel).read_text())
        if rel.startswith("environments/"):  # the context it was read through is the only addition
            assert [c.pop("kubeconfig_context") for c in mine["clusters"]] == ["fixture"]
        assert mine == without_source((workspace / rel).read_text()), rel
    assert {method for method, _ in seen} == {"GET"}  # read-only: lists, nothing else
    assert set(PATHS) <= {path for _, path in seen}


def test_live_drift_equals_the_dump_drift(imported: Imported, api_server: Any) -> None:
    imported("timeslicing-mig")
    kubeconfig, seen = api_server("timeslicing-mig")
    code_live, live = cli("drift", "--env", ENV, "--kubeconfig", str(kubeconfig))
    code_dump, dump = cli("drift", "--env", ENV, "--from", str(CLUSTERS / "timeslicing-mig"))
    assert code_live == code_dump == 1
    assert live["drift"] == dump["drift"] and live["pending"] == dump["pending"]


def test_unreachable_api_server_is_a_clear_error(imported: Imported, tmp_path: Path) -> None:
    imported("default-operator")
    kubeconfig = tmp_path / "closed.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "u"}}]}))
    code, out = cli("drift", "--env", ENV, "--kubeconfig", str(kubeconfig))
    assert code == 2 and "cannot reach the API server" in out["errors"][0]
    code, out = cli("drift", "--env", ENV, "--kubeconfig", str(kubeconfig), "--context", "nope")
    assert code == 2 and "unusable kubeconfig" in out["errors"][0]


def test_the_offline_path_never_imports_the_kubernetes_client(tmp_path: Path) -> None:
    from gpushare.cli.init import write_workspace

    write_workspace(tmp_path / "ws")
    program = ("import sys; from gpushare.cli import main\n"
               "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
               "assert 'kubernetes' not in sys.modules, 'the offline path imported kubernetes'\n")
    done = subprocess.run([sys.executable, "-c", program, "import", "--from", str(CLUSTERS / "timeslicing-mig"),
                           "--env", ENV, "--out", str(tmp_path / "ws")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ws" / "environments" / f"{ENV}.yaml").is_file()
