"""Dynamic Resource Allocation: one sharing profile compiled to the DRA objects of NVIDIA's DRA driver for GPUs.

Conventions (shared by the resolver, tenancy, the Pulumi program, admission and `gpushare plan`):
- A cluster says how pods get GPUs: `gpu_allocation: device-plugin` (default) or `dra`. A DRA cluster needs
  Kubernetes 1.34+ (resource.k8s.io/v1) and may carry a `dra:` block: driver `version` (default: the one the pinned
  GPU Operator names), `install` (`chart`, or `gpu-cluster`: the operator's experimental GPUCluster resource, never
  beside a ClusterPolicy) and extra `feature_gates` (checked against the version's gate table).
- Pools on DRA clusters choose `mig_mode`: `static` (mig-parted applies the profile's layout, as today) or `dynamic`
  (the driver creates MIG instances per claim; needs DynamicMIG). The exact MIG check applies to both. DynamicMIG is
  cluster-wide and destroys at start every MIG instance the driver did not create: one cluster, one MIG mode.
- One DeviceClass per sharing profile used on the cluster, `gpushare-<profile>`; for MIG profiles one per (profile,
  MIG instance profile) the layouts contain, `gpushare-<profile>-<instance>` ('+' written '.', as in resource
  names). Each carries CEL selectors on the driver's attributes (type, productName, MIG profile) and the profile's
  opaque config (GpuConfig / MigDeviceConfig). In each tenant namespace a ResourceClaimTemplate of the same name per
  class the tenant may use (untrusted tenants: hardware-isolated profiles only), with one `exactly` request: Kueue
  admits nothing else. Every object carries `app.kubernetes.io/managed-by: gpushare`.
- Quota: Kueue's `deviceClassMappings` maps each class to the resource name the device-plugin path advertises for
  the profile (`nvidia.com/gpu`, `nvidia.com/gpu.shared`, `nvidia.com/mig-3g.40gb`), so one tenant quota counts on
  both kinds of cluster; time-sliced classes by the `shares` a claim consumes (a Kueue capacity source, behind its
  KueueDRAIntegrationConsumableCapacity gate, which the Kueue values turn on). Tenant ResourceQuotas add
  `<class>.deviceclass.resource.k8s.io/devices`, and 0 for the driver's own classes so no claim bypasses gpushare's.
- Time-slicing across pods needs the driver's ConsumableShares gate (alpha, driver v0.5+; Kubernetes'
  DRAConsumableCapacity feature on the cluster): every GPU and MIG device then publishes `shares` = the profiles'
  replicas, a shared claim takes one, and hardware-isolated claims request all of them. Not on devices whose SM and
  engine capacities the driver publishes (MIG devices; with DynamicMIG, Hopper-and-newer GPUs): a claim consumes
  those whole (dra_facts.shares_refusal). MPS across pods has no DRA form (the driver refuses MPS with consumable
  shares), so MPS profiles are refused on DRA clusters.
Facts come from `gpushare/data/dra-driver-nvidia-gpu.yaml` (copied from the driver's source; see its header)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpushare.core.dra_facts import (
    CLASS_PREFIX,
    DYNAMIC_MIG,
    HARDWARE_ISOLATED,
    KUBERNETES_GATES,
    KUEUE_CAPACITY_GATE,
    KUEUE_MAX_CLASSES_PER_MAPPING,
    KUEUE_MAX_MAPPINGS,
    MANAGED,
    MIG_KINDS,
    PROFILE_LABEL,
    QUALIFIED_NAME_MAX,
    QUOTA_SUFFIX,
    REQUEST_NAME,
    RESOURCE_API,
    TIME_SLICED,
    DeviceClassPlan,
    DraNode,
    DriverFacts,
    FeatureGate,
    alpha_gates,
    class_name,
    counters_refusal,
    driver_facts,
    driver_version,
    first_release_with,
    gate_problems,
    gates_available,
    is_dra,
    kubernetes_gates_needed,
    kueue_feature_gates,
    mapping_limit_problems,
    mapping_problems,
    mappings_for_plans,
    plans_for_nodes,
    profile_gates,
    profile_refusals,
    shares_refusal,
    version_problems,
)
from gpushare.core.errors import GpushareError, Problem

if TYPE_CHECKING:
    from gpushare.core.resolve import ResolvedFleet, ResolvedNode, ResolvedTenant

# The vocabulary lives in dra_facts, below the resolver; callers keep naming it dra.X.
__all__ = ["CLASS_PREFIX", "DYNAMIC_MIG", "DeviceClassPlan", "DraNode", "DriverFacts", "FeatureGate",
           "HARDWARE_ISOLATED", "KUBERNETES_GATES", "KUEUE_CAPACITY_GATE", "KUEUE_MAX_CLASSES_PER_MAPPING",
           "KUEUE_MAX_MAPPINGS", "MANAGED", "MIG_KINDS", "PROFILE_LABEL", "QUALIFIED_NAME_MAX", "QUOTA_SUFFIX",
           "REQUEST_NAME", "RESOURCE_API", "TIME_SLICED", "allowed_templates", "alpha_gates", "claim_templates",
           "class_name", "class_plans", "counters_refusal", "config_problems", "consumable_shares", "device_classes",
           "dra_quota_resources", "driver_facts", "driver_version", "feature_gates", "first_release_with",
           "gate_problems", "gates_available", "is_dra", "kubernetes_gates_needed", "kueue_device_class_mappings",
           "kueue_feature_gates", "mapping_limit_problems", "mapping_problems", "mappings_for_plans", "opaque_config",
           "plans_for_nodes", "profile_gates", "profile_refusals", "required_gates", "selector", "shares_refusal",
           "version_problems"]

# ---------------------------------------------------------------- the DeviceClasses of a cluster


def _dra_nodes(fleet: ResolvedFleet, cluster: str) -> list[ResolvedNode]:
    if not is_dra(fleet.clusters[cluster]):
        return []
    return [n for p in fleet.pools if p.cluster == cluster for n in p.nodes]


def class_plans(fleet: ResolvedFleet, cluster: str) -> list[DeviceClassPlan]:
    """The gpushare DeviceClasses of a DRA cluster (none on a device-plugin cluster), by name."""
    return plans_for_nodes(_dra_nodes(fleet, cluster))


def _cel_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def selector(plan: DeviceClassPlan) -> str:
    """The CEL expression that picks the class's devices from the driver's ResourceSlices."""
    driver = driver_facts().driver_name
    attrs = f"device.attributes[{_cel_string(driver)}]"
    parts = [f"device.driver == {_cel_string(driver)}",
             f"{attrs}.type == {_cel_string('mig' if plan.instance else 'gpu')}"]
    if plan.instance:
        parts.append(f"{attrs}.profile == {_cel_string(plan.instance)}")
    models = ", ".join(_cel_string(m) for m in plan.models)
    parts.append(f"{attrs}.productName in [{models}]")
    return " && ".join(parts)


def opaque_config(plan: DeviceClassPlan, fleet: ResolvedFleet) -> dict[str, Any]:
    """The driver's opaque config for the class: GpuConfig for whole GPUs, MigDeviceConfig for MIG devices."""
    api = driver_facts().config_api
    if plan.instance is None:
        body: dict[str, Any] = {"apiVersion": api, "kind": "GpuConfig"}
        if plan.kind == "time-slicing":
            body["sharing"] = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}
        elif plan.kind == "mps":  # refused by the resolver; spelled out for `gpushare plan`
            mps = fleet.profiles[plan.profile].mps
            body["sharing"] = {"strategy": "MPS", "mpsConfig": {
                "defaultActiveThreadPercentage": max(1, 100 // mps.replicas)}}
        return body
    body = {"apiVersion": api, "kind": "MigDeviceConfig"}
    if plan.kind == "mig-time-slicing":
        body["sharing"] = {"strategy": "TimeSlicing"}  # MIG devices have no time-slice interval
    return body


def device_classes(fleet: ResolvedFleet, cluster: str) -> list[dict[str, Any]]:
    """DeviceClass objects (resource.k8s.io/v1) for the cluster's profiles; empty on device-plugin clusters."""
    out = []
    for plan in class_plans(fleet, cluster):
        labels = {**MANAGED, PROFILE_LABEL: plan.profile}
        out.append({
            "apiVersion": RESOURCE_API, "kind": "DeviceClass",
            "metadata": {"name": plan.name, "labels": labels},
            "spec": {
                "selectors": [{"cel": {"expression": selector(plan)}}],
                "config": [{"opaque": {"driver": driver_facts().driver_name,
                                       "parameters": opaque_config(plan, fleet)}}],
            },
        })
    return out


# ---------------------------------------------------------------- feature gates and consumable shares


def consumable_shares(fleet: ResolvedFleet, cluster: str) -> int | None:
    """The driver's --consumable-shares count for the cluster: the time-slicing replicas its profiles share
    (the resolver refuses profiles that disagree); None when no profile on it time-slices."""
    counts = {fleet.profiles[p.profile].time_slicing.replicas for p in class_plans(fleet, cluster)
              if p.kind in TIME_SLICED}
    return max(counts) if counts else None


def _pool_mig_modes(fleet: ResolvedFleet, cluster: str) -> dict[str, str]:
    return {p.name: p.mig_mode for p in fleet.env.pools if p.cluster == cluster}


def required_gates(fleet: ResolvedFleet, cluster: str) -> set[str]:
    modes = _pool_mig_modes(fleet, cluster)
    return {g for n in _dra_nodes(fleet, cluster) for g in profile_gates(n.sharing, modes.get(n.pool, "static"))}


def feature_gates(fleet: ResolvedFleet, cluster: str) -> dict[str, bool]:
    """The driver's feature gates for the cluster (the chart's `featureGates`): those the profiles in use need
    plus the user's extras. Raises GpushareError where the pinned version lacks one or refuses a pair."""
    c = fleet.clusters[cluster]
    if not is_dra(c):
        return {}
    version = driver_version(c)
    gates = sorted(required_gates(fleet, cluster) | set(c.dra_driver.feature_gates))
    problems = [Problem(f"cluster {cluster}: {message}", fix=fix) for message, fix in version_problems(version)]
    problems += [Problem(f"cluster {cluster}: {message}", fix=fix) for _, message, fix in gate_problems(version, gates)]
    if problems:
        raise GpushareError(problems)
    return {g: True for g in gates}


# ---------------------------------------------------------------- tenants: claim templates, admission, quota


def _tenant_plans(fleet: ResolvedFleet, cluster: str, tenant: ResolvedTenant) -> list[DeviceClassPlan]:
    if cluster not in tenant.clusters:
        return []
    return [p for p in class_plans(fleet, cluster) if tenant.trust == "trusted" or p.hardware_isolated]


def allowed_templates(fleet: ResolvedFleet, cluster: str, tenant: ResolvedTenant) -> set[str]:
    """Names of the claim templates a tenant's pods may reference on the cluster (untrusted: hardware-isolated)."""
    return {p.name for p in _tenant_plans(fleet, cluster, tenant)}


def claim_templates(fleet: ResolvedFleet, cluster: str, tenant: ResolvedTenant) -> list[dict[str, Any]]:
    """ResourceClaimTemplates in the tenant's namespace, one per class it may use, each one `exactly` request
    for one device. With consumable shares on, hardware-isolated claims take every share, so nothing joins them."""
    shares = consumable_shares(fleet, cluster)
    out = []
    for plan in _tenant_plans(fleet, cluster, tenant):
        exactly: dict[str, Any] = {"deviceClassName": plan.name, "allocationMode": "ExactCount", "count": 1}
        if shares is not None and plan.hardware_isolated:
            exactly["capacity"] = {"requests": {"shares": str(shares)}}
        out.append({
            "apiVersion": RESOURCE_API, "kind": "ResourceClaimTemplate",
            "metadata": {"name": plan.name, "namespace": tenant.namespace,
                         "labels": {**MANAGED, PROFILE_LABEL: plan.profile}},
            "spec": {"spec": {"devices": {"requests": [{"name": REQUEST_NAME, "exactly": exactly}]}}},
        })
    return out


def kueue_device_class_mappings(fleet: ResolvedFleet, cluster: str) -> list[dict[str, Any]]:
    """Kueue Configuration `resources.deviceClassMappings`: each quota resource and the classes counted as it, time-
    sliced ones by the shares their claims consume (dra_facts.mappings_for_plans; needs kueue_feature_gates).
    A claim on a class no mapping names is rejected by Kueue, never admitted with zero usage."""
    return mappings_for_plans(class_plans(fleet, cluster))


def dra_quota_resources(fleet: ResolvedFleet, cluster: str, tenant: ResolvedTenant,
                        limits: dict[str, int]) -> dict[str, str]:
    """ResourceQuota `hard` entries for DRA devices in the tenant's namespace: per gpushare class the tenant's
    limit on the class's resource (0 for classes it may not use), and 0 for the driver's own classes."""
    if not is_dra(fleet.clusters[cluster]):
        return {}
    allowed = allowed_templates(fleet, cluster, tenant)
    hard = {f"{name}{QUOTA_SUFFIX}": "0" for name in driver_facts().driver_device_classes}
    for plan in class_plans(fleet, cluster):
        count = limits.get(plan.resource, 0) if plan.name in allowed else 0
        hard[f"{plan.name}{QUOTA_SUFFIX}"] = str(count)
    return dict(sorted(hard.items()))


# ---------------------------------------------------------------- checking opaque configs against the driver


def config_problems(parameters: Any) -> list[str]:
    """What the driver's strict decoder and Validate() would refuse in an opaque GpuConfig/MigDeviceConfig:
    unknown kinds, misspelt fields, unknown strategies and intervals, out-of-range values."""
    facts = driver_facts()
    if not isinstance(parameters, dict):
        return ["opaque parameters are not an object"]
    if parameters.get("apiVersion") != facts.config_api:
        return [f"apiVersion {parameters.get('apiVersion')!r} is not {facts.config_api}"]
    kind = parameters.get("kind")
    if kind not in facts.config_kinds:
        return [f"kind {kind!r} is not one of {', '.join(sorted(facts.config_kinds))}"]
    return _fields(parameters, facts.config_kinds[kind], kind)


def _fields(value: dict[str, Any], fields: dict[str, str], where: str) -> list[str]:
    facts = driver_facts()
    problems = [f"{where}: unknown field {k!r} (known: {', '.join(fields)})" for k in value if k not in fields]
    for key, kind in fields.items():
        if key not in value:
            if kind == "strategy":
                problems.append(f"{where}: missing {key}")
            continue
        item, here = value[key], f"{where}.{key}"
        if kind in facts.config_types:
            problems += (_fields(item, facts.config_types[kind], here) if isinstance(item, dict)
                         else [f"{here}: not an object"])
        elif kind == "strategy" and item not in facts.strategies:
            problems.append(f"{here}: {item!r} is not one of {', '.join(facts.strategies)}")
        elif kind == "interval" and item not in facts.intervals:
            problems.append(f"{here}: {item!r} is not one of {', '.join(facts.intervals)}")
        elif kind == "percent" and not (isinstance(item, int) and 0 <= item <= 100):
            problems.append(f"{here}: {item!r} is not a percentage 0-100")
        elif kind == "boolean" and not isinstance(item, bool):
            problems.append(f"{here}: {item!r} is not a boolean")
        elif kind == "string" and not isinstance(item, str):
            problems.append(f"{here}: {item!r} is not a string")
    return problems
