"""The real Pulumi engine against the test control plane: the CLI and the Kubernetes provider built from their Go
modules (tools/gobuild.sh pulumi, pulumi-kubernetes; `make testbins`), a local file backend, a passphrase secrets
provider, no update checks and no plugin downloads. Each test gets a workspace of its own (a copy of this one's
files) whose stack names the test API servers' kubeconfig contexts and the charts on disk."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import bins
from tests.cluster.bins import ROOT

# program -> (its versions.env key, the binary)
PROGRAMS = {"pulumi": ("PULUMI_VERSION", "pulumi"),
            "pulumi-kubernetes": ("PULUMI_KUBERNETES_VERSION", "pulumi-resource-kubernetes")}
# The charts of ../shared/charts (their README names the sources), by gpushare:localCharts key. Each is linked under
# the chart's own name: gpushare's rules know the operator's release by a chart ending in gpu-operator.
SHARED_CHARTS = ROOT.parent / "shared" / "charts"
CHARTS = {"gpu-operator": "gpu-operator-v26.7.0", "dra-driver": "dra-driver-nvidia-gpu-95932046",
          "kube-prometheus-stack": "kube-prometheus-stack-88.5.3", "kueue": "kueue-0.19.2"}
# The workspace's files a stack reads (examples/ for the DRA environment); links into the package are copied.
WORKSPACE_FILES = ("gpushare.yaml", "Pulumi.yaml", "infra", "environments", "profiles", "policies", "examples")
PASSPHRASE = "gpushare-tests"


def find() -> tuple[dict[str, Path] | None, str]:
    """The built CLI and provider, or None and why not."""
    found: dict[str, Path] = {}
    for program, (key, binary) in PROGRAMS.items():
        folder = bins.cache_dir() / f"{program}-{bins.versions()[key]}"
        if not ((folder / ".built").exists() and (folder / binary).exists()):
            return None, f"{binary} not built ({folder}); run `make pulumi-bins` (Go and the module proxy)"
        found[program] = folder / binary
    return found, ""


def local_charts(folder: Path) -> dict[str, str] | None:
    """The shared charts linked under their chart names in `folder`; None where ../shared/charts is absent."""
    if not SHARED_CHARTS.is_dir():
        return None
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for key, name in CHARTS.items():
        link = folder / key
        if not link.exists():
            link.symlink_to(SHARED_CHARTS / name, target_is_directory=True)
        out[key] = str(link)
    return out


def built_tools() -> dict[str, Path]:
    """The CLI and provider `make test` builds (tools/run_tests.sh); missing, a failure where Go is, a skip only
    without Go, as for the control plane's binaries."""
    from tests.cluster.conftest import built_or_fail

    return built_or_fail(*find())


def charts_or_skip(folder: Path) -> dict[str, str]:
    import pytest

    found = local_charts(folder)
    if found is None:
        pytest.skip(f"the charts are not on this machine ({SHARED_CHARTS}): a real `pulumi up` installs them from "
                    "disk, as these machines reach no chart registry")
    return found


@dataclass
class Answer:
    op: str
    result: str
    changes: dict[str, int]
    output: str
    seconds: float
    resources: list[dict[str, Any]]
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.result == "succeeded"

    def changed(self) -> dict[str, int]:
        """Operations other than `same`: what the engine did or would do."""
        return {op: n for op, n in self.changes.items() if op != "same" and n}

    def registered(self, type_suffix: str = "") -> list[dict[str, Any]]:
        return [r for r in self.resources if str(r["type"]).startswith("kubernetes:")
                and not str(r["type"]).startswith("pulumi:providers:") and str(r["type"]).endswith(type_suffix)]


