"""`gpushare capacity`: per-pool recommendations from Prometheus data, a chart, and a patch for review."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpushare.cli.common import EndOption, EnvOption, PrometheusOption, TimeoutOption, fail, print_records
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.files import write_with
from gpushare.core.words import counted
from gpushare.ops.timeouts import DEFAULT_TIMEOUT

if TYPE_CHECKING:
    from gpushare.ops.capacity import Recommendation
    from gpushare.ops.capacity.workloads import PoolWorkloads


def _chart(recs: list[Recommendation], path: Path, environment: str, window: str,
           workloads: dict[str, PoolWorkloads] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in recs if r.utilization_now is not None]
    # Shared pools with per-pod series: a second panel, each workload's replica p95 SM share beside its fair share.
    per_workload = [(f"{s.pool}\n{f.evidence.namespace}/{f.evidence.workload}", f)
                    for s in (workloads or {}).values() if s.available for f in s.workloads]
    fig, axes = plt.subplots(1, 2 if per_workload else 1, squeeze=False,
                             figsize=(max(6.0, 1.4 * len(shown) + 2) + (1.2 * len(per_workload) + 2
                                                                          if per_workload else 0), 4.5))
    ax = axes[0][0]
    if per_workload:
        wx = axes[0][1]
        xs_w = range(len(per_workload))
        wx.bar(list(xs_w), [100 * (f.evidence.sm_p95 or 0) for _, f in per_workload], width=0.5,
               color=["tab:red" if f.crowds or f.crowds_memory else "tab:green" for _, f in per_workload],
               label="replica SM share p95")
        wx.scatter(list(xs_w), [100 * f.fair_share for _, f in per_workload], marker="_", s=400, color="black",
                   label="fair share", zorder=3)
        wx.set_xticks(list(xs_w), [name for name, _ in per_workload], fontsize=7)
        wx.set_ylabel("share of the GPU's SM (%)")
        wx.set_ylim(0, 100)
        wx.set_title("per workload on shared pools (red: crowds its GPU)")
        wx.legend()
    xs = range(len(shown))
    now = [100 * (r.utilization_now or 0) for r in shown]
    projected = [100 * (r.utilization_projected if r.utilization_projected is not None else r.utilization_now or 0)
                 for r in shown]
    ax.bar([x - 0.2 for x in xs], now, width=0.4, label="now (mean)")
    ax.bar([x + 0.2 for x in xs], projected, width=0.4, label="projected")
    ax.set_xticks(list(xs), [f"{r.pool}\n{r.gpus_now}→{r.gpus_proposed or r.gpus_now} GPUs" for r in shown],
                  fontsize=8)
    ax.set_ylabel("GPU utilization (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"gpushare capacity: {environment}, last {window}")
    ax.legend()
    fig.tight_layout()
    write_with(path, lambda tmp: fig.savefig(tmp, dpi=110, format=path.suffix.lstrip(".") or "png"))
    plt.close(fig)


def capacity_command(
    env: EnvOption,
    prometheus: PrometheusOption,
    window: Annotated[str, typer.Option("--window", help="How far back to look (Prometheus duration).")] = "7d",
    end: EndOption = None,
    patch: Annotated[Path | None, typer.Option("--patch", help="Where to write the proposed change "
                                                "(default: build/capacity/<env>.patch).")] = None,
    chart: Annotated[Path | None, typer.Option("--chart", help="Write a PNG of utilization now and projected.")]
    = None,
    source: Annotated[str, typer.Option("--source", help="auto: gpushare's recording rules where they cover the "
                                        "window, else raw exporter series; or force recorded / raw.")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
    backfill_rules: Annotated[Path | None, typer.Option(
        "--backfill-rules", help="Instead of recommending: write what gpushare's recording rules would have recorded "
        "over the window (promtool, pass by pass) as TSDB blocks into this folder; plain Prometheus only.")] = None,
    data_dir: Annotated[Path | None, typer.Option(
        "--data-dir", help="With --backfill-rules: the server's data folder (--storage.tsdb.path) to move the "
        "blocks into, so every pass runs in one go.")] = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT,
) -> None:
    """Recommend time-slicing replicas, MIG layouts and pool sizes from Prometheus data; write a patch for review."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from gpushare.ops.capacity import run_capacity  # lazy: pydantic models and Jinja2, ~0.3 s to import

    started = time.perf_counter()
    console = Console(stderr=True, highlight=False)
    if backfill_rules is not None or data_dir is not None:
        _backfill(env, prometheus, window, end, backfill_rules, data_dir, as_json, console, timeout)
        return
    try:
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                      transient=True, disable=as_json) as progress:
            task = progress.add_task("reading the environment", total=None)
            report = run_capacity(env, prometheus, window, end, source, patch, chart,
                                  lambda what: progress.update(task, description=what), timeout=timeout)
    except GpushareError as err:
        raise fail(err, as_json) from None

    fleet, recs, proposal = report.fleet, report.recommendations, report.proposal
    if chart is not None:
        _chart(recs, chart, fleet.environment, window, report.workloads)
    summary: dict[str, Any] = {**report.as_dict(), "chart": str(chart) if chart else None,
                               "seconds": round(time.perf_counter() - started, 3)}
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    out = Console(highlight=False)
    from rich.text import Text

    rows: list[dict[str, str | Text]] = []
    for r in recs:
        now = counted(r.gpus_now, "GPU")
        proposed = Text("-")
        if r.replicas_now is not None:
            now += f"\n{counted(r.replicas_now, 'replica')}"
        if r.mig_layout_now:
            now += "\n" + ", ".join(f"{p} x{n}" for p, n in r.mig_layout_now.items())
        if not r.gaps:
            proposed = Text(counted(r.gpus_proposed, "GPU") if r.gpus_proposed is not None else "-")
            if r.replicas_proposed is not None:
                proposed.append(f"\n{counted(r.replicas_proposed, 'replica')}")
            if r.mig_layout_proposed:
                proposed.append("\n" + ", ".join(f"{p} x{n}" for p, n in r.mig_layout_proposed.items()))
            if r.pool in proposal.withheld:
                proposed.append_text(Text.assemble("\n", ("not in patch", "yellow"), f": {proposal.withheld[r.pool]}"))
        util = "no data" if r.utilization_now is None else f"{r.utilization_now:.0%}"
        if r.utilization_projected is not None:
            util += f" → {r.utilization_projected:.0%}"
        lines = [Text(f"why: {x}") for x in r.reasons] + [Text(e) for e in r.evidence] + \
            [Text.assemble(("gap", "yellow"), f": {g}") for g in r.gaps] + [Text(f"note: {n}") for n in r.notes]
        if r.pool in report.workloads:  # shared pools: which workloads drive the GPUs (per-process exporter)
            lines += [Text(x) for x in report.workloads[r.pool].lines()]
        rows.append({"pool": r.pool, "sharing": r.sharing, "now": now, "proposed": proposed,
                     "utilization now → projected": util, "evidence": Text("\n").join(lines)})
    # Narrower than the table: a block per pool headed "pool  sharing", so no name or word is split.
    print_records(out, f"gpushare capacity: {fleet.environment}, last {window}",
                  ("pool", "sharing", "now", "proposed", "utilization now → projected", "evidence"), rows,
                  heading=("pool", "sharing"))
    out.print(f"GPUs that could be freed: {report.gpus_freed}. From {summary['source']}: Prometheus query time "
              f"{report.query_seconds:.2f} s over {report.queries} queries; {summary['seconds']:.1f} s in all.")
    if proposal.patch:
        out.print(f"proposed change written to {report.patch_path} (review it; nothing was applied)")
    else:
        out.print("no change proposed")
    if chart is not None:
        out.print(f"chart written to {chart}")


