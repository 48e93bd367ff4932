"""Workload policies on scheduling: tolerations of other pools' taints, pod affinity across namespaces."""

from __future__ import annotations

from typing import Any

from gpushare.policy.admission.cel import _TENANT_NAME, UNTRUSTED_ONLY, _each_new, _lit, _strings
from gpushare.policy.admission.cluster import PoolTaints

_TOLERATION_KEY = "(has(t.key) ? t.key : '')"
_TOLERATION_OPERATOR = "(has(t.operator) ? t.operator : 'Equal')"
_TOLERATION_VALUE = "(has(t.value) ? t.value : '')"
_TOLERATION_EFFECT = "(has(t.effect) ? t.effect : '')"
_TOLERATES_EVERYTHING = f"({_TOLERATION_KEY} == '' && {_TOLERATION_OPERATOR} == 'Exists')"


def _tolerates(taint: str) -> str:
    """Kubernetes' matching of toleration `t` to a taint (the key-less Exists, matching all, is judged apart)."""
    return (f"({_TOLERATION_KEY} == {taint}.key && ({_TOLERATION_OPERATOR} == 'Exists' || "
            f"{_TOLERATION_VALUE} == {taint}.value) && ({_TOLERATION_EFFECT} == '' || "
            f"{_TOLERATION_EFFECT} == {taint}.effect))")


def _taint_id(key: str, value: str, effect: str) -> str:
    return f"{key}={value}:{effect}"


# Taint keys an untrusted tenant's toleration may name beside its own pools' (NODE_CONDITION_TAINT_PREFIX: any key
# under it): Kubernetes' node-condition taints (not-ready, unreachable, the pressure ones, unschedulable,
# network-unavailable), which say what state a node is in rather than whom it is for (the API server adds not-ready
# and unreachable to every pod, the DaemonSet controller the others to its pods), and nvidia.com/gpu, which GPU nodes
# carry on GKE for every GPU workload (its ExtendedResourceToleration admission plugin adds the toleration to pods
# that request nvidia.com/gpu).
NODE_CONDITION_TAINT_PREFIX = "node.kubernetes.io/"
GENERIC_GPU_TAINT_KEYS = ("nvidia.com/gpu",)


def _pool_toleration_policy(pools: PoolTaints) -> dict[str, Any]:
    taints = "[" + ", ".join(f"{{'key': {_lit(k)}, 'value': {_lit(v)}, 'effect': {_lit(e)}}}"
                             for k, v, e in pools.taints) + "]"
    # `tenant/key=value:effect`: tenant names are DNS labels, so the pair cannot be read two ways.
    allowed = sorted(f"{tenant}/{_taint_id(*t)}" for tenant, own in pools.allowed.items() for t in own)
    own = f"(variables.tenantName + '/' + x.key + '=' + x.value + ':' + x.effect) in {_strings(allowed)}"
    own_keys = sorted({f"{tenant}/{key}" for tenant, mine in pools.allowed.items() for key, _, _ in mine})
    known_key = (f"{_TOLERATION_KEY}.startsWith({_lit(NODE_CONDITION_TAINT_PREFIX)}) || "
                 f"{_TOLERATION_KEY} in {_strings(GENERIC_GPU_TAINT_KEYS)} || "
                 f"(variables.tenantName + '/' + {_TOLERATION_KEY}) in {_strings(own_keys)}")
    return {
        "bindings": [("", UNTRUSTED_ONLY, ["Deny"])],
        "variables": [{"name": "tenantName", "expression": _TENANT_NAME}],
        "validations": [
            {
                "expression": "!variables.untrusted || " + _each_new(
                    "tolerations", "t", f"{taints}.all(x, {own} || !{_tolerates('x')})"),
                "message": "untrusted tenants may tolerate only the taints of the pools their quota is in (a "
                           "gpushare.io/pool or other taint of another pool lets a pod, a CPU-only one too, onto "
                           "nodes dedicated to other tenants): remove the toleration; Kueue adds the tolerations of "
                           "the pool it admits a workload onto",
                "reason": "Forbidden",
            },
            {
                "expression": "!variables.untrusted || " + _each_new("tolerations", "t", f"!{_TOLERATES_EVERYTHING}"),
                "message": "untrusted tenants may not tolerate every taint at once (a toleration with no key and "
                           "operator Exists reaches every pool's nodes): tolerate the taints you need by key",
                "reason": "Forbidden",
            },
            {
                # Taints that are no pool's (the control plane's node-role.kubernetes.io/control-plane, a site's
                # own dedicated nodes) keep nodes for someone: only the keys above and the tenant's pools' pass.
                "expression": "!variables.untrusted || " + _each_new("tolerations", "t", known_key),
                "message": "untrusted tenants may tolerate only the taints of the pools their quota is in, "
                           f"Kubernetes' node-condition taints ({NODE_CONDITION_TAINT_PREFIX}*) and "
                           f"{', '.join(GENERIC_GPU_TAINT_KEYS)}: another taint (node-role.kubernetes.io/"
                           "control-plane, a site's dedicated nodes) keeps its nodes for other workloads: remove the "
                           "toleration; Kueue adds the tolerations of the pool it admits a workload onto",
                "reason": "Forbidden",
            },
        ],
    }


def _affinity_terms(affinity: str) -> str:
    """Every pod (anti-)affinity term of an affinity: required ones and the terms of preferred ones."""
    parts = []
    for kind in ("podAffinity", "podAntiAffinity"):
        rules = f"{affinity}.{kind}"
        parts.append(f"(has({rules}) && has({rules}.requiredDuringSchedulingIgnoredDuringExecution) ? "
                     f"{rules}.requiredDuringSchedulingIgnoredDuringExecution : [])")
        parts.append(f"(has({rules}) && has({rules}.preferredDuringSchedulingIgnoredDuringExecution) ? "
                     f"{rules}.preferredDuringSchedulingIgnoredDuringExecution.map(w, w.podAffinityTerm) : [])")
    return " + ".join(parts)


_AFFINITY_VARIABLES = [
    {"name": "affinity", "expression": "has(variables.podSpec.affinity) ? variables.podSpec.affinity : {}"},
    {"name": "oldAffinity", "expression": "has(variables.oldPodSpec.affinity) ? variables.oldPodSpec.affinity : {}"},
    {"name": "affinityTerms", "expression": _affinity_terms("variables.affinity")},
    {"name": "oldAffinityTerms", "expression": _affinity_terms("variables.oldAffinity")},
]
