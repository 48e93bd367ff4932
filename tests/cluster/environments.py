"""Each environment's objects applied to API servers of its own: `gpushare preview --out` for the environment,
kwok nodes from `gpushare plan --json`, the CRDs gpushare ships (NVIDIA's, Kueue's, prometheus-operator's), then
every manifest by server-side apply exactly as the preview wrote it. One API server per (environment, cluster),
started once per session and shared by every test that needs that environment."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from gpushare.core.paths import package_data_path
from tests.cluster.bins import ROOT
from tests.cluster.kube import Answer, Kube, eventually
from tests.cluster.nodes import kwok_node, plan_json, planned_nodes

# environment key -> what `gpushare preview --env` and `gpushare plan --env` are given
ENVIRONMENTS = {"dev": "dev", "pilot": "pilot", "prod": "prod", "dra": "examples/environments/dra.yaml",
                "dra-partitionable": "tests/cluster/dra-partitionable.yaml"}
# Namespaces the Helm releases create (create_namespace) where no gpushare object does: made before the apply, as
# the release would have made them, so that objects placed there are judged on their own.
RELEASE_NAMESPACES = ("gpu-operator", "kueue-system", "monitoring", "nvidia-dra-driver-gpu")
FIRST = {"CustomResourceDefinition": 0, "Namespace": 1}


@cache
def preview(env: str, out: Path) -> dict[str, list[dict[str, Any]]]:
    """cluster name -> the objects `gpushare preview --env ENV --out` wrote for it (file order kept)."""
    run = subprocess.run([sys.executable, "-m", "gpushare", "preview", "--env", ENVIRONMENTS[env], "--out",
                          str(out)], cwd=ROOT, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    by_cluster: dict[str, list[dict[str, Any]]] = {}
    for folder in sorted((out / "manifests").iterdir()):
        for path in sorted(folder.glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    by_cluster.setdefault(folder.name, []).append(doc)
    return by_cluster


def crds() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted(package_data_path().glob("crd-*.yaml")):
        out.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return out


def ident(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj['kind']} {where}{meta['name']}"


@dataclass
class Applied:
    """One cluster of an environment, with its objects applied."""

    env: str
    cluster: str
    kube: Kube
    objects: list[dict[str, Any]]
    nodes: list[dict[str, Any]]  # the planned nodes (plan --json entries)
    plan: dict[str, Any]
    first: dict[str, Answer] = field(default_factory=dict)  # ident -> answer of the first apply
    _kueue: KueueStandIn | None = None

    @property
    def kueue(self) -> KueueStandIn:
        if self._kueue is None:
            self._kueue = KueueStandIn(self.kube)
        return self._kueue


def ordered(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(objects, key=lambda o: FIRST.get(o["kind"], 2))


def apply_crds(kube: Kube, only: list[dict[str, Any]] | None = None) -> None:
    """gpushare's CRDs (or `only` those given) applied, and served before this returns."""
    chosen = crds() if only is None else only
    for crd in chosen:
        answer = kube.apply(crd)
        assert answer.allowed, f"{ident(crd)}: {answer.message}"
    for crd in chosen:
        name = crd["metadata"]["name"]
        eventually(lambda name=name: any(
            c["type"] == "Established" and c["status"] == "True" for c in
            # a CRD just created may have a status whose conditions are still null
            ((kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name) or {})
             .get("status") or {}).get("conditions") or []), what=f"CRD {name} established")
    kube.dynamic.resources.invalidate_cache()


def bring_up(env: str, cluster: str, kube: Kube, out: Path) -> Applied:
    objects = preview(env, out)[cluster]
    plan = plan_json(ENVIRONMENTS[env]) if not ENVIRONMENTS[env].endswith(".yaml") else plan_json(
        str(ROOT / ENVIRONMENTS[env]))
    nodes = planned_nodes(plan, cluster)
    apply_crds(kube)
    for node in nodes:
        # A bare-metal machine exists before Pulumi labels it, with the labels Ansible set on the host; a cloud
        # pool's nodes come up with the pool's labels and taints, which the cloud provider sets.
        owners = None if node["managed_by"] in ("gke", "eks") else ("ansible",)
        answer = kube.create(kwok_node(node, owners=owners), dry_run=False)
        assert answer.allowed or answer.status == 409, answer.message
    for name in RELEASE_NAMESPACES:
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}, dry_run=False)
    applied = Applied(env, cluster, kube, objects, nodes, plan)
    for obj in ordered(objects):
        applied.first[ident(obj)] = kube.apply(obj)
    return applied


