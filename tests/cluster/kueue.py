"""Kueue's own controller manager on a test cluster: the binary and its install manifest built from the Go module
sigs.k8s.io/kueue (tools/gobuild.sh kueue, at KUEUE_VERSION in tools/versions.env), run as a local process on
127.0.0.1 with the Configuration gpushare renders for the cluster (`gpushare preview`'s helm-values/<cluster>/
kueue.yaml), under the real identity of Kueue's ServiceAccount (`kueue-system/kueue-controller-manager`, the one
gpushare's admission policies let lift a pod's gate or resume a Job) with Kueue's own manager ClusterRole.

What a Deployment of the chart would have and a local process has not, and what stands in for it:
- Services in front of the webhooks: the webhook configurations (and the CRDs' conversion webhooks) from Kueue's
  own manifest, each `clientConfig.service` rewritten to `url: https://127.0.0.1:<port><path>`, with the
  namespaceSelector the chart adds to the job webhooks (kube-system and Kueue's namespace left out).
- Certificates: Kueue's internal cert management is off (its rotator writes certificates for the Service's DNS
  name, which a url cannot use); the fixture issues one for 127.0.0.1 from the cluster's CA. The manager reads the
  metrics certificate from the fixed path /etc/kueue/metrics/certs, where the chart mounts a Secret: the process runs
  in a mount namespace of its own in which an overlay over /etc holds it, so nothing outside changes.
- The visibility API server (an aggregated API the chart registers as an APIService; gpushare reads nothing from
  it) is switched off with `--feature-gates=VisibilityOnDemand=false`: with cert management off it reads its
  certificate from /visibility and binds a fixed port. The gates gpushare's values give the chart
  (controllerManager.featureGates) join that flag, as the chart passes them.
- The leader election namespace, which a pod reads from its ServiceAccount's mounted files: Kueue's namespace.
Only these, the listening addresses and the certificate directory differ from the rendered Configuration.
"""

from __future__ import annotations

import copy
import os
import shutil
import ssl
import time
import urllib.request
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import bins, controllers
from tests.cluster.controllers import WEBHOOK_KINDS
from tests.cluster.controlplane import Cluster, Process, free_port, spawn, wait_until
from tests.cluster.kube import Kube, eventually

NAMESPACE = "kueue-system"
SERVICE_ACCOUNT = "kueue-controller-manager"
MANAGER = "kueue-install"  # field manager of the objects from Kueue's own manifest
KWOK_STAGES = Path(__file__).with_name("kwok-stages-long-running.yaml")
# Parts of Kueue's manifest a local process does not use (see the module docstring).
NOT_INSTALLED = frozenset({"Namespace", "ConfigMap", "Secret", "Service", "Deployment", "APIService"})


def folder() -> Path:
    return bins.cache_dir() / f"kueue-{bins.versions()['KUEUE_VERSION']}"


def find() -> tuple[Path | None, str]:
    """Kueue's build folder (the `kueue` binary and `kueue-install.yaml`), or None and what to run."""
    where = folder()
    if (where / ".built").exists() and (where / "kueue").exists() and (where / "kueue-install.yaml").exists():
        return where, ""
    return None, (f"Kueue not built ({where}): run `make testbins` (tools/gobuild.sh kueue; needs Go and the Go "
                  "module proxy)")


@cache
def install_manifest(build: Path) -> tuple[dict[str, Any], ...]:
    """Kueue's own install manifest (`kustomize build config/default` of the module), as the build wrote it."""
    return tuple(d for d in yaml.safe_load_all((build / "kueue-install.yaml").read_text()) if d)


def rendered_configuration(helm_values: Path) -> dict[str, Any]:
    """The Kueue Configuration in the Helm values gpushare renders (managerConfig.controllerManagerConfigYaml)."""
    values = yaml.safe_load(helm_values.read_text())
    config: dict[str, Any] = yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])
    return config


def rendered_feature_gates(helm_values: Path) -> dict[str, bool]:
    """The feature gates gpushare's Helm values give Kueue (controllerManager.featureGates, which the chart passes
    to the manager as --feature-gates)."""
    values = yaml.safe_load(helm_values.read_text())
    return {g["name"]: bool(g["enabled"]) for g in values.get("controllerManager", {}).get("featureGates", [])}


def _is_job_webhook(webhook: dict[str, Any]) -> bool:
    return not any("kueue.x-k8s.io" in rule.get("apiGroups", []) for rule in webhook.get("rules", []))


def localised(obj: dict[str, Any], base: str, ca_bundle: str) -> dict[str, Any]:
    """An object of Kueue's manifest with every webhook reached at `base` (https://127.0.0.1:port)."""
    obj = controllers.localised(obj, base, ca_bundle)
    if obj["kind"] in WEBHOOK_KINDS:
        for webhook in obj["webhooks"]:
            if _is_job_webhook(webhook):
                # As the chart renders them when the Configuration sets no managedJobsNamespaceSelector.
                webhook.setdefault("namespaceSelector", {"matchExpressions": [{
                    "key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", NAMESPACE]}]})
    return obj


def _mount_namespace() -> list[str]:
    """`unshare` for a private mount namespace; as a non-root user inside a user namespace of its own."""
    if shutil.which("unshare") is None:
        raise RuntimeError("Kueue's tests need unshare (util-linux) for the metrics certificate's fixed path")
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--mount", "--propagation", "private"]


# The metrics certificate where the chart would mount it, visible to this process only.
_MOUNTS = ('set -e; mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1/etc/upper,workdir=$1/etc/work" /etc; '
           'mkdir -p /etc/kueue/metrics/certs; mount --bind "$1/metrics-certs" /etc/kueue/metrics/certs; '
           'shift; exec "$@"')


