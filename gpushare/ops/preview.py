"""The offline preview: the Pulumi program (`infra/__main__.py`) run under the Pulumi SDK's mock engine exactly as
`pulumi up` loads it, its registered resources collected as a plan, every Kubernetes object validated (built-in
kinds against the Kubernetes OpenAPI schemas bundled in kubernetes-validate, strict, at pinned minors; custom
resources against the CRDs in gpushare/data), and the objects written as YAML for review.

`collect_plan(env)` is the library entry point the policy pack and `gpushare check` use."""

from __future__ import annotations

import json
import logging
import re
import runpy
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from gpushare.core import kubeversions
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.files import complete_swap, replace_dirs, write_file, yaml_text
from gpushare.core.paths import package_data_path, project_root
from gpushare.core.reading import load_yaml_file
from gpushare.core.spec import load_environment
from gpushare.core.stacks import ENVIRONMENT_KEY, environment_file, stack_config
from gpushare.policy.registry import PlanResource
from gpushare.program import main as package_program
from gpushare.render.fleet import MARKER as RENDER_MARKER
from gpushare.render.fleet import PREVIEW_MARKER

# A preview validates each cluster's objects against the strict schemas of that cluster's kubernetes_version
# (gpushare.core.kubeversions.schema_minor). These are the minors `validate_object` checks when asked for none: the
# oldest and newest minors gpushare supports.
KUBERNETES_VERSIONS = (kubeversions.text(kubeversions.OLDEST), kubeversions.text(kubeversions.NEWEST))
# DRA objects (resource.k8s.io/v1: DeviceClass, ResourceClaimTemplate) exist from 1.34: checked at 1.34 and the latest.
DRA_API_GROUP = "resource.k8s.io/"
DRA_KUBERNETES_VERSIONS = ("1.34", "1.37")
DATA = package_data_path()
MARKER = PREVIEW_MARKER  # beside `gpushare render` output, which keeps what this marks
NOT_CHECKED = (
    "This is an offline preview: the Pulumi program ran under the Pulumi SDK's mock engine, which echoes inputs as "
    "outputs; no cluster, cloud API or chart repository was contacted.",
    "Not checked: Helm chart rendering (the GPU Operator, DRA driver and kube-prometheus-stack charts are not "
    "templated here; only the GPU Operator and DRA driver values are checked against the pinned charts' values.yaml "
    "and the ClusterPolicy CRD).",
    "Not checked: objects the GPU Operator creates at run time (operand DaemonSets, its ServiceMonitor, the node "
    "labels it sets) and the state of the nodes themselves.",
    "Not checked: cloud API validation of GKE node pools and EKS node groups (machine types, accelerator "
    "availability, quotas, IAM), and remote manifests such as Google's driver installer.",
)
_NOT_OBJECTS = ("kubernetes:helm.sh/v3:Release", "kubernetes:yaml/v2:ConfigFile")
# Settings a stack needs and lacks, as the program reports them (a cluster's kubeconfig context, a GKE or EKS
# cluster's identity, the monitoring stack): the input cannot be used (exit 2), as with a missing key, where a value
# the program refuses is invalid (exit 1).
_MISSING_SETTING = re.compile(r"gpushare:(clusters\.[^.]+\.(kubeconfigContext|gke|eks)|monitoring)")


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True)
class PlannedResource:
    """One registered resource: Pulumi type token, logical name, inputs, and where it sits in the graph."""

    type: str
    name: str
    urn: str
    inputs: Mapping[str, Any]
    parent: str | None = None  # URN
    dependencies: tuple[str, ...] = ()  # URNs
    provider: str | None = None  # URN of the explicit provider
    custom: bool = True
    protect: bool = False

    @property
    def is_kubernetes_object(self) -> bool:
        return (self.custom and self.type.startswith("kubernetes:") and self.type not in _NOT_OBJECTS)

    def as_dict(self) -> dict[str, Any]:
        return {"type": self.type, "name": self.name, "inputs": self.inputs}


@dataclass
class Plan:
    stack: str
    resources: list[PlannedResource]
    outputs: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    config: Mapping[str, Any] = field(default_factory=dict)  # the stack config the program ran with

    def by_urn(self) -> dict[str, PlannedResource]:
        return {r.urn: r for r in self.resources}

    def of_type(self, suffix: str) -> list[PlannedResource]:
        return [r for r in self.resources if r.type.endswith(suffix)]

    def cluster_of(self, resource: PlannedResource) -> str:
        """The name of the Kubernetes provider (one per cluster) a resource goes through."""
        if resource.provider:
            return resource.provider.rsplit("::", 1)[-1]
        return "-"


