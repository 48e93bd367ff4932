"""`gpushare check`: every guardrail rule over an environment, as a table or one JSON object."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import Annotated

import typer

from gpushare.core.errors import GpushareError, Problem


def check_command(
    env: Annotated[str, typer.Option("--env", "-e", help="Environment name under environments/, or a path.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    waivers: Annotated[Path | None, typer.Option(
        "--waivers", help="Waivers file; must exist when given (default policies/waivers.yaml, which may be absent).")
                       ] = None,
    today: Annotated[str | None, typer.Option("--today", help="Date to judge waiver expiry by (YYYY-MM-DD).")] = None,
    offline_plan: Annotated[bool, typer.Option(
        "--plan/--no-plan", help="Also run the rules that need the Pulumi program's offline plan.")] = True,
    base: Annotated[str | None, typer.Option(
        "--base", help="Git revision the change merges into (CI: the target branch, e.g. origin/main); rules "
        "non-waivable there stay so, and a change that lifts one cannot also waive it.")] = None,
) -> None:
    """Run every guardrail rule; exit 1 if a mandatory rule is violated."""
    from gpushare.cli.common import fail
    from gpushare.ops.preview import plan_resources
    from gpushare.policy.rules import RULES, context_for, evaluate, load_waivers

    try:
        when = date.fromisoformat(today) if today else date.today()
    except ValueError:
        raise fail(GpushareError(Problem(f"--today {(today or '')[:40]!r} is not a date", fix="write a real date as "
                                         "YYYY-MM-DD, e.g. 2026-12-01"), exit_code=2), as_json) from None
    try:
        plan = None
        if offline_plan:
            plan = plan_resources(env)
        ctx = context_for(env, plan, base=base)
        waiver_list, waiver_file = load_waivers(waivers, ctx.guardrails)
        report = evaluate(ctx, waiver_list, when, waiver_file)
    except GpushareError as err:
        raise fail(err, as_json) from None

    if as_json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        from rich.console import Console
        from rich.text import Text

        from gpushare.cli.common import print_records

        console = Console(highlight=False)
        rows: list[dict[str, str | Text]] = []
        failed = {v.rule for v in report.violations}
        waived = {v.rule for v, _ in report.waived}
        for v in report.violations:
            colour = "red" if v.level == "mandatory" else "yellow"
            rows.append({"rule": v.rule, "status": Text.assemble(("FAIL", colour), f" ({v.level})"),
                         "where": v.where, "message": v.message, "how to fix": v.fix})
        for v, w in report.waived:
            rows.append({"rule": v.rule, "status": Text("waived", "cyan"), "where": v.where, "message": v.message,
                         "how to fix": f"waiver until {w.expires.isoformat()}: {w.reason}"})
        for rule_id in report.skipped:
            rows.append({"rule": rule_id, "status": Text("not run", "dim"), "where": "needs the offline plan",
                         "how to fix": "run without --no-plan"})
        for rule_id in RULES:
            if rule_id not in failed | waived and rule_id not in report.skipped:
                rows.append({"rule": rule_id, "status": Text("pass", "green")})
        # Narrower than the table: a block per rule headed "STATUS rule-id", so ids are never split.
        print_records(console, f"gpushare check: {report.environment}", ("rule", "status", "where", "message",
                                                                         "how to fix"), rows,
                      heading=("status", "rule"), no_wrap=("rule", "status"))
        mandatory = sum(v.level == "mandatory" for v in report.violations)
        console.print(f"{mandatory} mandatory and {len(report.violations) - mandatory} advisory violations, "
                      f"{len(report.waived)} waived")
    if not report.ok:
        raise typer.Exit(code=1)
