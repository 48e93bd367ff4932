"""The guardrail rules as a Pulumi policy pack: `pulumi preview --policy-pack policies/pack` enforces the same
rules as `gpushare check`, over the stack's own resources.

Kept importable apart from policies/pack/__main__.py, because constructing a PolicyPack starts its server."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import date
from pathlib import Path
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyResource,
    ReportViolation,
    StackValidationArgs,
    StackValidationPolicy,
    proxy,
)

from gpushare.core.errors import GpushareError
from gpushare.core.paths import project_root
from gpushare.core.resolve import resolve, resolve_env
from gpushare.core.stacks import ENVIRONMENT_KEY, stack_config
from gpushare.core.stacks import environment_file as stacks_environment_file
from gpushare.policy.context import load_checked_guardrails
from gpushare.policy.evaluate import evaluate
from gpushare.policy.registry import Context, Level, PlanResource, Rule
from gpushare.policy.rules import RULES
from gpushare.policy.waivers import WAIVER_RULES, Waiver, load_waivers

_STACK_URN = re.compile(r"^urn:pulumi:(?P<stack>[^:]+)::")


def stack_of(resources: Iterable[PolicyResource]) -> str | None:
    for r in resources:
        match = _STACK_URN.match(r.urn)
        if match:
            return match.group("stack")
    return None


def stack_file_config(stack: str) -> dict[str, Any]:
    """The config of Pulumi.<stack>.yaml, through the one stack-file reader (gpushare.core.stacks)."""
    return stack_config(stack)[1]


def environment_file(stack: str) -> Path:
    """The environment file a stack names in `gpushare:environment` (Pulumi.<stack>.yaml)."""
    env = stack_file_config(stack).get(ENVIRONMENT_KEY)
    if not env:
        raise GpushareError(f"Pulumi.{stack}.yaml does not set {ENVIRONMENT_KEY}", exit_code=2)
    return stacks_environment_file(env)


# Pulumi's sentinels for values not known until an update (pulumi_policy.proxy): kept out of what the rules see.
_UNKNOWN = frozenset((proxy.UNKNOWN_BOOLEAN_VALUE, proxy.UNKNOWN_NUMBER_VALUE, proxy.UNKNOWN_STRING_VALUE,
                      proxy.UNKNOWN_ARRAY_VALUE, proxy.UNKNOWN_ASSET_VALUE, proxy.UNKNOWN_ARCHIVE_VALUE,
                      proxy.UNKNOWN_OBJECT_VALUE))
_DROPPED = object()


def known_part(value: Any) -> Any:
    """A resource's properties as plain dicts and lists, without the values the engine does not know yet.

    During a preview the engine hands a stack policy every resource's properties behind a proxy that raises on
    reading an unknown value (a Helm release's `status`, a node's server-filled fields). Reading one ends the whole
    policy as "can't run during preview", so nothing would be judged; the rules judge inputs gpushare computes
    from its files, which are always known, so only the unknown values themselves are left out."""
    if isinstance(value, Mapping):
        out = {}
        for key in value:
            try:
                item = known_part(value[key])
            except proxy.UnknownValueError:
                continue
            if item is not _DROPPED:
                out[key] = item
        return out
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        items = []
        for i in range(len(value)):
            try:
                item = known_part(value[i])
            except proxy.UnknownValueError:
                continue
            if item is not _DROPPED:
                items.append(item)
        return items
    if isinstance(value, str) and value in _UNKNOWN:
        return _DROPPED
    return value


def plan_from_stack(resources: Iterable[PolicyResource]) -> list[PlanResource]:
    """The stack's resources as the rules see them; a resource's cluster is its Kubernetes provider's name."""
    return [PlanResource(type=r.resource_type, name=r.name, inputs=known_part(r.props),
                         cluster=r.provider.name if r.provider is not None else "-")
            for r in resources]


def context_from_stack(args: StackValidationArgs) -> Context:
    """The rules' input for a stack. The stack's own name (from the URNs the engine gives every resource) decides
    whose limits apply; the environment file it loads must be that environment (rule environment-identity).
    The policy config's `environment` replaces the stack file's gpushare:environment (tests)."""
    config = args.get_config()
    env_path = config.get("environment")
    stack = stack_of(args.resources)
    if stack is None:
        raise GpushareError("cannot tell the stack from the resources' URNs", exit_code=2)
    has_file = (project_root() / f"Pulumi.{stack}.yaml").exists()
    fleet = resolve(Path(env_path) if env_path else environment_file(stack))
    guardrails = load_checked_guardrails()
    limits = guardrails.environment(stack)
    source = resolve_env(limits.promote_from) if limits.promote_from else None
    return Context(fleet=fleet, guardrails=guardrails, plan=plan_from_stack(args.resources), promotion_source=source,
                   environment=stack, stack_config=stack_file_config(stack) if has_file else None)


def _validator(rule: Rule | None, waivers: Callable[[], list[Waiver]], today: Callable[[], date],
               waiver_rule: str = "", level: Level | None = None
               ) -> Callable[[StackValidationArgs, ReportViolation], None]:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        try:
            ctx = context_from_stack(args)
        except GpushareError as err:
            report_violation(f"gpushare cannot evaluate this stack: {err}", None)
            return
        # A waiver policy runs every rule too: whether a waiver is refused depends on what its rule reports.
        report = evaluate(ctx, waivers(), today(), rules=[rule] if rule is not None else None)
        for v in report.violations:
            if v.rule == (rule.id if rule is not None else waiver_rule) and level in (None, v.level):
                report_violation(f"{v.where}: {v.message} (fix: {v.fix})", None)

    return validate


def policies(waivers: Callable[[], list[Waiver]] | None = None, today: Callable[[], date] = date.today
             ) -> list[StackValidationPolicy]:
    """One stack policy per guardrail rule, plus one each for expired and refused waivers. A rule whose level the
    environment decides is two: `<id>` (mandatory) and `<id>-advisory`, each reporting the violations of its level
    (a policy's enforcement level is fixed before the engine names the stack)."""
    load = waivers or (lambda: load_waivers()[0])
    out = [
        StackValidationPolicy(
            name=r.id if level == r.level else f"{r.id}-{level}", description=r.description,
            validate=_validator(r, load, today, level=level),
            enforcement_level=EnforcementLevel.MANDATORY if level == "mandatory" else EnforcementLevel.ADVISORY,
            remediation_steps=r.remediation,
        )
        for r in RULES.values()
        for level in ((r.level, "advisory") if r.level_in is not None and r.level != "advisory" else (r.level,))
    ]
    out += [StackValidationPolicy(name=name, description=description,
                                  validate=_validator(None, load, today, name),
                                  enforcement_level=EnforcementLevel.MANDATORY, remediation_steps=fix)
            for name, (description, fix) in WAIVER_RULES.items()]
    return out


def run_pack(resources: list[PolicyResource], config: Mapping[str, Any] | None = None,
             waivers: list[Waiver] | None = None, today: date | None = None) -> dict[str, list[str]]:
    """Call every policy's validate as the Pulumi engine would; policy name -> violation messages."""
    found: dict[str, list[str]] = {}
    for policy in policies((lambda: waivers) if waivers is not None else None,
                           (lambda: today) if today is not None else date.today):
        messages: list[str] = []

        def report(message: str, urn: str | None = None, out: list[str] = messages) -> None:
            out.append(message)

        assert policy.validate is not None
        policy.validate(StackValidationArgs(resources, config=config), report)
        if messages:
            found[policy.name] = messages
    return found
