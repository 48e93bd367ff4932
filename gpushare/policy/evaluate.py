"""Running the rules: every rule (or the ones named) over one context, with the waivers that are still valid
applied, into a Report."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from gpushare.policy.registry import Context, Rule, Violation
from gpushare.policy.rules import RULES
from gpushare.policy.waivers import WAIVER_RULES, Waiver, waiver_refusal, waiver_targets


@dataclass
class Report:
    environment: str
    violations: list[Violation] = field(default_factory=list)
    waived: list[tuple[Violation, Waiver]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # rules that need the offline plan when there is none

    @property
    def ok(self) -> bool:
        return not any(v.level == "mandatory" for v in self.violations)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "environment": self.environment,
            "violations": [v.as_dict() for v in self.violations],
            "waived": [{**v.as_dict(), "reason": w.reason, "expires": w.expires.isoformat()} for v, w in self.waived],
            "skipped": self.skipped,
        }


def evaluate(ctx: Context, waivers: list[Waiver], today: date, waivers_file: str = "policies/waivers.yaml",
             rules: Iterable[Rule] | None = None) -> Report:
    env = ctx.name
    report = Report(env)
    found: list[Violation] = []
    for r in rules if rules is not None else RULES.values():
        if r.needs_plan and ctx.plan is None:
            report.skipped.append(r.id)
            continue
        found.extend(r.run(ctx))
    targets = waiver_targets(ctx)
    active: list[Waiver] = []
    for i, w in enumerate(waivers):
        if w.environment != env:
            continue
        where = w._location or f"{waivers_file}: waivers[{i}]"
        if w.expires < today:
            description, fix = WAIVER_RULES["waiver-expired"]
            report.violations.append(Violation(
                "waiver-expired", "mandatory", where,
                f"the waiver of {w.rule} for {w.where} expired on {w.expires.isoformat()}", fix))
            continue
        refusal = waiver_refusal(ctx, w, today, targets | {v.where for v in found if v.rule == w.rule_id})
        if refusal is not None:
            report.violations.append(Violation("waiver-refused", "mandatory", where, *refusal))
        else:
            active.append(w)
    for violation in found:
        waiver = next((w for w in active if w.covers(env, violation)), None)
        if waiver is None:
            report.violations.append(violation)
        else:
            report.waived.append((violation, waiver))
    return report
