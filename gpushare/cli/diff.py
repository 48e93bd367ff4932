"""`gpushare diff`: the next rollout's changes to a live cluster, field by field, and their impact on running work
(gpushare/ops/brownfield/livediff.py). Read-only: the API server judges every object with dryRun=All."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from gpushare.cli.common import EnvOption, JsonOption, fail, print_records
from gpushare.core.errors import GpushareError, Problem


def diff_command(
    env: EnvOption,
    kubeconfig: Annotated[Path, typer.Option("--kubeconfig", help="The cluster's kubeconfig (read-only use: gets, "
                                             "lists, and dry-run creates and applies).")],
    context: Annotated[str | None, typer.Option("--context", help="Kubeconfig context (default: the current).")]
    = None,
    cluster: Annotated[str | None, typer.Option("--cluster", help="The environment's cluster the kubeconfig "
                                                "reaches (needed where it has several).")] = None,
    fail_on_impact: Annotated[bool, typer.Option("--fail-on-impact", help="Exit 1 where running work would be "
                                                 "denied, left Pending, evicted or refused.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Every changed field, not only a count per "
                                          "object.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Show every change the next rollout makes to the live cluster (object, field, old -> new; the API server's
    own server-side dry run) and what it does to running work: each controller or pod that new admission, Pod
    Security, taints, quotas, limits or resource names would deny, leave Pending, evict or refuse, and the GPU
    Operator's operands that restart. Never writes to the cluster."""
    from gpushare.ops.brownfield.livediff import BREAKING, Api, live_diff  # lazy: pulls in pulumi, ~1 s to import

    try:
        if not kubeconfig.is_file():
            raise GpushareError(Problem("kubeconfig not found", file=str(kubeconfig), path="--kubeconfig",
                                        fix="give the path of the cluster's kubeconfig"), exit_code=2)
        report = live_diff(env, Api(kubeconfig, context), cluster)
    except GpushareError as err:
        raise fail(err, as_json) from None
    breaking = [i for i in report.impact if i.effect in BREAKING]
    if as_json:
        print(json.dumps({"ok": not breaking, **report.as_dict()}, indent=2))
    else:
        _print(report, verbose)
    if fail_on_impact and breaking:
        raise typer.Exit(code=1)


def _print(report: Any, verbose: bool) -> None:
    from rich.console import Console

    from gpushare.ops.brownfield.livediff import BREAKING  # lazy: pulls in pulumi, ~1 s to import

    console = Console(highlight=False)
    breaking = [i for i in report.impact if i.effect in BREAKING]
    objects = sorted({c.object for c in report.changes})
    console.print(f"gpushare diff: {report.environment} (cluster {report.cluster}): {len(report.changes)} changed "
                  f"field(s) in {len(objects)} object(s); {len(breaking)} running workload(s) broken, "
                  f"{len(report.impact) - len(breaking)} restarted; {len(report.refused)} object(s) the API server "
                  "refuses", markup=False)
    if report.impact:
        rows = [{"effect": i.effect, "workload": i.workload, "cause": i.cause, "reason": i.reason, "fix": i.fix}
                for i in sorted(report.impact, key=lambda i: (i.effect not in BREAKING, i.workload))]
        print_records(console, "impact on running work", ("effect", "workload", "cause", "reason", "fix"), rows,
                      heading=("effect", "workload"), no_wrap=("effect",))
    for line in report.refused:
        console.print(f"refused: {line}", markup=False)
    for line in report.not_judged:
        console.print(f"not judged: {line}", markup=False)
    by_object: dict[str, list[Any]] = {}
    for c in report.changes:
        by_object.setdefault(c.object, []).append(c)
    rows = []
    for name in objects:
        changes = by_object[name]
        if not verbose and not (len(changes) == 1 and changes[0].field == ""):
            rows.append({"object": name, "change": f"{len(changes)} field(s): "
                         + ", ".join(c.field for c in changes[:3]) + (", ..." if len(changes) > 3 else "")})
            continue
        for c in changes:
            rows.append({"object": name, "change": "created" if c.field == "" else
                         f"{c.field}: {json.dumps(c.old)} -> {json.dumps(c.new)}"})
    if rows:
        print_records(console, "changes (--verbose: every field)", ("object", "change"), rows,
                      heading=("object",))
