"""The labels gpushare puts on a GPU node, and who sets each: Pulumi through the Kubernetes API, or Ansible on the
hosts it manages, after the work a label stands for is done (a MIG layout applied, a toolkit installed). One owner
per label, so the two never overwrite each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpushare.core import spec

Owner = Literal["pulumi", "ansible"]
# Who runs the NVIDIA stack on a node: Ansible on a bare-metal host, the GPU Operator on a cloud node, or GKE itself
# where its own device plugin shares the GPUs.
ManagedBy = Literal["ansible", "gpu-operator", "gke"]

DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
OPERATOR_MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_CONFIG_LABEL = "gpushare.io/mig-config"
MIG_STATE_LABEL = "gpushare.io/mig-config.state"
# Set by Ansible with the other labels it owns, after its toolkit role installed this version: evidence for promotion.
TOOLKIT_VERSION_LABEL = "gpushare.io/toolkit-version"


@dataclass(frozen=True)
class Label:
    value: str
    owner: Owner


def identity_labels(environment: str, pool: spec.Pool, profile: str, kind: str, gpu_slug: str) -> dict[str, Label]:
    """What the node is (Pulumi's on every node), then the pool's own labels."""
    labels = {
        "gpushare.io/environment": Label(environment, "pulumi"),
        "gpushare.io/pool": Label(pool.name, "pulumi"),
        "gpushare.io/profile": Label(profile, "pulumi"),
        "gpushare.io/sharing": Label(kind, "pulumi"),
        "gpushare.io/isolation": Label(spec.ISOLATION[kind], "pulumi"),
        "gpushare.io/gpu-model": Label(gpu_slug, "pulumi"),
    }
    for key, value in pool.labels.items():
        labels[key] = Label(value, "pulumi")
    return labels


def config_labels(managed_by: ManagedBy, cluster_kind: str, device_plugin_config: str | None, mig_config: str | None,
                  toolkit_version: str) -> dict[str, Label]:
    """The labels that choose the node's configs and NVIDIA's operands, each set by whoever manages the node."""
    labels: dict[str, Label] = {}
    if managed_by == "ansible":
        if device_plugin_config:
            labels[DEVICE_PLUGIN_CONFIG_LABEL] = Label(device_plugin_config, "ansible")
        if mig_config:
            labels[MIG_CONFIG_LABEL] = Label(mig_config, "ansible")
            labels[MIG_STATE_LABEL] = Label("success", "ansible")
        labels[TOOLKIT_VERSION_LABEL] = Label(toolkit_version, "ansible")
    elif managed_by == "gpu-operator":
        if device_plugin_config:
            labels[DEVICE_PLUGIN_CONFIG_LABEL] = Label(device_plugin_config, "pulumi")
        if mig_config:
            labels[OPERATOR_MIG_CONFIG_LABEL] = Label(mig_config, "pulumi")
        if cluster_kind == "gke":
            labels["gke-no-default-nvidia-gpu-device-plugin"] = Label("true", "pulumi")
        else:  # EKS NVIDIA AMIs bring their own driver and toolkit
            labels["nvidia.com/gpu.deploy.driver"] = Label("false", "pulumi")
            labels["nvidia.com/gpu.deploy.container-toolkit"] = Label("false", "pulumi")
    else:
        labels["nvidia.com/gpu.deploy.operands"] = Label("false", "pulumi")
    return labels
