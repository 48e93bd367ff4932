"""The guardrail rules, one module per family: pure functions over the resolved fleet (and, where a rule needs it,
the offline plan), each registered in gpushare.policy.registry.RULES when its module is imported.

The same rules run in `gpushare check` (CI), in the Pulumi policy pack (`policies/pack`, at preview and up) and,
for what only admission can see, as ValidatingAdmissionPolicies in the cluster. Thresholds come only from
policies/guardrails.yaml; exceptions only from policies/waivers.yaml.

Importing this package imports every family, so RULES taken from here holds every rule;
tests/unit/policy/test_registry.py fails where a module of this package is left out of FAMILIES."""

from __future__ import annotations

from gpushare.policy.registry import RULES

# isort: off
# In this order RULES lists the rules (`gpushare check`, the policy pack): family by family, each in its own order.
from gpushare.policy.rules import fleet, tenancy, toolkit, device_plugin, monitoring, deployer, promotion, adoption

# isort: on

FAMILIES = (fleet, tenancy, toolkit, device_plugin, monitoring, deployer, promotion, adoption)

__all__ = ["FAMILIES", "RULES"]
