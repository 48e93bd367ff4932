"""`pulumi preview --policy-pack policies/pack`: the guardrail rules of gpushare.policies as a policy pack."""

from pulumi_policy import PolicyPack

from gpushare.policy.pack import policies

PolicyPack(name="gpushare-guardrails", policies=policies())