TENANT_SERVICE_ACCOUNT = "ci"


def tenant_client(kube: Kube, namespace: str) -> Kube:
    """A client holding a real token of a ServiceAccount in the tenant's namespace with the built-in `admin` role
    there (and pods/ephemeralcontainers): broader than gpushare's tenant roles (test_tenant_rbac.py), because a site
    may bind its own groups to Kubernetes' roles instead, so the admission tests take the broadest rights a namespace
    owner is normally given."""
    kube.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": TENANT_SERVICE_ACCOUNT, "namespace": namespace}})
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "tenant-admin", "namespace": namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
                "subjects": [{"kind": "ServiceAccount", "name": TENANT_SERVICE_ACCOUNT, "namespace": namespace}]})
    # `kubectl debug` needs pods/ephemeralcontainers, which `admin` leaves out: a site that lets tenants debug grants
    # it, and the policies must hold then too.
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "tenant-debug", "namespace": namespace},
                "rules": [{"apiGroups": [""], "resources": ["pods/ephemeralcontainers"],
                           "verbs": ["get", "patch", "update"]}]})
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "tenant-debug", "namespace": namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant-debug"},
                "subjects": [{"kind": "ServiceAccount", "name": TENANT_SERVICE_ACCOUNT, "namespace": namespace}]})
    return kube.as_service_account(namespace, TENANT_SERVICE_ACCOUNT)


def tenant_pod(namespace: str, priority: str, resources: dict[str, int], name: str = "work") -> dict[str, Any]:
    """The example untrusted GPU pod (examples/tenants/untrusted-gpu-pod.yaml: Pod Security restricted, queued by
    its LocalQueue label), in the tenant's namespace with its priority class and the GPU resources asked for."""
    pod: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "tenants" / "untrusted-gpu-pod.yaml").read_text())
    pod["metadata"].update(name=name, namespace=namespace)
    pod["spec"]["priorityClassName"] = f"gpushare-{priority}"
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    for key in [k for k in limits if k.startswith("nvidia.com/")]:
        del limits[key]
    limits.update({k: str(v) for k, v in resources.items()})
    return pod


KUEUE_GATE = "kueue.x-k8s.io/admission"


def gated(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as Kueue's webhook leaves it on create: held by Kueue's scheduling gate until Kueue admits it."""
    pod["spec"].setdefault("schedulingGates", []).append({"name": KUEUE_GATE})
    return pod


def bind_cluster_admin(kube: Kube, name: str, subject: dict[str, str]) -> None:
    """A ClusterRoleBinding of cluster-admin to one subject: a stand-in for that identity's real role."""
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [subject]})


class KueueStandIn:
    """What Kueue's controller does to a gated pod when it admits its workload onto a ResourceFlavor, done under
    Kueue's own ServiceAccount (kueue-system/kueue-controller-manager, the identity gpushare's policies let lift the
    gate): the flavor's node labels join the node selector, its tolerations are added, the gate is removed.
    tests/cluster/test_kueue.py runs Kueue itself; here only the scheduler's side of admission is wanted."""

    def __init__(self, kube: Kube) -> None:
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kueue-system"}}, dry_run=False)
        kube.apply({"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": "kueue-controller-manager", "namespace": "kueue-system"}})
        bind_cluster_admin(kube, "kueue-stand-in", {"kind": "ServiceAccount", "name": "kueue-controller-manager",
                                                    "namespace": "kueue-system"})
        self.kube = kube.as_service_account("kueue-system", "kueue-controller-manager")

    def admit(self, pod: dict[str, Any], flavor: dict[str, Any] | None = None) -> None:
        meta = pod["metadata"]
        for _ in range(10):  # controllers write the pod's status meanwhile: read it again on a conflict, as Kueue does
            current = self.kube.get("v1", "Pod", meta["name"], meta["namespace"])
            assert current is not None, meta["name"]
            spec = current["spec"]
            spec["schedulingGates"] = [g for g in spec.get("schedulingGates", []) if g["name"] != KUEUE_GATE]
            if flavor:
                spec["nodeSelector"] = {**spec.get("nodeSelector", {}), **flavor.get("nodeLabels", {})}
                spec["tolerations"] = [*spec.get("tolerations", []), *flavor.get("tolerations", [])]
            answer = self.kube.update(current, dry_run=False)
            if answer.status != 409:
                break
        assert answer.allowed, f"Kueue's admission of {meta['name']} was refused: {answer.message}"
