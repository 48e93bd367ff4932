"""NvidiaStack: the GPU Operator (NVIDIA's pinned Helm chart) for one cluster, with every sharing config the cluster
uses, the mig-parted configs of operator-managed MIG nodes, and the DCGM host-engine choice (docs/nvidia-stack.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi_kubernetes.apiextensions import CustomResource
from pulumi_kubernetes.apps.v1 import DaemonSet
from pulumi_kubernetes.core.v1 import ConfigMap, Namespace, ResourceQuota, Service
from pulumi_kubernetes.helm.v3 import Release

from gpushare.core import dra, spec
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.nvidia.operator import gpu_operator_chart_values
from gpushare.core.resolve import ResolvedFleet
from gpushare.core.stacks import OPERATOR_VALUES_KEY
from gpushare.policy.device_plugin import RENAMING_FIX, renaming_findings, settings_problems
from gpushare.program.components import dra_driver
from gpushare.program.components import operator_values as ov
from gpushare.program.stack_config import ChartSource

HOST_EXPORTER = "gpushare-dcgm-exporter-host"
# The selector the operator's own exporter DaemonSet uses; opted-out hosts carry "false".
DCGM_EXPORTER_DEPLOY_LABEL = "nvidia.com/gpu.deploy.dcgm-exporter"
COUNTERS_DIR = "/etc/dcgm-exporter/gpushare"


def manifest(body: dict[str, Any]) -> Any:
    """A plain Kubernetes object body; the SDK's TypedDicts do not model nested plain dicts for the type checker."""
    return body


@dataclass
class NvidiaStackArgs:
    fleet: ResolvedFleet
    cluster: spec.Cluster
    monitoring_release: str
    provider: pulumi.ProviderResource | None = None  # the cluster's Kubernetes provider
    # Device-plugin configs no longer in the environment that nodes still use: name -> content.
    kept_device_plugin_configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    site_values: dict[str, Any] = field(default_factory=dict)
    protect: bool = False
    # What must exist before the operator: node opt-out labels, the monitoring stack's CRDs.
    after: list[pulumi.Resource] = field(default_factory=list)
    gke_driver_installer: str | None = None
    charts: ChartSource = field(default_factory=ChartSource)


@dataclass(frozen=True)
class PreparedStack:
    gpus: ov.ClusterGpus
    device_plugin_data: dict[str, str]
    mig_parted_data: dict[str, str] | None
    dcgm_counters_data: dict[str, str]
    values: dict[str, Any]
    driver_installer: str | None


def prepare(args: NvidiaStackArgs) -> PreparedStack:
    """Everything the stack registers, computed and checked before any resource exists."""
    fleet, cluster = args.fleet, args.cluster
    gpus = ov.ClusterGpus.of(fleet, cluster)
    dp_data = ov.device_plugin_configmap_data(fleet, gpus, args.kept_device_plugin_configs)
    mig_data = ov.mig_parted_configmap_data(fleet, gpus) if gpus.needs_mig_manager else None
    counters = ov.dcgm_counters_configmap_data(fleet)
    values = ov.operator_values(
        fleet, gpus, device_plugin_hash=ov.content_hash(dp_data),
        mig_parted_hash=ov.content_hash(mig_data) if mig_data else None,
        dcgm_counters_hash=ov.content_hash(counters), monitoring_release=args.monitoring_release)
    if dra.is_dra(cluster):
        values = dra_driver.operator_values(values, fleet, cluster)
    values = ov.merge_site_values(values, args.site_values)
    _check(values, gpus)
    return PreparedStack(gpus, dp_data, mig_data, counters, values, _driver_installer(args, gpus))


def _check(values: dict[str, Any], gpus: ov.ClusterGpus) -> None:
    problems = ov.check_chart_values(values)
    problems += [Problem(msg, fix="fix the cluster's cdi / mig_strategy or drop the devicePlugin.env override")
                 for msg in settings_problems(values, gpus.cluster)]
    # GPUs advertised under other names than the environment gives would be past every quota (policy.device_plugin).
    problems += [Problem(why, path=f"{OPERATOR_VALUES_KEY}.{where}", fix=RENAMING_FIX)
                 for where, why in renaming_findings(values, gpus.cluster.mig_strategy)]
    missed = ov.untolerated(gpus.taints, values["daemonsets"]["tolerations"])
    problems += [Problem(f"pool taint {t.key}={t.value}:{t.effect} is not tolerated by the operator's "
                         "daemonsets.tolerations: its operands would never reach those nodes",
                         fix="extend daemonsets.tolerations") for t in missed]
    if problems:
        where = f"cluster {gpus.cluster.name}: "
        raise GpushareError([Problem(where + p.message, file=p.file, path=p.path, fix=p.fix) for p in problems])


