"""The Kubernetes minors gpushare supports, and what each minor does for what gpushare renders.

Upstream supports its three newest minors (kubernetes.io/releases): on 2026-12-06 those are 1.37 (1.37.2), 1.36 and
1.35; 1.34 left support in October 2026. gpushare's control-plane suite runs the newest (tools/versions.env) and the
oldest (`make test-cluster KUBERNETES_VERSION=1.35.8`), docs/testing.md.

An environment may still name an older minor (from 1.30, where ValidatingAdmissionPolicy v1 is GA: the environment
format refuses anything older) or a newer one: gpushare renders for it and warns, naming the supported minors.

Per minor, what gpushare renders follows the cluster's `kubernetes_version`:
- tenant namespaces pin Pod Security to `v<minor>` (gpushare.core.namespaces);
- `preview` validates each cluster's objects against the strict schemas of that cluster's minor
  (kubernetes-validate bundles 1.25-1.37; a newer minor is checked at the newest bundled one);
- DRA features: a Kubernetes feature gate the driver's features rest on is asked for only where the minor does not
  turn it on by default (DRA_DEFAULT_ON below, read from k8s.io/kubernetes pkg/features/kube_features.go of each
  release); preemption of pods holding DRA devices is not done by any supported minor (PREEMPTS_DRA_PODS)."""

from __future__ import annotations

from gpushare.core.spec import version_tuple

Minor = tuple[int, int]

SUPPORTED: tuple[Minor, ...] = ((1, 35), (1, 36), (1, 37))
OLDEST, NEWEST = SUPPORTED[0], SUPPORTED[-1]
# The minors whose strict schemas kubernetes-validate (the version gpushare pins) bundles.
SCHEMA_RANGE: tuple[Minor, Minor] = ((1, 25), (1, 37))

# DRA feature gates and the first minor that turns each on by default (beta or GA), from kube_features.go:
#   DRAConsumableCapacity    alpha 1.34, beta (on) 1.36
#   DRAPartitionableDevices  alpha 1.33, beta (on) 1.36
#   DRADeviceTaints          alpha 1.33, beta (on) 1.36, GA 1.37
#   DRAExtendedResource      alpha 1.34, beta (on) 1.36, GA 1.37 (locked on)
#   DRAAdminAccess           beta (on) 1.34, GA 1.36 (locked on)
#   DRAPrioritizedList       beta (on) 1.34, GA 1.36
DRA_DEFAULT_ON: dict[str, Minor] = {
    "DRAConsumableCapacity": (1, 36),
    "DRAPartitionableDevices": (1, 36),
    "DRADeviceTaints": (1, 36),
    "DRAExtendedResource": (1, 36),
    "DRAAdminAccess": (1, 34),
    "DRAPrioritizedList": (1, 34),
}
# No released minor preempts a pod for the DRA devices another pod holds: kube-scheduler's DynamicResources plugin
# has no preemption extension in 1.35-1.37 (kubernetes/enhancements#5690 proposes it). A minor listed here would.
PREEMPTS_DRA_PODS: frozenset[Minor] = frozenset()


def minor(version: str) -> Minor:
    """'1.37' (or 'v1.37.2') as (1, 37)."""
    parts = version_tuple(version)
    return (parts[0], parts[1]) if len(parts) >= 2 else (parts[0] if parts else 0, 0)


def text(m: Minor) -> str:
    return f"{m[0]}.{m[1]}"


def supported_text() -> str:
    return ", ".join(text(m) for m in SUPPORTED)


def support_warning(cluster: str, version: str) -> str | None:
    """What a platform engineer should know about a cluster at this minor, or None inside the supported range."""
    m = minor(version)
    if m in SUPPORTED:
        return None
    if m < OLDEST:
        return (f"cluster {cluster}: Kubernetes {text(m)} is older than the minors gpushare supports "
                f"({supported_text()}); it no longer gets upstream fixes and gpushare's tests do not run on it. "
                f"Upgrade the cluster and set kubernetes_version to its minor")
    return (f"cluster {cluster}: Kubernetes {text(m)} is newer than the minors gpushare supports "
            f"({supported_text()}); what gpushare renders is checked against {text(NEWEST)}'s schemas and "
            "feature defaults. Report anything that differs")


def schema_minor(version: str) -> str:
    """The bundled schema minor a cluster's objects are validated against: its own, clamped to the bundle."""
    m = min(max(minor(version), SCHEMA_RANGE[0]), SCHEMA_RANGE[1])
    return text(m)


def gate_on_by_default(gate: str, version: str) -> bool:
    first = DRA_DEFAULT_ON.get(gate)
    return first is not None and minor(version) >= first


def preempts_dra_pods(version: str) -> bool:
    return minor(version) in PREEMPTS_DRA_PODS
