"""The gpushare command line: a thin Typer layer over the library.

Heavy imports (pydantic models, Jinja2, Pulumi, Ansible) happen inside the commands that need them, so that
`gpushare mig validate`, called in CI loops, starts cold in well under half a second."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpushare.cli_capacity import capacity_command
from gpushare.cli_check import check_command
from gpushare.cli_gpu import discover_command, mig_app
from gpushare.cli_pack import pack_command
from gpushare.cli_preview import preview_command
from gpushare.cli_promote import promote_command
from gpushare.cli_rollout import rollout_command
from gpushare.errors import GpushareError

if TYPE_CHECKING:
    from gpushare.resolve import ResolvedFleet

app = typer.Typer(
    name="gpushare",
    help="Infrastructure as code for shared GPUs: check, plan and render MIG, time-slicing and MPS fleets.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(mig_app, name="mig")
app.command("discover", help="List the local GPUs through NVML and match them to the catalog.")(discover_command)
app.command("check")(check_command)
app.command("capacity")(capacity_command)
app.command("preview")(preview_command)
app.command("pack")(pack_command)
app.command("promote")(promote_command)
app.command("rollout")(rollout_command)

EnvOption = Annotated[str, typer.Option("--env", "-e", help="Environment name under environments/, or a path.")]
ProfilesOption = Annotated[
    Path | None, typer.Option("--profiles", help="Profiles directory (default: profiles/ beside environments/).")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]


def fail(err: GpushareError, as_json: bool) -> typer.Exit:
    """Print a domain error readably (or as JSON) and return the exit to raise."""
    if as_json:
        print(json.dumps({"ok": False, "errors": [str(p) for p in err.problems],
                          "problems": [p.as_dict() for p in err.problems]}, indent=2))
    else:
        from rich.console import Console
        from rich.markup import escape

        console = Console(stderr=True, highlight=False)
        count = len(err.problems)
        console.print(f"[bold red]error[/]: {count} problem{'s' if count != 1 else ''}")
        for p in err.problems:
            # Messages quote user input ([pool] names, YAML paths): never read them as Rich markup.
            where = f"[bold]{escape(p.where)}[/]: " if p.where else ""
            console.print(f"  {where}{escape(p.message)}", soft_wrap=True)
            if p.fix:
                console.print(f"    [green]fix[/]: {escape(p.fix)}", soft_wrap=True)
    return typer.Exit(code=err.exit_code)


def _resolve(env: str, profiles: Path | None) -> ResolvedFleet:
    from gpushare.resolve import resolve_env

    return resolve_env(env, profiles)


@app.command()
def validate(env: EnvOption, profiles: ProfilesOption = None, as_json: JsonOption = False) -> None:
    """Check an environment: schema, GPU models, MIG layouts, profiles, hosts, tenants and rendering."""
    from gpushare.guardrails import load_guardrails
    from gpushare.render import render_fleet
    from gpushare.tenancy import fleet_tenancy

    try:
        fleet = _resolve(env, profiles)
        rendered = render_fleet(fleet)
        tenancy = fleet_tenancy(fleet, load_guardrails())
    except GpushareError as err:
        raise fail(err, as_json) from None
    warnings = fleet.warnings + [w for ct in tenancy.values() for w in ct.warnings]
    if as_json:
        print(json.dumps({"ok": True, "environment": fleet.environment, "errors": [], "warnings": warnings,
                          "files": sorted(rendered.files)}, indent=2))
        return
    from rich.console import Console

    console = Console(highlight=False)
    t = fleet.totals
    console.print(
        f"[bold green]ok[/]: environment [bold]{fleet.environment}[/] ({fleet.source}) is valid: "
        f"{len(fleet.pools)} pools, {sum(n.count for n in fleet.nodes)} nodes, {t.physical_gpus} GPUs, "
        f"{t.advertised_total} schedulable GPU resources, {len(rendered.files)} files to render"
    )
    for w in warnings:
        console.print(f"[yellow]warning[/]: {w}", soft_wrap=True)


def _fmt_resources(resources: dict[str, int]) -> str:
    return "\n".join(f"{name} x{count}" for name, count in sorted(resources.items()))


@app.command()
def plan(env: EnvOption, profiles: ProfilesOption = None, as_json: JsonOption = False) -> None:
    """Show what every pool and node becomes: GPUs, profile, MIG layout, advertised resources, ratio."""
    from gpushare.guardrails import load_guardrails
    from gpushare.tenancy import fleet_tenancy

    try:
        fleet = _resolve(env, profiles)
        tenancy = fleet_tenancy(fleet, load_guardrails())
    except GpushareError as err:
        raise fail(err, as_json) from None
    warnings = fleet.warnings + [w for ct in tenancy.values() for w in ct.warnings]
    if as_json:
        shares = {c: {s.tenant.name: {"guaranteed": s.nominal, "borrowable": s.borrowable} for s in ct.shares}
                  for c, ct in tenancy.items()}
        print(json.dumps({"ok": True, **fleet.as_dict(), "tenancy": shares, "warnings": warnings}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    table = Table(title=f"gpushare plan: {fleet.environment}", show_lines=True)
    for col in ("pool", "cluster", "nodes", "GPUs", "profile", "MIG layout per GPU", "advertised"):
        table.add_column(col, overflow="fold", no_wrap=col in ("pool", "profile", "MIG layout per GPU", "advertised"))
    table.add_column("ratio", justify="right")
    table.add_column("isolation", overflow="fold")
    for p in fleet.pools:
        layouts = sorted({"\n".join(f"{k} x{v}" for k, v in n.mig_layout.items()) if n.mig_layout else "-"
                          for n in p.nodes})
        gpus = Counter(n.gpu_model.name.removeprefix("NVIDIA ") for n in p.nodes for _ in range(n.count)
                       for _ in range(n.gpus_per_node))
        if p.cloud is not None:
            nodes = f"{p.cloud.node_count} x {p.cloud.machine_type} ({p.nodes[0].managed_by})"
        else:
            nodes = "\n".join(n.name for n in p.nodes)
        table.add_row(
            p.name, p.cluster, nodes, "\n".join(f"{c} x {m}" for m, c in sorted(gpus.items())),
            f"{p.profile}\n({p.sharing})", "\n".join(layouts), _fmt_resources(p.totals.advertised),
            f"{p.totals.oversubscription:.2f}", p.isolation,
        )
    console.print(table)

    totals = Table(title="totals", show_lines=False)
    for col in ("scope", "physical GPUs", "hardware units", "schedulable", "oversubscription"):
        totals.add_column(col, justify="left" if col == "scope" else "right")
    for name, ct in fleet.cluster_totals.items():
        totals.add_row(f"cluster {name}", str(ct.physical_gpus), str(ct.hardware_units), str(ct.advertised_total),
                       f"{ct.oversubscription:.2f}")
    t = fleet.totals
    totals.add_row(f"[bold]environment {fleet.environment}[/]", str(t.physical_gpus), str(t.hardware_units),
                   str(t.advertised_total), f"{t.oversubscription:.2f}")
    console.print(totals)
    if fleet.tenants:
        tenants = Table(title="tenants: guaranteed (Kueue nominal quota) and borrowable from idle quota")
        for col in ("tenant", "namespace", "trust", "priority", "cluster", "guaranteed", "borrowable"):
            tenants.add_column(col, overflow="fold", no_wrap=col in ("guaranteed", "borrowable"))
        for cluster, cluster_tenancy in tenancy.items():
            for share in cluster_tenancy.shares:
                ten = share.tenant
                tenants.add_row(ten.name, ten.namespace, ten.trust, ten.priority, cluster,
                                _fmt_resources({k: v for k, v in share.nominal.items() if v}) or "-",
                                _fmt_resources({k: v for k, v in share.borrowable.items() if v}) or "-")
        console.print(tenants)
    console.print("oversubscription = schedulable GPU resources / hardware units (a whole GPU or a MIG instance)")
    for w in warnings:
        console.print(f"[yellow]warning[/]: {w}", soft_wrap=True)


@app.command()
def render(
    env: EnvOption,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write (replaced as a whole).")],
    profiles: ProfilesOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write the mig-parted config, device-plugin configs, toolkit config.toml and containerd drop-in."""
    from gpushare.files import check_output_dir
    from gpushare.render import render_fleet, write_rendered
    from gpushare.resolve import default_profiles_dir, environment_path

    try:
        env_file = environment_path(env)
        check_output_dir(out, [env_file, profiles or default_profiles_dir(env_file)])
        fleet = _resolve(env, profiles)
        written = write_rendered(render_fleet(fleet), out)
    except GpushareError as err:
        raise fail(err, as_json) from None
    if as_json:
        print(json.dumps({"ok": True, "out": str(out), "files": [str(p) for p in written]}, indent=2))
        return
    for path in written:
        print(path)