def _driver_installer(args: NvidiaStackArgs, gpus: ov.ClusterGpus) -> str | None:
    if args.cluster.kind != "gke" or not gpus.operator_nodes:
        return None
    if not args.gke_driver_installer:
        raise GpushareError(Problem(
            f"cluster {args.cluster.name!r} has operator-managed GKE pools, whose GKE driver installation is "
            "disabled: Google's driver-installer DaemonSet must install the driver",
            path=f"gpushare:clusters.{args.cluster.name}.gke.driverInstallerManifest",
            fix="name the manifest for the pools' node image (container-engine-accelerators "
                "nvidia-driver-installer/cos/daemonset-preloaded.yaml for COS, or its site mirror)"))
    return args.gke_driver_installer


class NvidiaStack(pulumi.ComponentResource):
    release: Release

    def __init__(self, name: str, args: NvidiaStackArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpushare:nvidia:NvidiaStack", name, None, opts)
        cluster = args.cluster
        prepared = prepare(args)
        gpus, values, installer = prepared.gpus, prepared.values, prepared.driver_installer
        dp_data, mig_data = prepared.device_plugin_data, prepared.mig_parted_data
        self.values = values
        if args.provider is None:
            raise GpushareError(f"cluster {cluster.name!r}: the NVIDIA stack needs the cluster's Kubernetes provider")
        k8s = pulumi.ResourceOptions(parent=self, provider=args.provider)
        namespace = Namespace(f"{name}-namespace", metadata={
            "name": ov.NAMESPACE,
            # Operands need host access: the namespace must admit privileged pods.
            "labels": {"pod-security.kubernetes.io/enforce": "privileged"},
        }, opts=k8s)
        in_ns = pulumi.ResourceOptions.merge(k8s, pulumi.ResourceOptions(depends_on=[namespace]))
        before_release: list[pulumi.Resource] = [namespace, *args.after]
        if cluster.kind == "gke":
            # GKE admits system-node-critical pods outside kube-system only under a quota (NVIDIA's GKE steps).
            before_release.append(ResourceQuota(f"{name}-gke-priority-quota", metadata={
                "name": "gpu-operator-quota", "namespace": ov.NAMESPACE,
            }, spec=manifest({
                "hard": {"pods": "100"},
                "scopeSelector": {"matchExpressions": [{
                    "operator": "In", "scopeName": "PriorityClass",
                    "values": ["system-node-critical", "system-cluster-critical"],
                }]},
            }), opts=in_ns))
        if installer:
            from pulumi_kubernetes.yaml.v2 import ConfigFile

            before_release.append(ConfigFile(f"{name}-gke-driver-installer", file=installer, opts=k8s))
        before_release.append(ConfigMap(f"{name}-device-plugin-configs", metadata={
            "name": ov.DEVICE_PLUGIN_CONFIGMAP, "namespace": ov.NAMESPACE,
            "labels": {"app.kubernetes.io/managed-by": "gpushare"},
        }, data=dp_data, opts=in_ns))
        before_release.append(ConfigMap(f"{name}-dcgm-exporter-counters", metadata={
            "name": ov.DCGM_COUNTERS_CONFIGMAP, "namespace": ov.NAMESPACE,
            "labels": {"app.kubernetes.io/managed-by": "gpushare"},
        }, data=prepared.dcgm_counters_data, opts=in_ns))
        if mig_data:
            before_release.append(ConfigMap(f"{name}-mig-parted-config", metadata={
                "name": ov.MIG_PARTED_CONFIGMAP, "namespace": ov.NAMESPACE,
                "labels": {"app.kubernetes.io/managed-by": "gpushare"},
            }, data=mig_data, opts=in_ns))

        self.release = Release(
            f"{name}-gpu-operator",
            name=ov.RELEASE,  # fixed, so `helm list -n gpu-operator` shows it under this name
            **args.charts.release_args("gpu-operator", ov.CHART, ov.CHART_VERSION, ov.CHART_REPOSITORY),
            namespace=ov.NAMESPACE, values=values,
            opts=pulumi.ResourceOptions.merge(k8s, pulumi.ResourceOptions(
                depends_on=before_release, protect=args.protect)),
        )
        if gpus.mixed:
            self._host_exporter(name, values, in_ns, args)
            if cluster.cdi and values["toolkit"]["enabled"]:
                hook = f"{values['toolkit'].get('installDir', gpu_operator_chart_values()['toolkit']['installDir'])}" \
                       "/toolkit/nvidia-cdi-hook"
                pulumi.log.warn(
                    f"cluster {cluster.name} mixes Ansible-managed and operator-managed hosts with CDI: the operator "
                    f"gives every node's device plugin NVIDIA_CDI_HOOK_PATH={hook}, so the Ansible-managed hosts "
                    "need nvidia-cdi-hook at that path too")
        self.register_outputs({"release": self.release.name, "values": values})

    def _host_exporter(self, name: str, values: dict[str, Any], opts: pulumi.ResourceOptions,
                       args: NvidiaStackArgs) -> None:
        """Mixed clusters: hosts that run DCGM themselves opt out of the operator's exporter and get this one,
        which reads the host engine over the host network."""
        chart = gpu_operator_chart_values()["dcgmExporter"]
        image = f"{chart['repository']}/{chart['image']}:{chart['version']}"
        # The same counters and per-pod settings as the operator's exporter; the host engine replaces its own.
        extra_env = {e["name"]: e["value"] for e in values["dcgmExporter"]["env"]
                     if e["name"] != "DCGM_REMOTE_HOSTENGINE_INFO"}
        labels = {"app": HOST_EXPORTER, "app.kubernetes.io/managed-by": "gpushare"}
        DaemonSet(f"{name}-dcgm-exporter-host", metadata={
            "name": HOST_EXPORTER, "namespace": ov.NAMESPACE, "labels": labels,
        }, spec=manifest({
            "selector": {"matchLabels": {"app": HOST_EXPORTER}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {DCGM_EXPORTER_DEPLOY_LABEL: "false"},
                    "tolerations": values["daemonsets"]["tolerations"],
                    "priorityClassName": "system-node-critical",
                    "hostNetwork": True,
                    "dnsPolicy": "ClusterFirstWithHostNet",
                    "automountServiceAccountToken": False,
                    "containers": [{
                        "name": "dcgm-exporter",
                        "image": image,
                        "env": [
                            {"name": "DCGM_REMOTE_HOSTENGINE_INFO", "value": ov.HOST_DCGM_ENGINE},
                            {"name": "DCGM_EXPORTER_LISTEN", "value": ":9400"},
                            {"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"},
                            {"name": "DCGM_EXPORTER_COLLECTORS", "value": f"{COUNTERS_DIR}/{ov.DCGM_COUNTERS_KEY}"},
                            *({"name": k, "value": v} for k, v in extra_env.items()),
                            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        ],
                        "ports": [{"name": "metrics", "containerPort": 9400}],
                        "readinessProbe": {"httpGet": {"port": 9400, "path": "/health"}, "initialDelaySeconds": 45},
                        "volumeMounts": [
                            {"name": "pod-gpu-resources", "readOnly": True,
                             "mountPath": "/var/lib/kubelet/pod-resources"},
                            {"name": "counters", "readOnly": True, "mountPath": COUNTERS_DIR},
                        ],
                    }],
                    "volumes": [
                        {"name": "pod-gpu-resources", "hostPath": {"path": "/var/lib/kubelet/pod-resources"}},
                        {"name": "counters", "configMap": {"name": ov.DCGM_COUNTERS_CONFIGMAP}},
                    ],
                },
            },
        }), opts=opts)
        Service(f"{name}-dcgm-exporter-host", metadata={
            "name": HOST_EXPORTER, "namespace": ov.NAMESPACE, "labels": labels,
        }, spec=manifest({
            "selector": {"app": HOST_EXPORTER},
            "ports": [{"name": "metrics", "port": 9400, "targetPort": 9400, "protocol": "TCP"}],
        }), opts=opts)
        CustomResource(f"{name}-dcgm-exporter-host", api_version="monitoring.coreos.com/v1", kind="ServiceMonitor",
                       metadata={"name": HOST_EXPORTER, "namespace": ov.NAMESPACE,
                                 "labels": {**labels, "release": args.monitoring_release}},
                       spec={
                           "selector": {"matchLabels": {"app": HOST_EXPORTER}},
                           "endpoints": [{"port": "metrics", "interval": "15s", "honorLabels": True}],
                       }, opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=args.after)))
