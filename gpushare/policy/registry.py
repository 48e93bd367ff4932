"""The rule registry: what a rule is (Rule, the @rule decorator that registers one in RULES), what it judges
(Context, PlanResource) and what it reports (Finding, Violation), the ids rules were renamed from, and the helpers
several rule families read the fleet and the stack with.

Every family in gpushare.policy.rules registers its rules here when it is imported; import RULES from
gpushare.policy.rules, which imports every family, wherever all of them must be there."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gpushare.core.guardrails import EnvironmentGuardrails, Guardrails
from gpushare.core.mappings import dig
from gpushare.core.resolve import ResolvedFleet, ResolvedNode
from gpushare.core.spec import SHARED_KINDS
from gpushare.core.stacks import OPERATOR_VALUES_KEY

Level = Literal["mandatory", "advisory"]


@dataclass(frozen=True)
class PlanResource:
    """One resource of the offline plan (or of a stack under `pulumi preview`): type token, name, inputs."""

    type: str
    name: str
    inputs: Mapping[str, Any]
    cluster: str = "-"  # the Kubernetes provider (one per cluster) the resource goes through


@dataclass(frozen=True)
class Violation:
    rule: str
    level: Level
    where: str
    message: str
    fix: str

    def as_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "level": self.level, "where": self.where, "message": self.message, "fix": self.fix}


@dataclass
class Context:
    fleet: ResolvedFleet
    guardrails: Guardrails
    plan: list[PlanResource] | None = None
    promotion_source: ResolvedFleet | None = None
    # The environment promote_from names where the workspace has no file for it (an adopted cluster before its
    # pilot exists): the promotion rule reports it instead of check stopping.
    promotion_missing: str | None = None
    rendered: Mapping[str, str] | None = None
    environment: str | None = None  # the environment as the CLI or the Pulumi stack names it
    stack_config: Mapping[str, Any] | None = None  # the stack file's config (Pulumi.<stack>.yaml), where one names it
    # The environment file that stack deploys, where `gpushare check` judges the environment a stack names: it must
    # be the file judged, or CI passes one file and `pulumi up` applies another.
    deployed: Path | None = None
    # The base of the change under review (`check --base REF`) and the rules non-waivable there: a rule lifted from
    # non_waivable stays unwaivable until that lift has merged on its own.
    base: str | None = None
    base_non_waivable: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """Whose limits apply: the environment the CLI or the stack names, never the file's `name:` alone."""
        return self.environment or self.fleet.environment

    @property
    def limits(self) -> EnvironmentGuardrails:
        return self.guardrails.environment(self.name)

    def plan_of(self, type_suffix: str) -> list[PlanResource]:
        return [r for r in self.plan or [] if r.type.endswith(type_suffix)]


Finding = tuple[str, str]  # (where, message)


@dataclass(frozen=True)
class Rule:
    id: str
    description: str
    level: Level
    remediation: str
    check: Callable[[Context], Iterable[Finding]]
    needs_plan: bool = False
    # Where the environment decides the level (`level` is then the strictest): one id, whether it passes or fails.
    level_in: Callable[[Context], Level] | None = None

    def run(self, ctx: Context) -> list[Violation]:
        level = self.level_in(ctx) if self.level_in is not None else self.level
        return [Violation(self.id, level, where, message, self.remediation) for where, message in self.check(ctx)]


RULES: dict[str, Rule] = {}
# Rule ids that were renamed: old id -> (id now, the level the old one reported, or None for any). Waivers and
# non_waivable may still name the old id; a waiver of it covers what the old rule reported, nothing more.
RENAMED: dict[str, tuple[str, Level | None]] = {
    "tenant-quota-above-capacity": ("tenant-quota-within-capacity", "advisory"),
}


def current_id(rule_id: str) -> str:
    """A rule's id now, for an id a waiver or policies/guardrails.yaml may still spell the old way."""
    return RENAMED[rule_id][0] if rule_id in RENAMED else rule_id


def rule(id: str, level: Level, description: str, remediation: str, needs_plan: bool = False,
         level_in: Callable[[Context], Level] | None = None
         ) -> Callable[[Callable[[Context], Iterable[Finding]]], Callable[[Context], Iterable[Finding]]]:
    def register(fn: Callable[[Context], Iterable[Finding]]) -> Callable[[Context], Iterable[Finding]]:
        RULES[id] = Rule(id, description, level, remediation, fn, needs_plan, level_in)
        return fn

    return register


# ---------------------------------------------------------------- what several families read


def shared_nodes(fleet: ResolvedFleet) -> Iterator[ResolvedNode]:
    return (n for n in fleet.nodes if n.sharing in SHARED_KINDS)


def shared_replicas(fleet: ResolvedFleet, node: ResolvedNode) -> int:
    """The replicas each unit of a shared node is split into (its profile's time-slicing or MPS block)."""
    profile = fleet.profiles[node.profile]
    block = profile.mps if node.sharing == "mps" else profile.time_slicing
    return int(block.replicas)


def stack_mapping(ctx: Context, key: str) -> Mapping[str, Any]:
    """A `gpushare:*` object setting of the stack ({} where it is absent or not an object)."""
    raw = dig(ctx.stack_config, key) or {}
    if isinstance(raw, str):  # Pulumi config may hold an object as its JSON text
        try:
            raw = json.loads(raw)
        except ValueError:
            return {}
    return raw if isinstance(raw, Mapping) else {}


def site_operator_values(ctx: Context) -> Mapping[str, Any]:
    """The GPU Operator values the stack adds (gpushare:operatorValues)."""
    return stack_mapping(ctx, OPERATOR_VALUES_KEY)


def operator_releases(ctx: Context) -> list[tuple[str, Mapping[str, Any]]]:
    """(release name, values) of every GPU Operator release in the plan."""
    out = []
    for r in ctx.plan_of("helm.sh/v3:Release"):
        chart = str(r.inputs.get("chart", ""))
        if chart.endswith("gpu-operator"):
            out.append((r.name, r.inputs.get("values", {}) or {}))
    return out
