"""What the policies know of a cluster and its identities: gpushare's deployer, Kueue's controller and the Job
and claim controllers, a DRA cluster's claim templates, the taints of its pools."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpushare.core import dra
from gpushare.core.tenancy import ClusterTenancy

# Who may set a tenant namespace's trust, tenant and Pod Security labels; the Pulumi stack config can name others.
DEFAULT_DEPLOYER_GROUPS = ("system:masters",)
MANAGED = {"app.kubernetes.io/managed-by": "gpushare"}


@dataclass(frozen=True)
class Deployer:
    """gpushare's own identity in the cluster: the only one that may change tenant namespaces' guarded labels."""

    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = DEFAULT_DEPLOYER_GROUPS


@dataclass(frozen=True)
class DraClaims:
    """A DRA cluster's claim templates (docs/dra.md): per tenant name, the gpushare templates its pods may
    reference, and the templates of hardware-isolated profiles, the only ones an untrusted namespace may use."""

    templates: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    isolated: tuple[str, ...] = ()


# Who creates a pod's claims from its templates: kube-controller-manager's resource-claim controller, under its own
# service account (--use-service-account-credentials) or the manager's identity.
CLAIM_CONTROLLER_USERS = ("system:serviceaccount:kube-system:resource-claim-controller",
                          "system:kube-controller-manager")
# The driver's own DeviceClass gpu.nvidia.com maps this extended resource to DRA (extendedResourceName).
DRA_EXTENDED_RESOURCE = dra.driver_facts().extended_resource_name
# Kubernetes' DRAExtendedResource: `deviceclass.resource.kubernetes.io/<class>` in a container's resources asks the
# scheduler for a claim on any DeviceClass, with no template and none of its shares or quota accounting.
IMPLICIT_EXTENDED_PREFIX = "deviceclass.resource.kubernetes.io/"

Taint = tuple[str, str, str]  # key, value, effect


@dataclass(frozen=True)
class PoolTaints:
    """The taints of a cluster's pools, and per tenant name those of the pools its queue may admit work onto: an
    untrusted tenant's pods may tolerate no other pool's taints (a tenant the map does not name: none at all)."""

    taints: tuple[Taint, ...] = ()
    allowed: Mapping[str, tuple[Taint, ...]] = field(default_factory=dict)


def pool_taints(tenancy: ClusterTenancy) -> PoolTaints:
    """A cluster's pool taints as its tenancy objects have them (the ResourceFlavors' tolerations): a tenant's own
    pools are the flavors its ClusterQueue holds quota or a borrowing limit in, so Kueue, which adds a flavor's
    tolerations when it admits a workload there, only ever adds allowed ones."""
    every = tuple(sorted({t for taints in tenancy.pool_taints.values() for t in taints}))
    allowed = {tenant: tuple(sorted({t for pool in pools for t in tenancy.pool_taints.get(pool, [])}))
               for tenant, pools in tenancy.tenant_pools.items()}
    return PoolTaints(taints=every, allowed=allowed)


# Kueue's controller (chart 0.19.2 installed as release "kueue": ServiceAccount kueue-controller-manager in Kueue's
# namespace) lifts its scheduling gate from the pods it admits and resumes the Jobs it admits.
KUEUE_SERVICE_ACCOUNT = "kueue-controller-manager"


def kueue_user(namespace: str = "kueue-system", service_account: str = KUEUE_SERVICE_ACCOUNT) -> str:
    return f"system:serviceaccount:{namespace}:{service_account}"


# The JobSet controller (its release manifest: ServiceAccount jobset-controller-manager in jobset-system) creates and
# resumes the Jobs of a JobSet, which Kueue's JobSet integration queues as a whole: those Jobs carry no queue label.
JOBSET_NAMESPACE = "jobset-system"
JOBSET_SERVICE_ACCOUNT = "jobset-controller-manager"
JOBSET_API_GROUP = "jobset.x-k8s.io"


def jobset_user(namespace: str = JOBSET_NAMESPACE, service_account: str = JOBSET_SERVICE_ACCOUNT) -> str:
    return f"system:serviceaccount:{namespace}:{service_account}"


# The Job controller creates the pods of a Job Kueue admitted (by resuming the Job); Kueue gates none of them. Under
# --use-service-account-credentials it is its own service account, otherwise the controller manager.
JOB_CONTROLLER_USERS = ("system:serviceaccount:kube-system:job-controller", "system:kube-controller-manager")