def _plain(value: Any) -> Any:
    """Protobuf numbers come back as floats: give integral ones back their int type; and protobuf maps have no order:
    give every map a stable one."""
    kind = type(value)
    if kind is dict:
        return {k: _plain(value[k]) for k in sorted(value)}
    if kind is list:
        return [_plain(v) for v in value]
    if kind is float and value.is_integer():
        return int(value)
    return value


class _WarningLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def plan_resources(env: str) -> list[PlanResource]:
    """The Pulumi program's offline plan as the guardrail rules read it (one resource per entry, with its cluster):
    what `gpushare check`, `rollout` and `promote` judge."""
    plan = collect_plan(env)
    return [PlanResource(type=r.type, name=r.name, inputs=r.inputs, cluster=plan.cluster_of(r))
            for r in plan.resources]


_ENGINE_LOCK = threading.Lock()


def collect_plan(env: str, config: Mapping[str, Any] | None = None, *, stack: str | None = None,
                 program: Path | None = None) -> Plan:
    """Run the Pulumi program for a stack under the SDK's mock engine and return every registered resource.

    `config` replaces the stack file's config (tests, benchmarks); `program` replaces infra/__main__.py."""
    if config is None:
        stack_name, cfg, notes = stack_config(env)
    else:
        stack_name, cfg, notes = stack or env, dict(config), []
    with _ENGINE_LOCK:
        plan = _run_program(program or program_file(), stack_name, cfg)
    plan.warnings[:0] = notes
    plan.config = dict(cfg)
    return plan


def cluster_minors(plan: Plan) -> dict[str, str]:
    """Each cluster's kubernetes_version, from the environment file the stack's config names ({} if unreadable:
    the program has already said why)."""
    value = plan.config.get(ENVIRONMENT_KEY)
    if not value:
        return {}
    try:
        env, _ = load_environment(environment_file(value))
    except GpushareError:
        return {}
    return {c.name: c.kubernetes_version for c in env.clusters}


def program_file() -> Path:
    """What `pulumi up` runs: the program Pulumi.yaml's `main` names in the workspace (infra/__main__.py in the
    workspaces `gpushare init` writes), else the package's program itself (which that launcher calls)."""
    root = project_root()
    project = root / "Pulumi.yaml"
    if project.is_file():
        _, data = load_yaml_file(project, "Pulumi project file")
        main = root / str(data.get("main", ".") if isinstance(data, dict) else ".")
        launcher = main / "__main__.py" if main.is_dir() else main
        if launcher.is_file():
            return launcher

    return Path(package_program.__file__)


def _run_program(program: Path, stack_name: str, cfg: Mapping[str, Any]) -> Plan:
    import pulumi
    from pulumi.runtime import stack as pulumi_stack
    from pulumi.runtime.mocks import MockMonitor
    from pulumi.runtime.sync_await import _sync_await

    class EchoMocks(pulumi.runtime.Mocks):
        def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
            return f"{args.name}-id", args.inputs

        def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
            return {}, None

    records: list[tuple[Any, str]] = []

    class RecordingMonitor(MockMonitor):
        def RegisterResource(self, request: Any) -> Any:  # noqa: N802 - the gRPC method name
            response = super().RegisterResource(request)
            if request.type != "pulumi:pulumi:Stack":
                records.append((request, response.urn))
            return response

    log = logging.Logger("gpushare.preview", logging.WARNING)  # the engine's debug lines are not kept
    handler = _WarningLog()
    log.addHandler(handler)
    mocks = EchoMocks()
    monitor = RecordingMonitor(mocks)
    pulumi_stack.set_root_resource(None)  # type: ignore[arg-type]
    pulumi.runtime.set_mocks(mocks, project="gpushare", stack=stack_name, preview=True, logger=log, monitor=monitor)
    pulumi.runtime.set_all_config({k: v if isinstance(v, str) else json.dumps(v) for k, v in cfg.items()})
    try:
        runpy.run_path(str(program), run_name="__main__")
        _sync_await(pulumi_stack.wait_for_rpcs())
    except pulumi.ConfigMissingError as exc:  # a RunError too: first
        raise GpushareError(Problem(f"missing setting {exc.key}", file=f"Pulumi.{stack_name}.yaml",
                                    fix=f"add {exc.key} to the stack's config"), exit_code=2) from None
    except pulumi.RunError as exc:
        cause = exc.__cause__
        if isinstance(cause, GpushareError):
            if cause.exit_code == 1 and all(p.path and _MISSING_SETTING.fullmatch(p.path) for p in cause.problems):
                raise GpushareError(cause.problems, exit_code=2) from None
            raise cause from None
        raise GpushareError(str(exc)) from None
    root = pulumi_stack.get_root_resource()
    outputs: dict[str, Any] = {}
    for key, value in dict(getattr(root, "outputs", {}) or {}).items():
        outputs[key] = _plain(_sync_await(pulumi.Output.from_input(value).future()))

    resources = []
    for request, urn in records:
        registered = monitor.resources.get(urn)
        state = dict(registered.state) if registered is not None else {}
        resources.append(PlannedResource(
            type=request.type, name=request.name, urn=urn, inputs=_plain(state),
            parent=request.parent or None, dependencies=tuple(sorted(request.dependencies)),
            provider=request.provider.rsplit("::", 1)[0] if request.provider else None,
            custom=bool(request.custom), protect=bool(request.protect)))
    return Plan(stack=stack_name, resources=_tree_order(resources), outputs=outputs, warnings=handler.messages)


