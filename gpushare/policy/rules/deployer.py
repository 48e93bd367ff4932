"""Rules over the deployer identity the tenant namespace policies exempt (gpushare:deployer): it is gpushare's
own."""

from __future__ import annotations

from collections.abc import Iterator

from gpushare.policy.admission import DEFAULT_DEPLOYER_GROUPS
from gpushare.policy.deployer import DEPLOYER_FIX, DEPLOYER_KEY, deployer_findings
from gpushare.policy.registry import Context, Finding, rule, stack_mapping


@rule("deployer-identity-narrow", "mandatory",
      "The deployer identity (gpushare:deployer, the one the tenant namespace policies exempt) is gpushare's own: "
      "no group Kubernetes gives every user, ServiceAccount or node, no anonymous user or kubelet, and no "
      "ServiceAccount in a tenant's namespace.", DEPLOYER_FIX)
def _deployer(ctx: Context) -> Iterator[Finding]:
    deployer = stack_mapping(ctx, DEPLOYER_KEY)
    users = [str(u) for u in deployer.get("users") or []]
    groups = [str(g) for g in deployer.get("groups", DEFAULT_DEPLOYER_GROUPS) or []]
    for setting, why in deployer_findings(users, groups, (t.namespace for t in ctx.fleet.tenants)):
        yield f"{DEPLOYER_KEY}.{setting}", why

