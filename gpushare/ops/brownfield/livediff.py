# One module: one read-only diff of the next rollout; its API client and impact checks serve only that diff.
"""`gpushare diff`: what the next rollout changes in a live cluster, field by field, and what that does to the work
running there. Read-only: every object the Pulumi program would apply is sent to the API server as a server-side
apply with dryRun=All, so defaulting, validation, admission and Pod Security are the cluster's own; nothing is
stored.

The impact on running work is judged where the cluster can judge it, else from the live objects:
- admission: each controller's pod template (and each bare pod) in a tenant namespace is created with dryRun=All;
  a gpushare policy bound with Warn (an adopted cluster's admission stage) answers with a warning that says what
  Deny would refuse, and a denial is a denial. A binding the rollout moves from Warn to Deny turns those warnings
  into refusals; a policy not in the cluster yet is not judged live (said so: bind it with Warn first);
- Pod Security: the namespaces' new labels, dry-run applied, make the API server list the running pods that the new
  enforce level would refuse (its own check);
- taints: running pods that do not tolerate a taint a node gets (NoSchedule: their replacements cannot land there;
  NoExecute: evicted);
- resource names: running pods asking for a GPU resource that no node advertises after the rollout;
- quotas: a quota whose new hard limit is below what the namespace's running pods use;
- LimitRanges: a new default limit or maximum below a running container's request;
- the GPU Operator: the ClusterPolicy settings the pinned chart with gpushare's values changes, and the operands
  that restart for it."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.mappings import dig
from gpushare.core.resolve import resolve_env
from gpushare.ops.brownfield.kubeconfig import load_kubeconfig
from gpushare.ops.brownfield.operator import operator_changes
from gpushare.ops.preview import collect_plan, kubernetes_objects
from gpushare.program.components.operator_values import DEVICE_PLUGIN_CONFIGMAP

FIELD_MANAGER = "gpushare-diff"
SERVER_FIELDS = ("managedFields", "resourceVersion", "uid", "creationTimestamp", "generation", "selfLink")
CONTROLLERS = (("apps/v1", "Deployment"), ("apps/v1", "StatefulSet"), ("apps/v1", "DaemonSet"),
               ("batch/v1", "Job"), ("batch/v1", "CronJob"))
GPU_PREFIX = "nvidia.com/"
TIMEOUT = (10, 60)


@dataclass(frozen=True)
class Change:
    object: str  # "Kind namespace/name"
    field: str  # a dotted path, or "" for the whole object (created)
    old: Any
    new: Any

    def as_dict(self) -> dict[str, Any]:
        return {"object": self.object, "field": self.field, "old": self.old, "new": self.new}


@dataclass(frozen=True)
class Impact:
    workload: str  # "Kind namespace/name"
    effect: str  # denied | pending | evicted | restarted | refused
    cause: str  # the change that causes it
    reason: str
    fix: str

    def as_dict(self) -> dict[str, str]:
        return {"workload": self.workload, "effect": self.effect, "cause": self.cause, "reason": self.reason,
                "fix": self.fix}


@dataclass
class DiffReport:
    environment: str
    cluster: str
    changes: list[Change] = field(default_factory=list)
    impact: list[Impact] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # objects the API server refuses: pulumi up would fail there
    not_judged: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"environment": self.environment, "cluster": self.cluster,
                "changes": [c.as_dict() for c in self.changes], "impact": [i.as_dict() for i in self.impact],
                "refused": self.refused, "not_judged": self.not_judged}


# ---------------------------------------------------------------- the API server


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    warnings: list[str]

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def _warnings(headers: Any) -> list[str]:
    """Warning headers (`299 - "text"`), one entry per warning."""
    values = headers.getlist("Warning") if hasattr(headers, "getlist") else [
        v for k, v in (headers or {}).items() if k.lower() == "warning"]
    out = []
    for value in values:
        for part in value.split(", 299 "):  # urllib3 joins repeated headers with ", "
            out.append(part.removeprefix("299 ").removeprefix("- ").strip().strip('"').replace('\\"', '"'))
    return out


class Api:
    """Raw requests through the official client (its generated API hides Warning headers), and the REST paths of
    kinds from the server's discovery."""

    def __init__(self, kubeconfig: Path, context: str | None) -> None:
        try:
            from kubernetes import client
            from kubernetes.dynamic import DynamicClient
        except ImportError:
            raise GpushareError(Problem("gpushare diff reads the cluster through the Kubernetes Python client, "
                                        "which is not installed", path="--kubeconfig",
                                        fix="pip install 'gpushare[live]'"), exit_code=2) from None
        configuration = client.Configuration()
        load_kubeconfig(kubeconfig, context, configuration)  # what is not a kubeconfig: exit 2, naming the file
        self.api = client.ApiClient(configuration)
        self.where = f"{kubeconfig}" + (f" (context {context})" if context else "")
        try:
            self.dynamic = DynamicClient(self.api)
        except Exception as exc:  # noqa: BLE001 - connection refused, TLS, 401: the server cannot be read
            raise GpushareError(Problem(f"cannot reach the API server of {self.where}: {exc}"[:400],
                                        file=str(kubeconfig), fix="check the kubeconfig, its context and that the "
                                        "API server answers"), exit_code=2) from None
        self._paths: dict[tuple[str, str], Any] = {}

    def resource(self, api_version: str, kind: str) -> Any | None:
        from kubernetes.dynamic.exceptions import ResourceNotFoundError

        key = (api_version, kind)
        if key not in self._paths:
            try:
                self._paths[key] = self.dynamic.resources.get(api_version=api_version, kind=kind)
            except ResourceNotFoundError:
                self._paths[key] = None
        return self._paths[key]

    def path(self, obj: dict[str, Any], name: bool = True) -> str | None:
        res = self.resource(str(obj.get("apiVersion")), str(obj.get("kind")))
        if res is None:
            return None
        meta = obj.get("metadata") or {}
        return str(res.path(name=meta.get("name") if name else None,
                            namespace=meta.get("namespace") if res.namespaced else None))

    def request(self, method: str, path: str, body: Any = None, query: Iterable[tuple[str, str]] = (),
                content_type: str = "application/json") -> Answer:
        from kubernetes.client.exceptions import ApiException

        url = self.api.configuration.host + path + (f"?{urlencode(list(query))}" if query else "")
        try:
            response = self.api.call_api(method, url, header_params={"Accept": "application/json",
                                                                     "Content-Type": content_type},
                                         body=body, _request_timeout=TIMEOUT)
            status, data, headers = response.status, response.read(), response.headers
        except ApiException as exc:
            status, data, headers = exc.status or 0, (exc.body or b""), exc.headers
        except Exception as exc:  # noqa: BLE001 - urllib3's connection and timeout errors
            raise GpushareError(Problem(f"the API server of {self.where} did not answer {method} {path}: {exc}"[:400],
                                        fix="check that it is reachable and retry"), exit_code=2) from None
        if isinstance(data, str):
            data = data.encode()
        try:
            parsed = json.loads(data) if data else {}
        except ValueError:
            parsed = {"message": data.decode(errors="replace")}
        return Answer(status, parsed if isinstance(parsed, dict) else {}, _warnings(headers))

    def get(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        path = self.path(obj)
        if path is None:
            return None
        answer = self.request("GET", path)
        if answer.status == 404:
            return None
        self.must(answer, f"GET {path}")
        return answer.body

    def list(self, api_version: str, kind: str) -> list[dict[str, Any]]:
        res = self.resource(api_version, kind)
        if res is None:
            return []
        path = str(res.path())
        answer = self.request("GET", path)
        self.must(answer, f"GET {path}")
        items = list(answer.body.get("items") or [])
        for item in items:  # a list's items carry neither
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return items

    def apply_dry_run(self, obj: dict[str, Any], force: bool) -> Answer:
        path = self.path(obj)
        if path is None:
            return Answer(404, {"message": f"the cluster serves no {obj.get('apiVersion')} {obj.get('kind')}"}, [])
        return self.request("PATCH", path, obj, [("fieldManager", FIELD_MANAGER), ("dryRun", "All"),
                                                 ("force", "true" if force else "false")],
                            "application/apply-patch+yaml")

    def create_dry_run(self, obj: dict[str, Any]) -> Answer:
        path = self.path(obj, name=False)
        assert path is not None
        return self.request("POST", path, obj, [("dryRun", "All")])

    def must(self, answer: Answer, what: str) -> None:
        if answer.status in (401, 403):
            raise GpushareError(Problem(f"the API server of {self.where} refused {what}: "
                                        f"{answer.body.get('message', answer.status)}"[:400],
                                        fix="use a context that may get and list the objects gpushare manages, and "
                                            "create and patch them with dryRun (kubectl auth can-i)"), exit_code=2)
        if not answer.ok:
            raise GpushareError(Problem(f"the API server of {self.where} answered {answer.status} to {what}: "
                                        f"{answer.body.get('message', '')}"[:400],
                                        fix="check the API server's health and retry"), exit_code=2)


# ---------------------------------------------------------------- field-by-field changes


def ident(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind')} " + (f"{meta['namespace']}/" if meta.get("namespace") else "") + str(meta.get("name"))


def _content(obj: dict[str, Any] | None) -> dict[str, Any]:
    if obj is None:
        return {}
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in SERVER_FIELDS}
    return {**{k: v for k, v in obj.items() if k not in ("metadata", "status")}, "metadata": meta}


def field_changes(old: Any, new: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(path, old, new) for every leaf that differs; lists compared whole (their order is their meaning)."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            sub = f"{path}.{key}" if path and "." not in str(key) and "/" not in str(key) else (
                f"{path}[{key}]" if path else str(key))
            yield from field_changes(old.get(key), new.get(key), sub)
    elif old != new:
        yield path, old, new


# ---------------------------------------------------------------- tolerations, requests, quantities


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    """Kubernetes' own matching: an empty key with Exists tolerates everything; an empty effect every effect."""
    for t in tolerations or []:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        operator = t.get("operator") or "Equal"
        if not t.get("key"):
            if operator == "Exists":
                return True
            continue
        if t.get("key") != taint.get("key"):
            continue
        if operator == "Exists" or str(t.get("value") or "") == str(taint.get("value") or ""):
            return True
    return False


def quantity(value: Any) -> float:
    from kubernetes.utils import parse_quantity

    try:
        return float(parse_quantity(str(value)))
    except (ValueError, TypeError):
        return 0.0


def containers(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pod_spec.get("containers") or []) + list(pod_spec.get("initContainers") or [])


def pod_requests(pod_spec: dict[str, Any]) -> dict[str, float]:
    """What a pod asks for, as ResourceQuota counts it (extended resources: requests, or limits where only they
    are set)."""
    out: dict[str, float] = {}
    for c in containers(pod_spec):
        res = c.get("resources") or {}
        asked = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for name, value in asked.items():
            out[name] = out.get(name, 0.0) + quantity(value)
    return out


def running(pod: dict[str, Any]) -> bool:
    return dig(pod, "status", "phase") not in ("Succeeded", "Failed") and not dig(pod, "metadata", "deletionTimestamp")


def owner_of(pod: dict[str, Any], replicasets: dict[tuple[str, str], dict[str, Any]]) -> str:
    """The controller a pod belongs to, as a person names it (a Deployment rather than its ReplicaSet)."""
    meta = pod.get("metadata") or {}
    ns = meta.get("namespace", "")
    for ref in meta.get("ownerReferences") or []:
        if not ref.get("controller"):
            continue
        if ref.get("kind") == "ReplicaSet":
            rs = replicasets.get((ns, str(ref.get("name"))))
            for up in dig(rs, "metadata", "ownerReferences") or []:
                if up.get("controller"):
                    return f"{up.get('kind')} {ns}/{up.get('name')}"
        if ref.get("kind") == "Job":
            return f"Job {ns}/{ref.get('name')}"
        return f"{ref.get('kind')} {ns}/{ref.get('name')}"
    return f"Pod {ns}/{meta.get('name')}"


def template_of(controller: dict[str, Any]) -> dict[str, Any] | None:
    spec = controller.get("spec") or {}
    if controller.get("kind") == "CronJob":
        spec = dig(spec, "jobTemplate", "spec") or {}
    template = spec.get("template")
    return template if isinstance(template, dict) else None


# ---------------------------------------------------------------- the diff


# ClusterPolicy sections -> the operand DaemonSet a change to them restarts (the operator's own names).
OPERANDS = {"devicePlugin": "nvidia-device-plugin-daemonset", "dcgmExporter": "nvidia-dcgm-exporter",
            "gfd": "gpu-feature-discovery", "migManager": "nvidia-mig-manager", "driver": "nvidia-driver-daemonset",
            "toolkit": "nvidia-container-toolkit-daemonset", "validator": "nvidia-operator-validator",
            "dcgm": "nvidia-dcgm", "nodeStatusExporter": "nvidia-node-status-exporter",
            "daemonsets": "every operand DaemonSet"}
BREAKING = ("denied", "pending", "evicted", "refused")
POLICY_WARNING = "ValidatingAdmissionPolicy '"


class _Live:
    """The live objects the impact is judged on, read once."""

    def __init__(self, api: Api) -> None:
        self.nodes = api.list("v1", "Node")
        self.pods = [p for p in api.list("v1", "Pod") if running(p)]
        self.replicasets = {(str(dig(r, "metadata", "namespace", default="")), str(dig(r, "metadata", "name"))): r
                            for r in api.list("apps/v1", "ReplicaSet")}
        self.controllers = [c for v, k in CONTROLLERS for c in api.list(v, k)]
        self.bindings = {str(dig(b, "metadata", "name")): list(dig(b, "spec", "validationActions") or [])
                         for b in api.list("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding")}
        self.policies = {str(dig(p, "metadata", "name")) for p in api.list(
            "admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy")}
        self.cluster_policies = api.list("nvidia.com/v1", "ClusterPolicy")

    def owner(self, pod: dict[str, Any]) -> str:
        return owner_of(pod, self.replicasets)

    def pods_in(self, namespace: str) -> list[dict[str, Any]]:
        return [p for p in self.pods if dig(p, "metadata", "namespace") == namespace]

    def daemonset_pod(self, pod: dict[str, Any]) -> bool:
        return any(r.get("kind") == "DaemonSet" for r in dig(pod, "metadata", "ownerReferences") or [])


def single_cluster(env: str, cluster: str | None) -> tuple[Any, str]:
    """The resolved fleet and the one cluster the kubeconfig reaches."""
    fleet = resolve_env(env)
    if cluster is None:
        if len(fleet.clusters) != 1:
            raise GpushareError(Problem(f"environment {fleet.environment} has clusters "
                                        f"{', '.join(fleet.clusters)}: say which one the kubeconfig reaches",
                                        path="--cluster", fix="add --cluster NAME"), exit_code=2)
        cluster = next(iter(fleet.clusters))
    elif cluster not in fleet.clusters:
        raise GpushareError(Problem(f"environment {fleet.environment} has no cluster {cluster!r}", path="--cluster",
                                    fix=f"use one of {', '.join(fleet.clusters)}"), exit_code=2)
    return fleet, cluster


def live_diff(env: str, api: Api, cluster: str | None = None, objects: list[dict[str, Any]] | None = None
              ) -> DiffReport:
    """Every change the next rollout's Pulumi step makes to the live objects of one cluster, and the impact on what
    runs there. `objects`: the manifests to judge (default: the offline preview's, as `gpushare preview` writes
    them)."""
    fleet, cluster = single_cluster(env, cluster)
    made: set[str] = set()  # namespaces the rollout's Helm releases create (create_namespace)
    if objects is None:
        plan = collect_plan(env)
        objects = [o.body for o in kubernetes_objects(plan) if o.cluster == cluster]
        made = {str(r.inputs.get("namespace")) for r in plan.resources if r.type.endswith(":Release")
                and plan.cluster_of(r) == cluster and r.inputs.get("createNamespace")}
    made |= {str(o["metadata"]["name"]) for o in objects if o.get("kind") == "Namespace"}
    report = DiffReport(fleet.environment, cluster)
    live = _Live(api)
    after: dict[str, dict[str, Any]] = {}  # ident -> the object as the dry run says it would be stored
    for obj in objects:
        name = ident(obj)
        before = api.get(obj)
        answer = api.apply_dry_run(obj, force=False)
        if answer.status == 409:
            report.refused.append(f"{name}: {answer.body.get('message', 'conflict')} (pulumi up stops here unless "
                                  "those fields are released, or the object carries pulumi.com/patchForce)")
            answer = api.apply_dry_run(obj, force=True)
        namespace = dig(obj, "metadata", "namespace")
        if answer.status == 404 and before is None and namespace in made:
            # Its namespace comes with the rollout (a Helm release makes it): created, judged once it exists.
            report.changes.append(Change(name, "", None, "created"))
            continue
        if not answer.ok:
            report.refused.append(f"{name}: the API server refuses it: {answer.body.get('message', answer.status)}")
            continue
        after[name] = answer.body
        if before is None:
            report.changes.append(Change(name, "", None, "created"))
        else:
            report.changes.extend(Change(name, path, old, new)
                                  for path, old, new in field_changes(_content(before), _content(answer.body)))
        if obj.get("kind") == "Namespace":
            report.impact.extend(_pod_security(answer.warnings, obj, live))
        if obj.get("kind") == "Node":
            report.impact.extend(_taints(before or {}, answer.body, live))
        if obj.get("kind") == "ResourceQuota":
            report.impact.extend(_quota(before, answer.body, live))
        if obj.get("kind") == "LimitRange":
            report.impact.extend(_limit_range(answer.body, live))
    report.impact.extend(_resource_names(fleet, cluster, live))
    report.impact.extend(_admission(api, objects, live, report))
    report.impact.extend(_operator(fleet, live, report))
    return report


def _pod_security(warnings: list[str], namespace: dict[str, Any], live: _Live) -> Iterator[Impact]:
    """The API server's own check of a namespace's new enforce level against its running pods: a warning naming the
    level, then one per pod (`name: what it violates`)."""
    ns = str(dig(namespace, "metadata", "name"))
    level = dig(namespace, "metadata", "labels", "pod-security.kubernetes.io/enforce")
    by_name = {str(dig(p, "metadata", "name")): p for p in live.pods_in(ns)}
    seen: set[str] = set()
    for text in warnings:
        pod_name, _, why = text.partition(": ")
        pod = by_name.get(pod_name)
        if pod is None or not why:
            continue
        owner = live.owner(pod)
        if owner in seen:
            continue
        seen.add(owner)
        yield Impact(owner, "refused", f"Namespace {ns} labels[pod-security.kubernetes.io/enforce] -> {level}",
                     f"its pods violate Pod Security {level}: {why}; running pods stay, new ones (restarts, scaling, "
                     "re-runs) are refused",
                     "make its pod template meet the level, or keep adoption.pod_security: warn")


def _taints(before: dict[str, Any], now: dict[str, Any], live: _Live) -> Iterator[Impact]:
    old = {(t.get("key"), t.get("value"), t.get("effect")) for t in dig(before, "spec", "taints") or []}
    node = str(dig(now, "metadata", "name"))
    added = [t for t in dig(now, "spec", "taints") or []
             if (t.get("key"), t.get("value"), t.get("effect")) not in old]
    if not added:
        return
    seen: set[tuple[str, str]] = set()
    for pod in live.pods:
        if dig(pod, "spec", "nodeName") != node or live.daemonset_pod(pod):
            continue
        for taint in added:
            if tolerates(dig(pod, "spec", "tolerations") or [], taint):
                continue
            owner = live.owner(pod)
            shown = f"{taint.get('key')}={taint.get('value', '')}:{taint.get('effect')}"
            if (owner, shown) in seen:
                continue
            seen.add((owner, shown))
            evicted = taint.get("effect") == "NoExecute"
            yield Impact(owner, "evicted" if evicted else "pending", f"Node {node} spec.taints + {shown}",
                         ("its pods there are evicted" if evicted else "its pods there keep running, but a restart, "
                          f"a scale-up or a re-run cannot land on {node} again") + " (they do not tolerate it)",
                         "add the toleration to its pod template, or queue it through Kueue, whose flavors carry the "
                         "pool's tolerations; or keep adoption.shared_gpu_taint: false")


def _used(namespace: str, live: _Live) -> dict[str, float]:
    out: dict[str, float] = {}
    for pod in live.pods_in(namespace):
        for name, value in pod_requests(pod.get("spec") or {}).items():
            key = name if name.startswith("requests.") or "/" not in name else f"requests.{name}"
            out[key] = out.get(key, 0.0) + value
            if "/" not in name:
                out[f"requests.{name}"] = out.get(f"requests.{name}", 0.0) + value
    return out


def _quota(before: dict[str, Any] | None, now: dict[str, Any], live: _Live) -> Iterator[Impact]:
    meta = now.get("metadata") or {}
    ns, name = str(meta.get("namespace")), str(meta.get("name"))
    hard = dig(now, "spec", "hard") or {}
    old = dig(before, "spec", "hard") or {}
    used = {k: quantity(v) for k, v in (dig(before, "status", "used") or {}).items()} \
        or _used(ns, live)
    for key, value in sorted(hard.items()):
        if quantity(value) >= used.get(key, 0.0) or old.get(key) == value:
            continue
        resource = key.removeprefix("requests.")
        users = sorted({live.owner(p) for p in live.pods_in(ns) if resource in pod_requests(p.get("spec") or {})})
        for owner in users or [f"Namespace {ns}"]:
            yield Impact(owner, "refused", f"ResourceQuota {ns}/{name} spec.hard[{key}] {old.get(key, 'unset')} -> "
                         f"{value}", f"the namespace uses {used.get(key, 0):g} of {resource}: new pods asking for it "
                         "are refused until use drops below the limit",
                         "raise the tenant's quota in the environment file, or move the work first")


def _limit_range(now: dict[str, Any], live: _Live) -> Iterator[Impact]:
    meta = now.get("metadata") or {}
    ns = str(meta.get("namespace"))
    seen: set[str] = set()
    for limit in dig(now, "spec", "limits") or []:
        if limit.get("type") != "Container":
            continue
        default, maximum = limit.get("default") or {}, limit.get("max") or {}
        for pod in live.pods_in(ns):
            for c in containers(pod.get("spec") or {}):
                res = c.get("resources") or {}
                requests, limits = res.get("requests") or {}, res.get("limits") or {}
                for r in ("cpu", "memory"):
                    asked = quantity(requests.get(r, 0))
                    why = None
                    if r not in limits and r in default and asked > quantity(default[r]):
                        why = f"container {c.get('name')} requests {requests[r]} {r} and sets no limit: the new " \
                              f"default limit {default[r]} is below its request"
                    elif r in maximum and max(asked, quantity(limits.get(r, 0))) > quantity(maximum[r]):
                        why = f"container {c.get('name')} asks for more {r} than the new maximum {maximum[r]}"
                    owner = live.owner(pod)
                    if why and owner not in seen:
                        seen.add(owner)
                        yield Impact(owner, "refused", f"LimitRange {ns}/{meta.get('name')} created", why + "; new "
                                     "pods are refused at creation", "set the container's limits in its pod "
                                     "template, or keep adoption.host_defaults: false")


def _resource_names(fleet: Any, cluster: str, live: _Live) -> Iterator[Impact]:
    """Running pods asking for a GPU resource no node advertises once the rollout is done."""
    planned = {n.name: set(n.advertised) for n in fleet.nodes if n.cluster == cluster}
    after: set[str] = set()
    for node in live.nodes:
        name = str(dig(node, "metadata", "name"))
        after |= planned.get(name, {r for r in (dig(node, "status", "allocatable") or {})
                                     if r.startswith(GPU_PREFIX)})
    after |= {r for resources in planned.values() for r in resources}
    seen: set[tuple[str, str]] = set()
    for pod in live.pods:
        for resource in pod_requests(pod.get("spec") or {}):
            if not resource.startswith(GPU_PREFIX) or resource in after:
                continue
            owner = live.owner(pod)
            if (owner, resource) in seen:
                continue
            seen.add((owner, resource))
            yield Impact(owner, "pending", f"no node advertises {resource} after the rollout",
                         f"it asks for {resource}: running pods keep their devices, but replacements stay Pending",
                         f"ask for one of {', '.join(sorted(after)) or 'the advertised resources'} in its pod template "
                         "first, or keep the profile's resource names (rename_by_default)")


def _admission(api: Api, objects: list[dict[str, Any]], live: _Live, report: DiffReport) -> Iterator[Impact]:
    """Each controller's pod template in a tenant namespace, created with dryRun=All: what the cluster's admission
    says now, and what the bindings this rollout moves to Deny will refuse."""
    bindings = {str(o["metadata"]["name"]): (str(o["spec"]["policyName"]), list(o["spec"]["validationActions"]))
                for o in objects if o.get("kind") == "ValidatingAdmissionPolicyBinding"}
    denying = {policy for name, (policy, actions) in bindings.items() if "Deny" in actions
               and "Deny" not in live.bindings.get(name, [])}
    unjudged = sorted(p for p in denying if p not in live.policies or not any(
        n in live.bindings for n, (q, _) in bindings.items() if q == p))
    for policy in unjudged:
        report.not_judged.append(f"ValidatingAdmissionPolicy {policy}: not in the cluster yet, and bound with Deny "
                                 "at once, so no running workload was judged by it; bind it with Warn first "
                                 "(adoption.admission: warn) and diff again")
    tenant_namespaces = {str(o["metadata"]["name"]) for o in objects if o.get("kind") == "Namespace"
                         and "gpushare.io/tenant" in (dig(o, "metadata", "labels") or {})}
    templates: list[tuple[str, str, dict[str, Any]]] = []
    for c in live.controllers:
        meta = c.get("metadata") or {}
        owned = any(r.get("controller") for r in meta.get("ownerReferences") or [])
        template = template_of(c)
        if meta.get("namespace") in tenant_namespaces and template and not owned:
            templates.append((ident(c), str(meta["namespace"]), template))
    for pod in live.pods:
        meta = pod.get("metadata") or {}
        if meta.get("namespace") in tenant_namespaces and not meta.get("ownerReferences"):
            templates.append((ident(pod), str(meta["namespace"]), {"metadata": meta, "spec": pod.get("spec")}))
    for workload, ns, template in templates:
        tmeta = template.get("metadata") or {}
        spec = {k: v for k, v in (template.get("spec") or {}).items() if k != "nodeName"}
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "generateName": "gpushare-diff-", "namespace": ns, "labels": tmeta.get("labels") or {},
            "annotations": tmeta.get("annotations") or {}}, "spec": spec}
        answer = api.create_dry_run(pod)
        if not answer.ok and answer.status not in (401, 403) or answer.status == 403 and "denied" in str(
                answer.body.get("message", "")):
            yield Impact(workload, "denied", "admission as the cluster runs it now",
                         str(answer.body.get("message", answer.status))[:400],
                         "make its pod template pass, or stage the policy (adoption.admission: warn)")
            continue
        for text in answer.warnings:
            if POLICY_WARNING not in text:
                continue
            policy = text.split(POLICY_WARNING, 1)[1].split("'", 1)[0]
            if policy in denying:
                binding = next(n for n, (p, _) in bindings.items() if p == policy)
                yield Impact(workload, "denied", f"ValidatingAdmissionPolicyBinding {binding} validationActions "
                             f"{live.bindings.get(binding, [])} -> ['Deny']", text[:400],
                             "make its pod template pass (the message says how), or keep adoption.admission: warn")