def _backfill(env: str, prometheus: str, window: str, end: float | None, out: Path | None, data_dir: Path | None,
              as_json: bool, console: Any, timeout: float = DEFAULT_TIMEOUT) -> None:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from gpushare.ops.backfill import run_backfill  # lazy: pydantic models, ~0.2 s to import
    from gpushare.ops.capacity import _check_options  # lazy: pydantic models and Jinja2, ~0.3 s to import

    try:
        if out is None:
            raise GpushareError(Problem("--data-dir is only for --backfill-rules",
                                        fix="add --backfill-rules <folder for the blocks>"), exit_code=2)
        _check_options("auto", window)
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                      transient=True, disable=as_json) as progress:
            task = progress.add_task("reading the environment", total=None)
            report = run_backfill(env, prometheus, window, end if end is not None else time.time(), out, data_dir,
                                  lambda what: progress.update(task, description=what), timeout=timeout)
    except GpushareError as err:
        raise fail(err, as_json) from None
    if as_json:
        print(json.dumps(report.as_dict(), indent=2))
        return
    from rich.console import Console

    out_console = Console(highlight=False)
    for p in report.passes:
        blocks = f", {len(p.blocks)} blocks in {p.folder}/blocks" if p.blocks else ""
        out_console.print(f"pass {p.level + 1} ({p.rules} rules): {p.state}{blocks}")
    for line in report.next_steps:
        out_console.print(f"next: {line}")
    if report.complete:
        out_console.print(f"the recording rules cover the {window} window: `gpushare capacity` reads them now")
