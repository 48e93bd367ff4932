"""`gpushare check`: every guardrail rule over an environment, as a table or one JSON object."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpushare.cli.common import as_text, fail, print_records
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.paths import project_root
from gpushare.core.revision import Revision

if TYPE_CHECKING:
    from rich.console import Console

    from gpushare.policy.evaluate import Report
    from gpushare.policy.registry import Context
    from gpushare.policy.waivers import Waiver


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
        "non-waivable there stay so, and a change that lifts one cannot also waive it. Also lists what the change "
        "does against it: rules newly failing or passing, waivers, and each pool's and node's changes.")] = None,
) -> None:
    """Run every guardrail rule; exit 1 if a mandatory rule is violated."""
    from gpushare.ops.preview import plan_resources  # lazy: pulls in pulumi, ~1 s to import
    from gpushare.policy.context import context_for  # lazy: pydantic models and Jinja2, ~0.3 s to import
    from gpushare.policy.evaluate import evaluate  # lazy: pydantic models and Jinja2, ~0.3 s to import
    from gpushare.policy.rules import RULES  # lazy: pydantic models and Jinja2, ~0.3 s to import
    from gpushare.policy.waivers import load_waivers  # lazy: pydantic models and Jinja2, ~0.3 s to import

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
        changes = _changes(ctx, report, waiver_list, base, env, waivers, when, offline_plan) if base else None
    except GpushareError as err:
        raise fail(err, as_json) from None

    if as_json:
        print(json.dumps({**report.as_dict(), **({"base": changes} if changes is not None else {})}, indent=2))
    else:
        from rich.console import Console
        from rich.text import Text

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
        if changes is not None:
            print_changes(console, changes)
    if not report.ok:
        raise typer.Exit(code=1)


def _changes(ctx: Context, report: Report, waiver_list: list[Waiver], base: str, env: str, waivers: Path | None,
             when: date, offline_plan: bool) -> dict[str, Any]:
    """The `base` section: what the change does against REF (gpushare.ops.change)."""
    from gpushare.ops.change import Checked, compare  # lazy: pulls in pulumi, ~1 s to import

    revision = Revision.of(base, project_root())
    return compare(Checked(ctx, report, waiver_list), revision, env, waivers, when, offline_plan)


# Columns of the pool and node changes, by the JSON field each shows.
_POOL_COLUMNS = {"cluster": "cluster", "profile": "profile", "sharing": "sharing", "gpu_model": "GPU model",
                 "gpus": "GPUs", "replicas": "replicas", "hardware_units": "hardware units",
                 "advertised": "advertised", "oversubscription": "oversubscription"}
_NODE_COLUMNS = {"pool": "pool", "gpu_model": "GPU model", "gpus": "GPUs", "profile": "profile",
                 "sharing": "sharing", "replicas": "replicas", "mig_layout": "MIG layout",
                 "advertised": "advertised", "oversubscription": "oversubscription"}


def _value(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "none"
    if isinstance(value, list):
        return ", ".join(_value(v) for v in value) or "none"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _field(change: str, pair: dict[str, Any]) -> str:
    if change == "added":
        return _value(pair["now"])
    if change == "removed":
        return _value(pair["base"])
    return f"{_value(pair['base'])} -> {_value(pair['now'])}"


def print_changes(console: Console, changes: dict[str, Any]) -> None:
    """The `base` section as text: rules, waivers, totals, pools and nodes that differ, each as a table where it
    fits, else one block per row (print_records)."""
    from rich.text import Text

    ref = f"{changes['ref']} ({changes['commit'][:12]})"
    console.print()
    if changes["errors"]:
        console.print(Text(f"the base {ref} could not be checked, so nothing is compared:", style="bold"))
        for problem in changes["errors"]:
            console.print(Text(f"  {problem}"))
        return
    console.print(Text(f"against the base {ref}", style="bold"))
    if not changes["environment_at_base"]:
        console.print(Text(f"the environment does not exist at {changes['ref']}: all it holds is new"))
    rules = changes["rules"]
    rows: list[dict[str, str | Text]] = []
    for v in rules["newly_failing"]:
        rows.append({"rule": v["rule"], "change": Text.assemble(("newly failing", "red"),
                                                                f" ({v['level']}; base: {v['base']})"),
                     "where": v["where"], "message": v["message"]})
    for v in rules["newly_passing"]:
        rows.append({"rule": v["rule"], "change": Text.assemble(("newly passing", "green"), f" (now: {v['now']})"),
                     "where": v["where"], "message": f"at the base: {v['message']}"})
    waiver_rows: list[dict[str, str | Text]] = []
    w = changes["waivers"]
    for kind in ("added", "removed"):
        for item in w[kind]:
            waiver_rows.append({"rule": item["rule"], "change": kind, "where": item["where"],
                                "expires": item["expires"], "reason": item["reason"]})
    for item in w["changed"]:
        before, after = item["base"], item["now"]
        waiver_rows.append({"rule": item["rule"], "change": "changed", "where": item["where"], **{
            key: f"{before[key]} -> {after[key]}" for key in ("expires", "reason") if before[key] != after[key]}})
    for item in w["expiring"]:
        days = item["days_left"]
        soon = Text(f"expires {'today' if days == 0 else f'in {days} day' + ('s' if days != 1 else '')}", "yellow")
        row = next((r for r in waiver_rows if (r["rule"], r["where"]) == (item["rule"], item["where"])), None)
        if row is not None:  # added or changed in this change, and expiring soon: one block says both
            row["change"] = Text.assemble(as_text(row["change"]), ", ", soon)
        else:
            waiver_rows.append({"rule": item["rule"], "change": soon, "where": item["where"],
                                "expires": item["expires"], "reason": item["reason"]})
    pool_rows: list[dict[str, str | Text]] = []
    if changes["totals"]:
        change = "changed" if changes["environment_at_base"] else "added"
        pool_rows.append({"pool": "(environment)", "change": change, **{
            _POOL_COLUMNS[f]: _field(change, pair) for f, pair in changes["totals"].items()
            if f in _POOL_COLUMNS}})
    for item in changes["pools"]:
        pool_rows.append({"pool": item["pool"], "change": item["change"], **{
            _POOL_COLUMNS[f]: _field(item["change"], pair) for f, pair in item["fields"].items()}})
    node_rows = [{"node": item["node"], "change": item["change"], **{
        _NODE_COLUMNS[f]: _field(item["change"], pair) for f, pair in item["fields"].items()}}
        for item in changes["nodes"]]
    if not (rows or waiver_rows or pool_rows or node_rows):
        console.print(Text(f"no change against {changes['ref']}: the same rules fail and pass, and the waivers, "
                           "pools and nodes are as they were"))
        return
    name = changes["ref"]
    for title, columns, body, heading in (
            (f"rules newly failing or passing against {name}", ("rule", "change", "where", "message"), rows,
             ("change", "rule")),
            (f"waivers changed against {name} or expiring within {w['expiring_within_days']} days",
             ("rule", "change", "where", "expires", "reason"), waiver_rows, ("change", "rule")),
            (f"pools changed against {name}", ("pool", "change", *_POOL_COLUMNS.values()), pool_rows,
             ("pool", "change")),
            (f"nodes changed against {name}", ("node", "change", *_NODE_COLUMNS.values()), node_rows,
             ("node", "change"))):
        if body:
            console.print()
            print_records(console, title, columns, body, heading=heading, no_wrap=columns[:1])