@app.command()
def schema(
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the JSON Schema files.")] = Path("schema"),
) -> None:
    """Write the JSON Schemas of environment and profile files (for editors via yaml-language-server)."""
    from gpushare.files import check_output_dir, write_file
    from gpushare.spec import json_schemas

    check_output_dir(out, option="--out")
    for name, content in json_schemas().items():
        path = out / name
        write_file(path, json.dumps(content, indent=2, sort_keys=True) + "\n")
        print(path)


EXIT_INTERNAL = 70  # EX_SOFTWARE: gpushare itself failed, whatever the input


def main(argv: list[str] | None = None) -> Any:
    """The one boundary of every command: exit 0, 1 (invalid input or a failed check), 2 (unusable input or
    usage), 3 (no GPU or NVML), 130 (interrupted) or 70 (an internal error, in one line); never a traceback."""
    args = list(argv if argv is not None else sys.argv[1:])
    as_json = "--json" in args
    try:
        return app(args=args, prog_name="gpushare")
    except GpushareError as err:
        code = fail(err, as_json).exit_code
    except KeyboardInterrupt:
        print("gpushare: interrupted; nothing half-written was left in place", file=sys.stderr)
        code = 130
    except MemoryError:
        code = _internal("ran out of memory", args, as_json)
    except RecursionError:
        code = _internal("input nested too deeply (recursion limit)", args, as_json)
    except Exception as exc:  # noqa: BLE001 - the boundary: anything left is gpushare's own fault
        if os.environ.get("GPUSHARE_DEBUG"):
            raise
        code = _internal(f"{type(exc).__name__}: {exc}", args, as_json)
    sys.exit(code)


def _internal(what: str, args: list[str], as_json: bool) -> int:
    import shlex

    first = what.splitlines()[0][:300] if what else "unknown"
    line = (f"gpushare: internal error ({first}); this is a bug in gpushare, not in your input. Report it with "
            f"the output of: GPUSHARE_DEBUG=1 gpushare {shlex.join(args)}")
    if as_json:
        print(json.dumps({"ok": False, "errors": [line], "internal": True}))
    else:
        print(line, file=sys.stderr)
    return EXIT_INTERNAL
