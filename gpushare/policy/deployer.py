"""Which deployer identities (gpushare:deployer, the one the tenant namespace policies exempt) are not gpushare's
own. Both the rule deployer-identity-narrow and the Pulumi program (which refuses them at `pulumi up`) judge with
deployer_findings, so neither needs the other."""

from __future__ import annotations

from collections.abc import Iterable

DEPLOYER_KEY = "gpushare:deployer"
# Groups Kubernetes puts every identity of a kind in (every signed-in user, every ServiceAccount, every kubelet): a
# deployer named by one exempts all of them from the tenant namespace policies. system:masters (the default) is not
# one: only break-glass credentials carry it, and they bypass authorization anyway.
BROAD_GROUPS = ("system:authenticated", "system:unauthenticated", "system:serviceaccounts", "system:nodes",
                "system:bootstrappers")
BROAD_GROUP_PREFIXES = ("system:serviceaccounts:", "system:bootstrappers:")
SERVICE_ACCOUNT_USER = "system:serviceaccount:"


def deployer_findings(users: Iterable[str], groups: Iterable[str], tenant_namespaces: Iterable[str]
                      ) -> list[tuple[str, str]]:
    """(setting, why) for each deployer identity that is not gpushare's own: a group every identity of a kind is in,
    the anonymous user, a kubelet, or a ServiceAccount in a tenant's namespace (whose pods could then relabel their
    own namespace trusted). The Pulumi program refuses these too (gpushare/program/main.py)."""
    tenants = set(tenant_namespaces)
    found = []
    for i, group in enumerate(groups):
        if group in BROAD_GROUPS or group.startswith(BROAD_GROUP_PREFIXES):
            found.append((f"groups[{i}]", f"group {group!r} is one Kubernetes gives every identity of a kind, so all "
                          "of them would be exempt from the tenant namespace policies"))
    for i, user in enumerate(users):
        if user == "system:anonymous":
            found.append((f"users[{i}]", "user 'system:anonymous' is every unauthenticated request"))
        elif user.startswith("system:node:"):
            found.append((f"users[{i}]", f"user {user!r} is a kubelet, on a node tenants' pods run on"))
        elif user.startswith(SERVICE_ACCOUNT_USER):
            namespace = user[len(SERVICE_ACCOUNT_USER):].partition(":")[0]
            if namespace in tenants:
                found.append((f"users[{i}]", f"user {user!r} is a ServiceAccount in tenant namespace {namespace!r}: "
                              "the tenant's own pods could change their namespace's trust and Pod Security labels"))
    return found


DEPLOYER_FIX = ("name gpushare's own deployer in gpushare:deployer: its CI ServiceAccount as a user "
                "(system:serviceaccount:<ns>:<name>, in a namespace no tenant has) or a group only it is in")