def _operator(fleet: Any, live: _Live, report: DiffReport) -> Iterator[Impact]:
    """The ClusterPolicy settings the pinned chart with gpushare's values changes, and the operands that restart."""
    for cp in live.cluster_policies:
        name = f"ClusterPolicy {dig(cp, 'metadata', 'name')}"
        spec = cp.get("spec") or {}
        changes = operator_changes(spec, fleet.environment, fleet.env.defaults.driver_branch,
                                   fleet.env.defaults.toolkit_version)
        restarted: dict[str, list[str]] = {}
        for change in changes:
            report.changes.append(Change(name, f"spec.{change.path}", "(the cluster's)", change.reason))
            section = change.path.split(".")[0]
            if section in OPERANDS:
                restarted.setdefault(section, []).append(change.path)
        dp = dig(spec, "devicePlugin", "config") or {}

        if dp.get("name") != DEVICE_PLUGIN_CONFIGMAP:
            restarted.setdefault("devicePlugin", []).append("devicePlugin.config.name")
            report.changes.append(Change(name, "spec.devicePlugin.config.name", dp.get("name"),
                                         DEVICE_PLUGIN_CONFIGMAP))
        for section, paths in sorted(restarted.items()):
            breaks = section == "driver" and any(p == "driver.enabled" for p in paths)
            yield Impact(f"DaemonSet gpu-operator/{OPERANDS[section]}", "evicted" if breaks else "restarted",
                         f"{name} spec.{', spec.'.join(paths)}",
                         "the operator's driver container goes away: GPU pods on nodes without a host driver break"
                         if breaks else "its pods restart with the new values; running GPU pods keep their devices",
                         "install the driver branch on every host first (Ansible's driver check), then accept"
                         if breaks else "nothing to do; it is said so that it is no surprise")
