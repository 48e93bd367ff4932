"""`gpushare promote`: the source environment's settings for the target, as a patch, once the source's Prometheus
shows they ran long enough and well (gates in policies/guardrails.yaml `promotion:`)."""

from __future__ import annotations

import json
import time
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpushare.cli.common import TimeoutOption, fail, print_records, unix_time
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.files import check_output_file, write_file
from gpushare.ops.timeouts import DEFAULT_TIMEOUT

if TYPE_CHECKING:
    from gpushare.ops.promote import Promotion


def _offline_plan(promotion: Promotion) -> tuple[list[Any] | None, str]:
    """The Pulumi program's offline plan of the proposed target (the target's stack, reading the proposed file)."""
    from gpushare.ops.preview import collect_plan, stack_config  # lazy: pulls in pulumi, ~1 s to import
    from gpushare.policy.registry import PlanResource  # lazy: pydantic models, ~0.2 s to import

    target = promotion.target.environment
    try:
        name, config, _ = stack_config(target)
    except GpushareError:
        return None, f"no Pulumi.{target}.yaml"
    plan = collect_plan(target, {**config, "gpushare:environment": str(promotion.candidate_file)}, stack=name)
    return [PlanResource(type=r.type, name=r.name, inputs=r.inputs, cluster=plan.cluster_of(r))
            for r in plan.resources], ""


def promote_command(
    source: Annotated[str, typer.Option("--from", help="Environment whose settings are promoted, e.g. pilot.")],
    target: Annotated[str, typer.Option("--to", help="Environment that takes them; its guardrails promote_from "
                                        "must name --from.")],
    prometheus: Annotated[str | None, typer.Option("--prometheus", help="Base URL of the Prometheus that scrapes "
                                                   "the --from environment, e.g. http://prometheus:9090")] = None,
    at: Annotated[float | None, typer.Option("--at", callback=unix_time, help="Judge the gates as of this time, "
                                             "Unix seconds (default: now).")] = None,
    patch: Annotated[Path | None, typer.Option("--patch", help="Where to write the proposed change "
                                                "(default: build/promote/<to>.patch).")] = None,
    offline_plan: Annotated[bool, typer.Option(
        "--plan/--no-plan", help="Also run the guardrail rules that need the Pulumi program's offline plan.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
    timeout: TimeoutOption = DEFAULT_TIMEOUT,
) -> None:
    """Check the promotion gates from Prometheus evidence; when all pass, write the target's change as a patch."""
    import tempfile

    from gpushare.core.guardrails import load_guardrails  # lazy: pydantic models, ~0.2 s to import
    from gpushare.core.resolve import resolve_env  # lazy: pydantic models, ~0.2 s to import
    from gpushare.ops.prometheus import Prometheus  # lazy: pydantic models, ~0.2 s to import
    from gpushare.ops.promote import (  # lazy: pydantic models and Jinja2, ~0.3 s to import
        check_promotion,
        guardrails_gate,
        health_gates,
        items,
        no_evidence_gates,
        propose,
        run_time_gates,
    )

    when = at if at is not None else time.time()
    try:
        prom = Prometheus(prometheus, timeout=timeout) if prometheus else None
        check_output_file(patch or Path("build") / "promote" / f"{target}.patch", option="--patch")
        guardrails = load_guardrails()
        check_promotion(guardrails, source, target)
        with tempfile.TemporaryDirectory(prefix="gpushare-promote-") as tmp:
            promotion = propose(resolve_env(source), resolve_env(target), Path(tmp))
            plan, plan_note = _offline_plan(promotion) if offline_plan else (None, "--no-plan")
            gates = [guardrails_gate(promotion, guardrails, date.today(), plan, plan_note)]
        found = items(promotion.candidate, promotion.source.environment, guardrails.promotion.step)
        if prom is None:
            gates += no_evidence_gates(found, promotion.source, guardrails)
        else:
            gates += run_time_gates(prom, found, guardrails, when)
            gates += health_gates(prom, promotion.source, guardrails, when)
    except GpushareError as err:
        raise fail(err, as_json) from None

    ok = all(g.passed for g in gates)
    errors = []
    if prom is None:
        cannot = sorted({g.gate for g in gates if g.measured == "no evidence"})
        errors.append(Problem(
            f"no evidence: without --prometheus these gates cannot be checked: {', '.join(cannot)}",
            fix=f"give --prometheus with the base URL of the Prometheus that scrapes {source} (dcgm-exporter, "
                "kube-state-metrics with the node-label allowlist, Kueue)"))
    text = promotion.proposal.patch
    patch_path = patch or Path("build") / "promote" / f"{target}.patch"
    written = ok and bool(text)
    if written:
        write_file(patch_path, text)
    summary: dict[str, Any] = {
        "ok": ok, "from": source, "to": target, "at": when,
        "gates": [g.as_dict() for g in gates],
        "changes": [c.as_dict() for c in promotion.changes],
        "patch": str(patch_path) if written else None,
    }
    if errors:
        summary["errors"] = [str(p) for p in errors]
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        _print(summary, gates, errors, when, text, patch_path)
    if not ok:
        raise typer.Exit(code=1)


def _print(summary: dict[str, Any], gates: list[Any], errors: list[Problem], when: float, text: str,
           patch_path: Path) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.text import Text

    out = Console(highlight=False)
    source, target = summary["from"], summary["to"]
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(when))
    rows = [{"gate": g.gate, "item": g.item, "measured": g.measured, "required": g.required,
             "result": Text("pass", "green") if g.passed and g.applies else Text("n/a", "dim") if g.passed
             else Text("FAIL", "red")} for g in gates]
    # Narrower than the table: a block per gate headed "RESULT gate".
    print_records(out, f"gpushare promote: {source} -> {target}, as of {stamp}",
                  ("gate", "item", "measured", "required", "result"), rows, heading=("result", "gate"))
    failing = [g for g in gates if not g.passed]
    for g in failing:
        if errors and g.measured == "no evidence":
            continue  # said once below: no --prometheus
        out.print(f"[red]FAIL[/] {escape(g.gate)}: {escape(g.item.splitlines()[0])}: {escape(g.detail)}")
    for g in gates:
        if g.passed and not g.applies:
            out.print(f"[dim]n/a[/] {escape(g.gate)}: {escape(g.item.splitlines()[0])}: {escape(g.detail)}")
    for p in errors:
        out.print(f"[bold red]{escape(p.message)}[/]")
        if p.fix:
            out.print(f"  [green]fix[/]: {escape(p.fix)}")
    for c in summary["changes"]:
        out.print(f"change from {source}: {c['path']}: {c['from']} -> {c['to']}")
    if failing:
        why = "no --prometheus, so no evidence" if errors else f"{len(failing)} gate(s) failed"
        out.print(f"not promoted: {why}; nothing was written")
    elif not text:
        out.print(f"nothing to write: {target} already runs {source}'s profiles, driver branches and toolkit")
    else:
        out.print(f"proposed change written to {patch_path} (review it; nothing was applied)")