@dataclass
class Kueue:
    """Kueue's controller manager serving one test cluster."""

    cluster: Cluster
    kube: Kube  # the admin
    build: Path
    config: dict[str, Any]  # the Configuration it runs with
    work: Path
    process: Process | None = None
    ports: dict[str, int] = field(default_factory=dict)
    feature_gates: dict[str, bool] = field(default_factory=dict)  # the chart's controllerManager.featureGates

    @classmethod
    def start(cls, cluster: Cluster, kube: Kube, build: Path, rendered: dict[str, Any], work: Path,
              feature_gates: dict[str, bool] | None = None) -> Kueue:
        work.mkdir(parents=True, exist_ok=True)
        ports = {"webhook": free_port(), "metrics": free_port(), "health": free_port()}
        config = copy.deepcopy(rendered)
        config["health"] = {**config.get("health", {}), "healthProbeBindAddress": f"127.0.0.1:{ports['health']}"}
        config["metrics"] = {**config.get("metrics", {}), "bindAddress": f"127.0.0.1:{ports['metrics']}"}
        config["webhook"] = {**config.get("webhook", {}), "port": ports["webhook"], "host": "127.0.0.1",
                             "certDir": str(work / "webhook-certs")}
        config["internalCertManagement"] = {"enable": False}
        if config.get("leaderElection", {}).get("leaderElect"):
            # In a pod the namespace comes from the ServiceAccount's mounted files.
            config["leaderElection"] = {**config["leaderElection"], "resourceNamespace": NAMESPACE}
        kueue = cls(cluster, kube, build, config, work, ports=ports, feature_gates=dict(feature_gates or {}))
        kueue._install()
        try:
            kueue._run()
        except BaseException:
            kueue.stop()
            raise
        return kueue

    # ---------------------------------------------------------------- set-up

    @property
    def base(self) -> str:
        return f"https://127.0.0.1:{self.ports['webhook']}"

    @property
    def ca_bundle(self) -> str:
        return controllers.ca_bundle(self.cluster)

    def _install(self) -> None:
        """Kueue's CRDs and RBAC from its own manifest (the webhooks once it serves them), its certificates."""
        self.kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}, dry_run=False)
        controllers.apply_manifest(self.kube, [
            localised(o, self.base, self.ca_bundle) for o in install_manifest(self.build)
            if o["kind"] not in NOT_INSTALLED and o["kind"] not in WEBHOOK_KINDS], MANAGER)
        pki = self.cluster.pki
        pki.issue("kueue", f"kueue-webhook-service.{NAMESPACE}.svc", server=True)  # its SANs hold 127.0.0.1
        for sub in ("webhook-certs", "metrics-certs", "etc/upper", "etc/work"):
            (self.work / sub).mkdir(parents=True, exist_ok=True)
        for sub in ("webhook-certs", "metrics-certs"):
            shutil.copy(pki.path("kueue.crt"), self.work / sub / "tls.crt")
            shutil.copy(pki.path("kueue.key"), self.work / sub / "tls.key")
        controllers.write_kubeconfig(self.work / "kubeconfig", self.cluster, self.kube, NAMESPACE, SERVICE_ACCOUNT)
        (self.work / "kueue-config.yaml").write_text(yaml.safe_dump(self.config, sort_keys=False))

    def _ready(self) -> bool:
        return controllers.ready(self.ports["health"])

    def _run(self) -> None:
        argv = [*_mount_namespace(), "sh", "-c", _MOUNTS, "kueue", str(self.work), str(self.build / "kueue"),
                f"--config={self.work / 'kueue-config.yaml'}", f"--kubeconfig={self.work / 'kubeconfig'}",
                "--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in
                                              {"VisibilityOnDemand": False, **self.feature_gates}.items())]
        for attempt in range(3):
            self.process = spawn("kueue", argv, self.work)
            try:
                wait_until("Kueue's controller manager", self._ready, [self.process], timeout=120)
                break
            except RuntimeError:
                # The machine's inotify instances (per user, shared with every other program) may be used up for a
                # moment; anything else is Kueue's own failure.
                if attempt == 2 or "couldn't initialize inotify" not in self.process.tail(5):
                    raise
                self.process.stop()
                time.sleep(10)
        for obj in install_manifest(self.build):
            if obj["kind"] in WEBHOOK_KINDS:
                answer = self.kube.apply(localised(obj, self.base, self.ca_bundle), manager=MANAGER)
                assert answer.allowed, f"{obj['kind']}: {answer.message}"
        # Serving once a request through its webhooks is answered (a dry run: nothing is stored).
        probe = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                 "metadata": {"name": "gpushare-test-webhook-probe"}, "spec": {}}
        eventually(lambda: self.kube.create(probe).allowed, timeout=60, what="Kueue's webhooks answer")

    # ---------------------------------------------------------------- use

    def alive(self) -> str:
        return controllers.exited("kueue", self.process)

    def scrape(self, token: str) -> str:
        """Kueue's /metrics as Prometheus reads it: HTTPS, the bearer token of a ServiceAccount allowed /metrics
        (Kueue's metrics server checks it with a TokenReview and a SubjectAccessReview)."""
        ctx = ssl.create_default_context(cafile=self.cluster.pki.path("ca.crt"))
        request = urllib.request.Request(f"https://127.0.0.1:{self.ports['metrics']}/metrics",
                                         headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, context=ctx, timeout=10) as answer:  # noqa: S310 - our own server
            return str(answer.read().decode())

    def stop(self) -> None:
        controllers.stop(self.kube, install_manifest(self.build), self.process)
