"""`gpushare pack`: the command over gpushare.pack. Imports the planner (HiGHS, numpy) only when it runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpushare.cli.common import fail, finite, print_records
from gpushare.core.errors import GpushareError, Problem, printable
from gpushare.core.files import check_output_file, write_file
from gpushare.core.paths import default_profiles_dir, environment_path
from gpushare.core.words import counted

if TYPE_CHECKING:
    from gpushare.planner.pack import PackPlan


def pack_command(
    demand: Annotated[Path, typer.Option("--demand", "-d", help="Demand file (YAML): workloads and GPU models.")],
    env: Annotated[
        str | None,
        typer.Option("--env", "-e", help="Plan within this environment's guardrails, cluster and profiles."),
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option("--gpus", help='GPU models instead of the file\'s: "NVIDIA H100 80GB HBM3=16,NVIDIA L4" '
                     "(a model without =COUNT: as many as needed)."),
    ] = None,
    env_out: Annotated[
        Path | None, typer.Option("--env-out", help="Write the planned pools and profiles as an environment section "
                                        "(with --fleet: the reviewed patch to the environment).")
    ] = None,
    fleet: Annotated[
        str | None,
        typer.Option("--fleet", help="Re-plan onto this environment's existing hosts with the fewest drains "
                     "(its guardrails apply; the demand's gpus: say which models may be added)."),
    ] = None,
    max_changes: Annotated[
        int | None, typer.Option("--max-changes", min=0, help="With --fleet: most GPUs reconfigured.")
    ] = None,
    time_limit: Annotated[
        float, typer.Option("--time-limit", min=1.0, max=3600.0, callback=finite,
                            help="Guard in seconds; the solve ends by work limits, so a run that stays under it "
                                 "is reproducible.")
    ] = 60.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
) -> None:
    """Turn workload demand into per-GPU MIG layouts, time-slicing and MPS replicas and pool sizes, with the
    fewest GPUs (or least cost), and show how close that is to a proven lower bound.

    Exit 0 with a plan, 1 when the demand cannot be served or is invalid, 2 when a file cannot be read.
    """
    from gpushare.planner.demand import load_demand, parse_gpus_option  # lazy: pydantic models, ~0.2 s to import
    from gpushare.planner.pack import plan_demand  # lazy: pydantic models and numpy, ~0.5 s to import
    from gpushare.planner.pack_output import env_section_yaml, fleet_patch_yaml  # lazy: as planner.pack

    try:
        if env_out is not None:
            check_output_file(env_out, _inputs(demand, fleet or env), option="--env-out")
        spec, doc = load_demand(demand)
        if max_changes is not None and fleet is None:
            raise GpushareError(Problem("--max-changes limits a re-plan", fix="add --fleet ENV, or drop --max-changes"),
                                exit_code=2)
        supply = parse_gpus_option(gpus) if gpus is not None else None
        if as_json:
            plan = plan_demand(spec, doc, env=env, gpus=supply, time_limit=time_limit, fleet=fleet,
                               max_changes=max_changes)
        else:
            from rich.console import Console

            with Console(stderr=True).status("planning", spinner="dots") as status:
                plan = plan_demand(spec, doc, env=env, gpus=supply, time_limit=time_limit, fleet=fleet,
                                   max_changes=max_changes, progress=lambda text: status.update(text))
        section = None
        if env_out is not None:
            section = fleet_patch_yaml(plan, str(demand)) if fleet else env_section_yaml(plan, str(demand))
    except GpushareError as err:
        raise fail(err, as_json) from None
    if env_out is not None and section is not None:
        write_file(env_out, section)
    if as_json:
        document = plan.as_json()
        if env_out is not None:
            document["env_out"] = str(env_out)
        print(json.dumps(document, indent=2))
        return
    _print_plan(plan, env_out)


def _inputs(demand: Path, env: str | None) -> list[Path]:
    """Every file pack reads, which --env-out must not replace: the demand file, and with --env or --fleet the
    environment file, its profiles and the guardrails (policies/guardrails.yaml and policies/guardrails.d/)."""
    from gpushare.core.guardrails import FRAGMENTS_DIR, guardrails_path  # lazy: pydantic models, ~0.2 s to import

    inputs = [demand]
    if env is not None:
        env_file = environment_path(env)
        inputs += [env_file, default_profiles_dir(env_file)]
    try:
        rails = guardrails_path()
    except GpushareError:  # outside a workspace: pack reads no guardrails there
        return inputs
    return [*inputs, rails, rails.parent / FRAGMENTS_DIR]


def _print_plan(plan: PackPlan, env_out: Path | None) -> None:
    from rich.console import Console
    from rich.markup import escape

    console = Console(highlight=False)
    title = f"gpushare pack: {plan.demand.name or 'demand'}" + (
        f" in {plan.problem.environment}" if plan.problem.environment else "")
    rows = []
    for pool in plan.pools():
        layout = "\n".join(f"{p} x{n}" for p, n in pool["layout"].items()) or "-"
        sharing = pool["sharing"] + (f" x{pool['replicas']}" if pool["replicas"] > 1 else "")
        names = ", ".join(pool["workloads"][:6]) + (f" (+{len(pool['workloads']) - 6})"
                                                   if len(pool["workloads"]) > 6 else "")
        rows.append({"GPU model": pool["model"].removeprefix("NVIDIA "), "GPUs": str(pool["gpus"]),
                     "profile": f"{pool['profile']}\n({sharing})", "MIG layout per GPU": layout, "workloads": names,
                     "replicas": str(pool["workload_replicas"])})
    # Narrower than the table: a block per pool headed "GPUS x model".
    print_records(console, title, ("GPU model", "GPUs", "profile", "MIG layout per GPU", "workloads", "replicas"),
                  rows, heading=("GPU model", "GPUs"), head=lambda r: f"{r['GPUs']} x {r['GPU model']}",
                  justify={"GPUs": "right", "replicas": "right"})
    util = plan.utilization()
    if plan.proven_optimal:
        status = "optimal (proven by the exact MIP)"
    elif plan.optimal:
        status = "optimal (meets the lower bound)"
    else:
        status = f"within {plan.gap:.1%} of the lower bound"
    console.print(f"[bold]{counted(plan.gpus_used, 'GPU')}[/] for {counted(plan.baseline_gpus, 'workload replica')} "
                  f"(one GPU per replica: {counted(plan.baseline_gpus, 'GPU')})")
    if plan.demand.objective == "gpus":
        console.print(f"lower bound {plan.lower_bound:g} GPUs: {status}")
    else:
        console.print(f"cost {plan.objective:g}, lower bound {plan.lower_bound:g}: {status}")
    console.print(
        f"projected utilization: compute {util['compute']:.0%} (one GPU per replica: {util['baseline_compute']:.0%}),"
        f" memory {util['memory']:.0%}; oversubscription {plan.oversubscription():.2f}"
        + (f" (limit {plan.problem.max_oversubscription:g})" if plan.problem.max_oversubscription else "")
        + f"; solved in {plan.seconds:.1f} s")
    if plan.changes is not None:
        c = plan.changes
        console.print(f"changes: {counted(c.gpus_reconfigured, 'GPU')} reconfigured (proven lower bound "
                      f"{c.lower_bound}) on {counted(len(c.nodes_drained), 'host')} to drain: "
                      f"{', '.join(c.nodes_drained) or 'none'}; {counted(c.gpus_added, 'GPU')} added (proven lower "
                      f"bound {c.gpus_added_bound}), {c.gpus_freed} left idle", markup=False)
    # Wrapped at word boundaries to the terminal's width, as the table above.
    for note in plan.problem.notes:
        console.print(f"note: {note}", markup=False)
    for warning in plan.problem.warnings:
        console.print(f"[yellow]warning[/]: {escape(warning)}")
    if env_out is not None:
        what = "the reviewed patch" if plan.changes is not None else "pools and profiles"
        console.print(f"{what} written to {escape(printable(str(env_out)))}")
