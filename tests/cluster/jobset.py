"""The JobSet controller on a test cluster: the binary and its install manifest built from the Go module
sigs.k8s.io/jobset (tools/gobuild.sh jobset, at JOBSET_VERSION in tools/versions.env: the release Kueue's go.mod
requires), run as a local process on 127.0.0.1 under the real identity of JobSet's ServiceAccount
(`jobset-system/jobset-controller-manager`, the one gpushare's queue policy lets create and resume the Jobs of a
queued JobSet) with JobSet's own manager ClusterRole.

What a Deployment of the release manifest would have and a local process has not, and what stands in for it:
- The Service in front of the webhooks: the webhook configurations from JobSet's manifest, each
  `clientConfig.service` rewritten to `url: https://127.0.0.1:<port><path>` (tests/cluster/controllers.py).
- Certificates: JobSet's internal cert management is off (its rotator writes certificates for the Service's DNS
  name, which a url cannot use); the fixture issues one for 127.0.0.1 from the cluster's CA into the webhook
  certDir the Configuration names.
- Metrics: off (bindAddress "0"); gpushare reads none of JobSet's.
Only these, the listening addresses and leader election (one replica) differ from the release's Configuration."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import bins, controllers
from tests.cluster.controllers import WEBHOOK_KINDS
from tests.cluster.controlplane import Cluster, Process, free_port, spawn, wait_until
from tests.cluster.kube import Kube, eventually

NAMESPACE = "jobset-system"
SERVICE_ACCOUNT = "jobset-controller-manager"
API = "jobset.x-k8s.io/v1alpha2"
MANAGER = "jobset-install"  # field manager of the objects from JobSet's own manifest
NOT_INSTALLED = frozenset({"Namespace", "ConfigMap", "Secret", "Service", "Deployment"})


def folder() -> Path:
    return bins.cache_dir() / f"jobset-{bins.versions()['JOBSET_VERSION']}"


def find() -> tuple[Path | None, str]:
    """JobSet's build folder (the `jobset` binary and `jobset-install.yaml`), or None and what to run."""
    where = folder()
    if (where / ".built").exists() and (where / "jobset").exists() and (where / "jobset-install.yaml").exists():
        return where, ""
    return None, (f"JobSet not built ({where}): run `make testbins` (tools/gobuild.sh jobset; needs Go and the Go "
                  "module proxy)")


@cache
def install_manifest(build: Path) -> tuple[dict[str, Any], ...]:
    """JobSet's own install manifest (`kustomize build config/default` of the module), as the build wrote it."""
    return tuple(d for d in yaml.safe_load_all((build / "jobset-install.yaml").read_text()) if d)


def release_configuration(build: Path) -> dict[str, Any]:
    """The Configuration JobSet's release manifest gives its manager (the manager-config ConfigMap)."""
    config_map = next(o for o in install_manifest(build) if o["kind"] == "ConfigMap"
                      and "controller_manager_config.yaml" in o.get("data", {}))
    config: dict[str, Any] = yaml.safe_load(config_map["data"]["controller_manager_config.yaml"])
    return config


@dataclass
class JobSetController:
    """JobSet's controller manager serving one test cluster."""

    cluster: Cluster
    kube: Kube  # the admin
    build: Path
    work: Path
    process: Process | None = None
    ports: dict[str, int] = field(default_factory=dict)

    @classmethod
    def start(cls, cluster: Cluster, kube: Kube, build: Path, work: Path) -> JobSetController:
        work.mkdir(parents=True, exist_ok=True)
        controller = cls(cluster, kube, build, work, ports={"webhook": free_port(), "health": free_port()})
        controller._install()
        try:
            controller._run()
        except BaseException:
            controller.stop()
            raise
        return controller

    @property
    def base(self) -> str:
        return f"https://127.0.0.1:{self.ports['webhook']}"

    def _install(self) -> None:
        """JobSet's CRDs and RBAC from its own manifest (the webhooks once it serves them), its certificate, its
        kubeconfig and Configuration."""
        self.kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}, dry_run=False)
        bundle = controllers.ca_bundle(self.cluster)
        controllers.apply_manifest(self.kube, [
            controllers.localised(o, self.base, bundle) for o in install_manifest(self.build)
            if o["kind"] not in NOT_INSTALLED and o["kind"] not in WEBHOOK_KINDS], MANAGER)
        pki = self.cluster.pki
        pki.issue("jobset", f"jobset-webhook-service.{NAMESPACE}.svc", server=True)  # its SANs hold 127.0.0.1
        certs = self.work / "webhook-certs"
        certs.mkdir(parents=True, exist_ok=True)
        shutil.copy(pki.path("jobset.crt"), certs / "tls.crt")
        shutil.copy(pki.path("jobset.key"), certs / "tls.key")
        controllers.write_kubeconfig(self.work / "kubeconfig", self.cluster, self.kube, NAMESPACE, SERVICE_ACCOUNT)
        config = release_configuration(self.build)
        config.update(
            internalCertManagement={"enable": False},
            webhook={"port": self.ports["webhook"], "host": "127.0.0.1", "certDir": str(certs)},
            metrics={"bindAddress": "0"},
            health={"healthProbeBindAddress": f"127.0.0.1:{self.ports['health']}"},
            leaderElection={"leaderElect": False})
        (self.work / "jobset-config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    def _ready(self) -> bool:
        return controllers.ready(self.ports["health"])

    def _run(self) -> None:
        argv = [str(self.build / "jobset"), f"--config={self.work / 'jobset-config.yaml'}",
                f"--kubeconfig={self.work / 'kubeconfig'}", "--zap-log-level=2"]
        self.process = spawn("jobset", argv, self.work)
        wait_until("JobSet's controller manager", self._ready, [self.process], timeout=120)
        bundle = controllers.ca_bundle(self.cluster)
        for obj in install_manifest(self.build):
            if obj["kind"] in WEBHOOK_KINDS:
                answer = self.kube.apply(controllers.localised(obj, self.base, bundle), manager=MANAGER)
                assert answer.allowed, f"{obj['kind']}: {answer.message}"
        # Serving once a request through its webhooks is answered (a dry run: nothing is stored).
        probe = {"apiVersion": API, "kind": "JobSet", "metadata": {"name": "probe", "namespace": "default"},
                 "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {"template": {
                     "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}}]}}
        eventually(lambda: self.kube.create(probe).allowed, timeout=60, what="JobSet's webhooks answer")

    def alive(self) -> str:
        return controllers.exited("jobset", self.process)

    def stop(self) -> None:
        controllers.stop(self.kube, install_manifest(self.build), self.process)
