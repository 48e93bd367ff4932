"""`gpushare showback`: GPU-hours and cost per tenant from Prometheus data, as a table, JSON, CSV and a chart."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpushare.cli.common import EndOption, EnvOption, PrometheusOption, TimeoutOption
from gpushare.core.errors import GpushareError
from gpushare.core.files import write_file, write_with
from gpushare.ops.timeouts import DEFAULT_TIMEOUT

if TYPE_CHECKING:
    from gpushare.ops.showback import Row, ShowbackReport

CSV_COLUMNS = ("tenant", "pool", "model", "sharing", "allocated_gpu_hours", "memory_gpu_hours", "used_gpu_hours",
               "cost")
USE_COLUMNS = ("sm_gpu_hours", "gpu_hours")  # --basis use: measured SM GPU-hours, and the GPU-hours charged


def _hours(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def _csv(rows: list[Row], report: ShowbackReport) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    use = report.basis == "use"
    writer.writerow(CSV_COLUMNS + (USE_COLUMNS if use else ()))
    for row in rows:
        writer.writerow([row.tenant, row.pool, row.model, row.sharing, f"{row.allocated_gpu_hours:.4f}",
                         f"{row.memory_gpu_hours:.4f}",
                         "" if row.used_gpu_hours is None else f"{row.used_gpu_hours:.4f}",
                         "" if row.cost is None else f"{row.cost:.2f}",
                         *((_hours(row.sm_gpu_hours), _hours(row.gpu_hours)) if use else ())])
    for idle in report.idle:
        writer.writerow(["(idle)", idle.pool, idle.model, "", f"{idle.gpu_hours:.4f}", "", "",
                         "" if idle.cost is None else f"{idle.cost:.2f}",
                         *(("", f"{idle.gpu_hours:.4f}") if use else ())])
    return out.getvalue()


def _chart(report: ShowbackReport, path: Path) -> None:
    """Per tenant (and idle), GPU-hours stacked by GPU model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars: dict[str, dict[str, float]] = {}
    for row in report.rows:
        bars.setdefault(row.tenant, {}).setdefault(row.model, 0.0)
        bars[row.tenant][row.model] += row.gpu_hours
    for idle in report.idle:
        bars.setdefault("(idle)", {}).setdefault(idle.model, 0.0)
        bars["(idle)"][idle.model] += max(0.0, idle.gpu_hours)
    names = list(bars)
    models = sorted({m for per in bars.values() for m in per})
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(names) + 2), 4.5))
    bottom = [0.0] * len(names)
    for model in models:
        heights = [bars[n].get(model, 0.0) for n in names]
        ax.bar(names, heights, bottom=bottom, label=model)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_ylabel("GPU-hours allocated" if report.basis == "allocation" else "GPU-hours charged by use")
    ax.set_title(f"gpushare showback: {report.fleet.environment}, last {report.window} "
                 f"(coverage {report.coverage:.0%})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    write_with(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)


def _table(rows: list[Row], report: ShowbackReport, by: str) -> None:
    from rich.console import Console

    from gpushare.cli.common import print_records

    money = report.currency or ""
    use = report.basis == "use"
    columns = ("tenant", "pool", "model", "sharing", "GPU-hours", *(("allocated", "SM use") if use else ()),
               "memory GPU-hours", "used", f"cost {money}".strip())
    cells = [[row.tenant, row.pool, row.model, row.sharing, f"{row.gpu_hours:.1f}",
              *((f"{row.allocated_gpu_hours:.1f}", "" if row.sm_gpu_hours is None else f"{row.sm_gpu_hours:.1f}")
                if use else ()),
              f"{row.memory_gpu_hours:.1f}",
              "allocation only" if row.used_gpu_hours is None else f"{row.used_gpu_hours:.1f}",
              "-" if row.cost is None else f"{row.cost:.2f}"] for row in rows]
    cells += [["(idle)", idle.pool, idle.model, "", f"{idle.gpu_hours:.1f}", *(("", "") if use else ()), "", "",
               "-" if idle.cost is None else f"{idle.cost:.2f}"] for idle in report.idle]
    out = Console(highlight=False)
    # Narrower than the table: a block per row headed "tenant  pool".
    basis = ", charged by use on time-sliced and MPS GPUs" if use else ""
    print_records(out, f"gpushare showback: {report.fleet.environment}, last {report.window}, by {by}{basis}", columns,
                  [dict(zip(columns, c, strict=True)) for c in cells], heading=("tenant", "pool"), show_lines=False)
    out.print(f"physical GPU-hours: {report.physical_gpu_hours:.1f} (coverage {report.coverage:.1%} of the "
              f"window; from {'recording rules' if report.source == 'recorded' else 'raw exporter series'})")
    for note in report.notes:
        out.print(f"note: {note}", markup=False)


def showback_command(
    env: EnvOption,
    prometheus: PrometheusOption,
    window: Annotated[str, typer.Option("--window", help="How far back to look (Prometheus duration).")] = "30d",
    end: EndOption = None,
    prices: Annotated[Path | None, typer.Option("--prices", help="Prices file (default: policies/prices.yaml "
                                                "where the workspace has one; none means GPU-hours only).")] = None,
    by: Annotated[str, typer.Option("--by", help="Group the table and CSV by tenant, pool or model.")] = "tenant",
    source: Annotated[str, typer.Option("--source", help="auto: gpushare's recording rules where they cover the "
                                        "window, else raw exporter series; or force recorded / raw.")] = "auto",
    basis: Annotated[str, typer.Option("--basis", help="allocation: GPU-hours by what each tenant held; use: "
                                       "time-sliced and MPS GPUs split by measured SM use (gpushare's process "
                                       "exporter), the unused rest by allocation.")] = "allocation",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
    csv_file: Annotated[Path | None, typer.Option("--csv", help="Write the rows and idle lines as CSV.")] = None,
    chart: Annotated[Path | None, typer.Option("--chart", help="Write a PNG: GPU-hours per tenant and idle, "
                                               "stacked by GPU model.")] = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT,
) -> None:
    """GPU-hours allocated and used, and their cost, per tenant: tenants plus idle equal the physical GPU-hours."""
    from gpushare.cli.common import fail
    from gpushare.ops.showback import grouped, run_showback

    try:
        report = run_showback(env, prometheus, window, end, prices, source, by,
                              ((csv_file, "--csv"), (chart, "--chart")), timeout=timeout, basis=basis)
    except GpushareError as err:
        raise fail(err, as_json) from None
    rows = grouped(report.rows, by)
    if csv_file is not None:
        write_file(csv_file, _csv(rows, report))
    if chart is not None:
        _chart(report, chart)
    if as_json:
        print(json.dumps(report.as_dict(), indent=2))
        return
    _table(rows, report, by)
