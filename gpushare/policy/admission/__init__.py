"""Admission guardrails in the cluster: built-in ValidatingAdmissionPolicies (CEL, no extra engine) for tenant
namespaces. The Pulumi program deploys them per cluster; tests evaluate their CEL with two implementations.

Tenant namespaces carry the labels below (set by the tenancy component), which the policies read through
`namespaceObject`. Workload policies judge pods (CREATE, UPDATE, and `pods/ephemeralcontainers`) and the pod
templates of every built-in controller, written once over a `podSpec` variable picked by `object.kind`. On UPDATE
only what changed against `oldObject` is judged, so a label or finalizer update of an existing pod is never
refused. Per cluster, the pool-toleration policy carries its pools' taints and the queue policy the identity of its
Kueue controller (the only one that may lift Kueue's gate or resume a queued Job or JobSet) and of the JobSet
controller (the only one that may create and resume the unlabelled Jobs of a queued JobSet). A data policy judges
untrusted tenants' ConfigMaps and Secrets, whose keys envFrom turns into variables no workload policy sees. Namespace
policies keep tenants from editing the labels that decide their own trust, priority and Pod Security, through the
Namespace itself and its status and finalize subresources.

The modules, each over the ones after it: objects (the manifests), the policy sets workload, dra, data and
namespaces, the workload policies' sections scheduling, queues, priority and environment (the toolkit's variables),
and at the bottom cel (the CEL vocabulary) and cluster (what the policies know of a cluster)."""

from __future__ import annotations

# What the Pulumi program, the policy rules and the tests import from gpushare.policy.admission.
from gpushare.policy.admission.cel import ALL_TENANTS, TRUSTED_ONLY, UNTRUSTED_ONLY, WORKLOAD_VARIABLES
from gpushare.policy.admission.cluster import (
    CLAIM_CONTROLLER_USERS,
    DEFAULT_DEPLOYER_GROUPS,
    DRA_EXTENDED_RESOURCE,
    IMPLICIT_EXTENDED_PREFIX,
    JOB_CONTROLLER_USERS,
    JOBSET_NAMESPACE,
    JOBSET_SERVICE_ACCOUNT,
    KUEUE_SERVICE_ACCOUNT,
    MANAGED,
    Deployer,
    DraClaims,
    PoolTaints,
    Taint,
    jobset_user,
    kueue_user,
    pool_taints,
)
from gpushare.policy.admission.data import DATA_POLICIES
from gpushare.policy.admission.dra import DRA_CLAIMS_POLICY, dra_workload_policies
from gpushare.policy.admission.namespaces import NAMESPACE_POLICIES, NAMESPACE_VARIABLES
from gpushare.policy.admission.objects import admission_objects, excluded_namespaces, staged_actions, workload_policies
from gpushare.policy.admission.queues import JOBSETS_POLICY
from gpushare.policy.admission.scheduling import GENERIC_GPU_TAINT_KEYS, NODE_CONDITION_TAINT_PREFIX
from gpushare.policy.admission.workload import POLICIES

__all__ = ["ALL_TENANTS", "CLAIM_CONTROLLER_USERS", "DATA_POLICIES", "DEFAULT_DEPLOYER_GROUPS", "DRA_CLAIMS_POLICY",
           "DRA_EXTENDED_RESOURCE", "GENERIC_GPU_TAINT_KEYS", "IMPLICIT_EXTENDED_PREFIX", "JOB_CONTROLLER_USERS",
           "JOBSET_NAMESPACE", "JOBSET_SERVICE_ACCOUNT", "JOBSETS_POLICY",
           "KUEUE_SERVICE_ACCOUNT", "MANAGED", "NAMESPACE_POLICIES", "NAMESPACE_VARIABLES",
           "NODE_CONDITION_TAINT_PREFIX", "POLICIES", "TRUSTED_ONLY", "UNTRUSTED_ONLY", "WORKLOAD_VARIABLES",
           "Deployer", "DraClaims", "PoolTaints", "Taint", "admission_objects", "dra_workload_policies",
           "excluded_namespaces", "jobset_user", "kueue_user", "pool_taints", "staged_actions", "workload_policies"]