def _tree_order(resources: list[PlannedResource]) -> list[PlannedResource]:
    children: dict[str | None, list[PlannedResource]] = {}
    urns = {r.urn for r in resources}
    for r in resources:
        children.setdefault(r.parent if r.parent in urns else None, []).append(r)
    out: list[PlannedResource] = []

    def visit(parent: str | None) -> None:
        for r in sorted(children.get(parent, []), key=lambda r: (r.type, r.name)):
            out.append(r)
            visit(r.urn)

    visit(None)
    return out


# ---------------------------------------------------------------- Kubernetes objects


@dataclass(frozen=True)
class KubernetesObject:
    cluster: str
    resource: PlannedResource
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.body.get("kind", ""))

    @property
    def label(self) -> str:
        meta = self.body.get("metadata", {})
        where = f"{meta.get('namespace')}/" if meta.get("namespace") else ""
        return f"{self.kind} {where}{meta.get('name')} (cluster {self.cluster}, {self.resource.name})"

    @property
    def path(self) -> str:
        meta = self.body.get("metadata", {})
        parts = [self.kind.lower(), meta.get("namespace"), meta.get("name")]
        return f"{self.cluster}/" + "-".join(str(p) for p in parts if p) + ".yaml"


def kubernetes_objects(plan: Plan) -> list[KubernetesObject]:
    out = []
    for r in plan.resources:
        if r.is_kubernetes_object:
            body = {k: r.inputs[k] for k in ("apiVersion", "kind", "metadata") if k in r.inputs}
            body.update({k: v for k, v in r.inputs.items() if k not in body})
            out.append(KubernetesObject(plan.cluster_of(r), r, body))
    return out


@cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> openAPIV3Schema, for every CRD copied into gpushare/data."""
    schemas = {}
    for path in sorted(DATA.glob("crd-*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd:
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                if version.get("served", True):
                    schemas[(f"{group}/{version['name']}", kind)] = version["schema"]["openAPIV3Schema"]
    return schemas


@cache
def _kubernetes_validator(version: str, api_version: str, kind: str) -> Any:
    """kubernetes-validate's bundled strict schema for a built-in kind at a Kubernetes minor, the way its
    `validate` picks it, compiled once (its own `validate` reloads all definitions on every call)."""
    import jsonschema
    import referencing
    from kubernetes_validate import utils as kv

    bundled = [v for v in kv.all_versions() if _minor(v) <= _minor(version)]
    if not bundled:
        raise GpushareError(f"kubernetes-validate bundles no schema for Kubernetes {version}")
    schema_dir = f"v{bundled[-1]}-local-strict"
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = kv.schema_contents(f"kubernetes-json-schema/{schema_dir}/{kind.lower()}-{group}.json", version)
    except FileNotFoundError:
        return None
    definitions = _definitions(schema_dir, version)
    registry = referencing.Resource.from_contents(schema) @ referencing.Registry()
    registry = definitions @ registry
    return jsonschema.Draft202012Validator(schema, registry=registry)


@cache
def _definitions(schema_dir: str, version: str) -> Any:
    import referencing
    from kubernetes_validate import utils as kv

    return referencing.Resource.from_contents(
        kv.schema_contents(f"kubernetes-json-schema/{schema_dir}/_definitions.json", version))


def _minor(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:2])


def _unknown_fields(value: Any, schema: Mapping[str, Any], path: str) -> Iterable[str]:
    """Fields a structural CRD schema would prune silently: reported, since a pruned field is a lost setting."""
    if isinstance(value, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, child in value.items():
            where = f"{path}.{key}"
            if props is not None and key in props:
                yield from _unknown_fields(child, props[key], where)
            elif isinstance(extra, dict):
                yield from _unknown_fields(child, extra, where)
            elif props is not None and not extra:
                yield where
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            yield from _unknown_fields(item, schema["items"], f"{path}[{i}]")


def versions_for(api_version: str, versions: Iterable[str]) -> tuple[str, ...]:
    """The minors an object is checked at: DRA kinds at the asked minors that serve them and the DRA ones."""
    versions = tuple(versions)
    if not api_version.startswith(DRA_API_GROUP):
        return versions
    return tuple(sorted({*(v for v in versions if _minor(v) >= _minor(DRA_KUBERNETES_VERSIONS[0])),
                         *DRA_KUBERNETES_VERSIONS}, key=_minor))


def validate_object(obj: KubernetesObject, versions: Iterable[str] = KUBERNETES_VERSIONS) -> list[str]:
    import jsonschema

    body, errors = obj.body, []
    key = (str(body.get("apiVersion")), obj.kind)
    crd = crd_schemas().get(key)
    if crd is not None:
        for err in jsonschema.Draft7Validator(crd).iter_errors(body):
            where = ".".join(str(p) for p in err.absolute_path) or "(object)"
            errors.append(f"{obj.label}: {where}: {err.message} (CRD schema)")
        for where in _unknown_fields({k: v for k, v in body.items() if k != "metadata"}, crd, ""):
            errors.append(f"{obj.label}: {where.lstrip('.')}: unknown field, the API server would drop it "
                          "(CRD schema)")
        return errors
    for version in versions_for(key[0], versions):
        validator = _kubernetes_validator(version, *key)
        if validator is None:
            errors.append(f"{obj.label}: no schema for {key[1]} {key[0]} in Kubernetes {version} or the CRDs in "
                          "gpushare/data")
            continue
        for err in validator.iter_errors(body):
            where = ".".join(str(p) for p in err.absolute_path) or "(object)"
            errors.append(f"{obj.label}: {where}: {err.message} (Kubernetes {version}, strict)")
    return errors


# ---------------------------------------------------------------- checks across the plan


def _allowlisted_labels(values: Mapping[str, Any]) -> set[str]:
    entries = values.get("kube-state-metrics", {}).get("metricLabelsAllowlist", []) or []
    found: set[str] = set()
    for entry in entries:
        m = re.fullmatch(r"\s*nodes=\[(.*)\]\s*", str(entry))
        if m:
            found.update("label_" + re.sub(r"[^a-zA-Z0-9_]", "_", lab.strip()) for lab in m.group(1).split(","))
    return found


def check_node_label_allowlist(plan: Plan) -> list[str]:
    """Alert rules that read node labels through kube_node_labels need kube-state-metrics to export them: each
    label_* they read must be in the allowlist of the kube-prometheus-stack this program installs."""
    errors = []
    releases: dict[str, set[str]] = {}
    for r in plan.of_type("helm.sh/v3:Release"):
        if r.inputs.get("chart") == "kube-prometheus-stack":
            releases.setdefault(plan.cluster_of(r), set()).update(_allowlisted_labels(r.inputs.get("values", {})))
    for r in plan.of_type(":PrometheusRule"):
        cluster = plan.cluster_of(r)
        if cluster not in releases:
            continue  # an existing release: the program warns that its allowlist is not visible here
        for group in r.inputs.get("spec", {}).get("groups", []):
            for rule in group.get("rules", []):
                expr = str(rule.get("expr", ""))
                if "kube_node_labels" not in expr:
                    continue
                for label in sorted(set(re.findall(r"\blabel_[a-zA-Z0-9_]+\b(?!\s*\()", expr)) - releases[cluster]):
                    errors.append(
                        f"rule {rule.get('alert') or rule.get('record')} (cluster {cluster}) reads {label} from "
                        "kube_node_labels, but kube-state-metrics' --metric-labels-allowlist does not export it")
    return errors


# ---------------------------------------------------------------- the whole preview


@dataclass
class PreviewResult:
    plan: Plan | None
    objects: list[KubernetesObject]
    errors: list[str]
    warnings: list[str]
    written: list[Path] = field(default_factory=list)
    checked_at: dict[str, str] = field(default_factory=dict)  # cluster -> the Kubernetes minor its objects met

    @property
    def ok(self) -> bool:
        return not self.errors

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "resources": [r.as_dict() for r in self.plan.resources] if self.plan else [],
            "errors": self.errors,
            "warnings": self.warnings,
            "not_checked": list(NOT_CHECKED),
        }


def run_preview(env: str, out: Path | None = None, versions: Iterable[str] | None = None,
                config: Mapping[str, Any] | None = None) -> PreviewResult:
    """Collect the plan, validate every Kubernetes object (against its cluster's Kubernetes minor, or at `versions`
    when given), and, only when all is valid, write the manifests."""
    plan = collect_plan(env, config)
    objects = kubernetes_objects(plan)
    minors = {cluster: kubeversions.schema_minor(v) for cluster, v in cluster_minors(plan).items()}
    fallback = KUBERNETES_VERSIONS[-1]

    def at(obj: KubernetesObject) -> tuple[str, ...]:
        return tuple(versions) if versions is not None else (minors.get(obj.cluster, fallback),)

    errors = [e for obj in objects for e in validate_object(obj, at(obj))]
    errors += check_node_label_allowlist(plan)
    seen: dict[str, KubernetesObject] = {}
    for obj in objects:
        if obj.path in seen:
            errors.append(f"{obj.label} and {seen[obj.path].label} are the same object")
        seen[obj.path] = obj
    result = PreviewResult(plan, objects, errors, list(plan.warnings),
                           checked_at={c: at(o)[0] for o in objects for c in [o.cluster]} if versions is None else {})
    if out is not None and result.ok:
        result.written = write_manifests(plan, objects, out)
    return result


def write_manifests(plan: Plan, objects: list[KubernetesObject], out: Path) -> list[Path]:
    """Replace DIR/manifests (every Kubernetes object) and DIR/helm-values (each release's values) together, in one
    step as far as a reader can tell (gpushare.core.files.replace_dirs: an interruption or a full disk leaves the
    previous preview whole); anything else in DIR (such as `gpushare render` output) stays."""
    for part in ("manifests", "helm-values"):
        complete_swap(out / part)

    if out.exists() and not out.is_dir():
        raise GpushareError(Problem(f"{out} is not a directory", fix="choose a directory"), exit_code=2)
    if out.exists() and any(out.iterdir()) and not ((out / MARKER).exists() or (out / RENDER_MARKER).exists()):
        raise GpushareError(Problem(f"{out} exists and was not written by gpushare", fix="choose an empty or new "
                                    "directory"), exit_code=2)
    fresh = not out.exists() or not any(out.iterdir())
    written: list[Path] = []

    def manifests(tmp: Path) -> None:
        for obj in objects:
            target = tmp / obj.path
            target.parent.mkdir(parents=True, exist_ok=True)
            kind = "server-side apply patch" if obj.resource.type.endswith("Patch") else obj.resource.type
            header = f"# {kind} {obj.resource.name}: offline preview of stack {plan.stack}\n"
            target.write_text(header + yaml_text(obj.body), encoding="utf-8")
            written.append(out / "manifests" / obj.path)

    def helm_values(tmp: Path) -> None:
        for r in plan.of_type("helm.sh/v3:Release"):
            rel = f"{plan.cluster_of(r)}/{r.inputs.get('name') or r.name}.yaml"
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f"# values of Helm release {r.inputs.get('name')} (chart {r.inputs.get('chart')} "
                              f"{r.inputs.get('version')}): offline preview of stack {plan.stack}\n"
                              + yaml_text(r.inputs.get("values", {})), encoding="utf-8")
            written.append(out / "helm-values" / rel)

    replace_dirs({out / "manifests": manifests, out / "helm-values": helm_values})
    write_file(out / MARKER, "manifests/ and helm-values/ are replaced by each `gpushare preview`\n")
    if fresh:
        # A directory gpushare created: `gpushare render` may replace it too.
        write_file(out / RENDER_MARKER, "written by gpushare; the whole directory is replaced on each render\n")
    return written