class Workspace:
    """A copy of this workspace with one stack set up for test API servers: `contexts` maps each cluster of the
    environment to a kubeconfig context, `kubeconfigs` are the files holding them."""

    def __init__(self, folder: Path, stack: str, environment: str, kubeconfigs: list[Path],
                 contexts: dict[str, str], tools: dict[str, Path], charts: dict[str, str],
                 settings: dict[str, Any] | None = None, drop_clusters: tuple[str, ...] = ()) -> None:
        self.folder, self.stack, self.tools = folder, stack, tools
        folder.mkdir(parents=True, exist_ok=True)
        for name in WORKSPACE_FILES:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, folder / name, symlinks=False, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(source, folder / name)
        self.environment = environment
        if drop_clusters:
            self.environment = self._without(environment, drop_clusters)
        base = ROOT / f"Pulumi.{stack}.yaml"
        config: dict[str, Any] = (yaml.safe_load(base.read_text())["config"] if base.is_file() else {})
        config["gpushare:environment"] = self.environment
        clusters = {k: v for k, v in (config.get("gpushare:clusters") or {}).items() if k not in drop_clusters}
        for cluster, context in contexts.items():
            clusters[cluster] = {**clusters.get(cluster, {}), "kubeconfigContext": context}
        config["gpushare:clusters"] = clusters
        config["gpushare:localCharts"] = charts
        # kwok nodes run no containers: no operand or controller ever becomes ready.
        config["gpushare:skipAwait"] = True
        config.update(settings or {})
        (folder / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))
        self.state = folder / ".state"
        self.home = folder / ".pulumi-home"
        self.state.mkdir(exist_ok=True)
        self.home.mkdir(exist_ok=True)
        self.kubeconfigs = kubeconfigs
        self.kubeconfig = str(self._merged(kubeconfigs))

    def _merged(self, files: list[Path]) -> Path:
        """One kubeconfig holding every test API server's context. Each server's file names its user `admin`: kept
        apart here, as a KUBECONFIG list would take the first file's `admin` for every server."""
        merged: dict[str, Any] = {"apiVersion": "v1", "kind": "Config", "clusters": [], "users": [], "contexts": []}
        for path in files:
            config = yaml.safe_load(path.read_text())
            for context in config["contexts"]:
                user = f"{context['name']}-{context['context']['user']}"
                merged["users"] += [{**u, "name": user} for u in config["users"]
                                    if u["name"] == context["context"]["user"]]
                merged["contexts"].append({"name": context["name"],
                                           "context": {**context["context"], "user": user}})
            merged["clusters"] += config["clusters"]
        merged["current-context"] = merged["contexts"][0]["name"]
        out = self.folder / "kubeconfig"
        out.write_text(yaml.safe_dump(merged))
        return out

    def _without(self, environment: str, drop: tuple[str, ...]) -> str:
        """The environment with the named clusters, their pools and tenants' references to them left out."""
        path = self.folder / environment
        env = yaml.safe_load(path.read_text())
        env["clusters"] = [c for c in env["clusters"] if c["name"] not in drop]
        env["pools"] = [p for p in env["pools"] if p["cluster"] not in drop]
        for tenant in env.get("tenants", []):
            if "clusters" in tenant:
                tenant["clusters"] = [c for c in tenant["clusters"] if c not in drop]
        # In place: an environment is named as its file.
        path.write_text(yaml.safe_dump(env, sort_keys=False))
        return environment

    def env(self) -> dict[str, str]:
        path = os.pathsep.join([str(self.tools["pulumi"].parent), str(self.tools["pulumi-kubernetes"].parent),
                                str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        return {**os.environ, "PATH": path, "GPUSHARE_ROOT": str(self.folder),
                "PULUMI_BACKEND_URL": f"file://{self.state}", "PULUMI_HOME": str(self.home),
                "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE, "PULUMI_SKIP_UPDATE_CHECK": "true",
                "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
                "PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK": "true", "KUBECONFIG": self.kubeconfig,
                "PYTHONPATH": str(ROOT)}

    def run(self, op: str, *policy_packs: Path, timeout: float = 900) -> Answer:
        out = self.folder / f".answer-{op}.json"
        out.unlink(missing_ok=True)
        command = [sys.executable, "-m", "tests.cluster.pulumi_inline", op, "--stack", self.stack,
                   "--out", str(out), *[f"--policy-pack={p}" for p in policy_packs]]
        done = subprocess.run(command, cwd=self.folder, env=self.env(), capture_output=True, text=True,
                              timeout=timeout, check=False)
        if not out.is_file():
            raise AssertionError(f"pulumi {op} gave no answer:\n{done.stdout}\n{done.stderr}")
        data = json.loads(out.read_text())
        return Answer(op=op, result=data["result"], changes=data.get("changes") or {}, output=data["output"],
                      seconds=data["seconds"], resources=data["resources"], error=data.get("error", ""))
