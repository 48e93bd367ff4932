"""`pulumi preview --policy-pack policies/pack`: the guardrail rules of gpushare.policies as a policy pack."""

from pulumi_policy import Policy, PolicyPack

from gpushare.policy.pack import policies

rules: list[Policy] = [*policies()]  # PolicyPack takes the base class's list
PolicyPack(name="gpushare-guardrails", policies=rules)
