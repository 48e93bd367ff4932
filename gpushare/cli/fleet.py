"""`gpushare validate`, `plan`, `render` and `schema`: the environment file checked, shown and rendered."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpushare.cli.common import EnvOption, JsonOption, ProfilesOption, fail
from gpushare.core.errors import GpushareError

if TYPE_CHECKING:
    from gpushare.core.resolve import ResolvedFleet


def _resolve(env: str, profiles: Path | None) -> ResolvedFleet:
    from gpushare.core.resolve import resolve_env

    return resolve_env(env, profiles)


def validate_command(env: EnvOption, profiles: ProfilesOption = None, as_json: JsonOption = False) -> None:
    """Check an environment: schema, GPU models, MIG layouts, profiles, hosts, tenants and rendering."""
    from gpushare.core.guardrails import load_guardrails
    from gpushare.core.tenancy import fleet_tenancy
    from gpushare.render.fleet import render_fleet

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


def plan_command(env: EnvOption, profiles: ProfilesOption = None, as_json: JsonOption = False) -> None:
    """Show what every pool and node becomes: GPUs, profile, MIG layout, advertised resources, ratio."""
    from gpushare.core.guardrails import load_guardrails
    from gpushare.core.tenancy import fleet_tenancy

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


def render_command(
    env: EnvOption,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write (replaced as a whole).")],
    profiles: ProfilesOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write the mig-parted config, device-plugin configs, toolkit config.toml and containerd drop-in."""
    from gpushare.core.files import check_output_dir
    from gpushare.core.paths import default_profiles_dir, environment_path
    from gpushare.render.fleet import render_fleet, write_rendered

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


def schema_command(
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the JSON Schema files.")] = Path("schema"),
) -> None:
    """Write the JSON Schemas of environment and profile files (for editors via yaml-language-server)."""
    from gpushare.core.files import check_output_dir, write_file
    from gpushare.core.schemas import json_schemas

    check_output_dir(out, option="--out")
    for name, content in json_schemas().items():
        path = out / name
        write_file(path, json.dumps(content, indent=2, sort_keys=True) + "\n")
        print(path)
