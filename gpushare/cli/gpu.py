"""`gpushare mig validate|profiles`, `gpushare gpus` and `gpushare discover`: the GPU-facing commands.

Kept light on imports (typer, the catalog and the checker; Rich only for the profiles table) because
`gpushare mig validate` runs in CI loops and must start cold well under half a second.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

from gpushare.cli.common import print_records
from gpushare.core.catalog import GpuModel, load_catalog
from gpushare.core.discover import discover
from gpushare.core.errors import GpushareError
from gpushare.core.mig import MigCheck, Placement, check_layout, parse_layout

mig_app = typer.Typer(
    help="Check MIG layouts against the exact geometry of a GPU model, and list its MIG profiles.",
    no_args_is_help=True,
)

GpuOption = Annotated[
    str,
    typer.Option(
        "--gpu",
        help='GPU model: NVML name ("NVIDIA H100 80GB HBM3"), alias, slug, GKE accelerator or PCI id.',
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]


def _print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2) + "\n")


def _print_problems(err: GpushareError) -> None:
    for problem in err.problems:
        typer.echo(f"gpushare: {problem}", err=True)


def slice_map(placements: list[Placement], units: int) -> str:
    """`|0 1g.10gb|1 1g.10gb|2-3 2g.20gb|4-7 3g.40gb|`, unused slices shown as `free`."""

    def span(start: int, end: int) -> str:
        return str(start) if end == start else f"{start}-{end}"

    cells = []
    slice_ = 0
    for placement in sorted(placements, key=lambda p: p.start):
        if placement.start > slice_:
            cells.append(f"{span(slice_, placement.start - 1)} free")
        cells.append(f"{placement.slices} {placement.profile}")
        slice_ = placement.start + placement.size
    if slice_ < units:
        cells.append(f"{span(slice_, units - 1)} free")
    return "|" + "|".join(cells) + "|"


@mig_app.command("validate")
def validate_command(
    gpu: GpuOption,
    layout: Annotated[
        str,
        typer.Option(
            "--layout",
            help='Instances: "1g.10gb=2,2g.20gb=1,3g.40gb=1" (counts), "3g.40gb@4" (fixed start), or both; '
            '"" is MIG on with no instances.',
        ),
    ],
    driver_branch: Annotated[
        int | None,
        typer.Option(
            "--driver-branch", min=1, help="Driver branch of the host (535 for 535.x) to check minimums."
        ),
    ] = None,
    json_out: JsonOption = False,
) -> None:
    """Check a MIG layout exactly: profiles, counts, slices, media engines, driver minimums and placements.

    Exit 0 when the layout is valid, 1 when it is not, 2 when the GPU or the layout cannot be read.
    """
    try:
        model = load_catalog().lookup(gpu)
        instances = parse_layout(layout)
    except GpushareError as err:
        if json_out:
            errors = [str(p) for p in err.problems]
            _print_json({"ok": False, "gpu": gpu, "errors": errors, "warnings": [], "placements": []})
        else:
            _print_problems(err)
        raise typer.Exit(code=err.exit_code) from None
    check = check_layout(model, instances, driver_branch)
    if json_out:
        _print_json({**check.as_json(), **({} if check.ok else {"fix": _layout_fix(model)})})
    else:
        _print_check(model, layout, check)
    raise typer.Exit(code=0 if check.ok else 1)


def _print_check(model: GpuModel, layout: str, check: MigCheck) -> None:
    # typer.style rather than Rich: importing Rich would add about 0.1 s to a command that CI runs in loops.
    verdict = (
        typer.style("valid", fg="green", bold=True)
        if check.ok
        else typer.style("invalid", fg="red", bold=True)
    )
    typer.echo(f"{check.gpu}: MIG layout {layout.strip() or '(empty)'} is {verdict}")
    if check.ok:
        typer.echo("  memory slices: " + slice_map(check.placements, model.placement_units_total))
    for error in check.errors:
        typer.echo(typer.style("  error: ", fg="red") + error)
    for warning in check.warnings:
        typer.echo(typer.style("  warning: ", fg="yellow") + warning)
    if not check.ok:
        typer.echo(typer.style("  fix: ", fg="green") + _layout_fix(model))


def _layout_fix(model: GpuModel) -> str:
    return (f"`gpushare mig profiles --gpu '{model.name}'` lists each profile's count limit, slices and allowed "
            "starts; NVIDIA's own layouts are in mig-parted's default config")


def profiles_document(model: GpuModel) -> dict[str, Any]:
    return {
        "gpu": model.name,
        "slug": model.slug,
        "mig_capable": model.mig_capable,
        "confidence": model.confidence,
        "placement_confidence": model.placement_confidence,
        "compute_slices_total": model.compute_slices_total,
        "placement_units_total": model.placement_units_total,
        "profiles": [
            {
                "name": p.name,
                "id": p.id,
                "compute_slices": p.compute_slices,
                "memory_slices": p.memory_slices,
                "memory_gib": p.memory_gib,
                "max_count": p.max_count,
                "placements": list(p.placements),
                "min_driver_branch": p.min_driver_branch,
                "resource": f"nvidia.com/mig-{p.resource_suffix}",
            }
            for p in model.profiles.values()
        ],
        "combination_rules": [
            {"profiles": sorted(r.profiles), "min_driver_branch": r.min_driver_branch, "source": r.source}
            for r in model.combination_rules
        ],
    }


@mig_app.command("profiles")
def profiles_command(gpu: GpuOption, json_out: JsonOption = False) -> None:
    """List the MIG profiles of a GPU model: ids, slices, memory, counts, allowed starts, driver minimums."""
    try:
        model = load_catalog().lookup(gpu)
    except GpushareError as err:
        if json_out:
            _print_json({"gpu": gpu, "errors": [str(p) for p in err.problems], "profiles": []})
        else:
            _print_problems(err)
        raise typer.Exit(code=err.exit_code) from None
    if json_out:
        _print_json(profiles_document(model))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, soft_wrap=True)
    if not model.mig_capable:
        console.print(
            f"{model.name} has no MIG: share it with time-slicing or MPS, or give it out whole.", markup=False
        )
        return
    table = Table(
        title=f"{model.name}: {model.compute_slices_total} compute slices, "
        f"{model.placement_units_total} memory slices (confidence {model.confidence}, "
        f"placements {model.placement_confidence})"
    )
    for column in ("profile", "id", "compute", "memory slices", "GiB", "max", "allowed starts", "min driver"):
        table.add_column(column)
    for p in model.profiles.values():
        table.add_row(
            p.name,
            str(p.id),
            str(p.compute_slices),
            str(p.memory_slices),
            "?" if p.memory_gib is None else f"{p.memory_gib:g}",
            str(p.max_count),
            ", ".join(map(str, p.placements)),
            f"R{p.min_driver_branch}" if p.min_driver_branch else "",
        )
    console.print(table)
    for rule in model.combination_rules:
        together = " together with ".join(sorted(rule.profiles, reverse=True))
        console.print(f"{together} needs driver R{rule.min_driver_branch} or newer", markup=False)


def catalog_document(model: GpuModel) -> dict[str, Any]:
    return {"name": model.name, "slug": model.slug, "aliases": list(model.aliases),
            "pci_device_ids": list(model.pci_device_ids), "gke_accelerator": model.gke_accelerator,
            "memory_gib": model.memory_gib, "mig_capable": model.mig_capable,
            "mig_profiles": list(model.profiles) if model.mig_capable else [], "confidence": model.confidence}


def gpus_command(json_out: JsonOption = False) -> None:
    """List every GPU model in the catalog: its names (NVML, slug, aliases, GKE accelerator, PCI ids), memory and
    MIG profiles. Any of the names works wherever a GPU model is asked for."""
    models = sorted(load_catalog().models.values(), key=lambda m: m.name)
    if json_out:
        _print_json({"gpus": [catalog_document(m) for m in models]})
        return
    from rich.console import Console

    rows = [{"model": m.name, "slug": m.slug, "memory": f"{m.memory_gib:g} GiB",
             "MIG": ", ".join(m.profiles) if m.mig_capable else "no",
             "also": ", ".join([*m.aliases, *([m.gke_accelerator] if m.gke_accelerator else [])]),
             "PCI": ", ".join(m.pci_device_ids)} for m in models]
    console = Console(highlight=False)
    print_records(console, f"gpushare GPU catalog: {len(models)} models", ("model", "slug", "memory", "MIG", "also",
                                                                           "PCI"), rows)
    console.print("a model's MIG placements and driver minimums: gpushare mig profiles --gpu MODEL", markup=False)


def discover_command(json_out: JsonOption = False) -> None:
    """Read this host's NVIDIA GPUs through NVML (read-only) and match each to the catalog."""
    try:
        report = discover()
    except GpushareError as err:
        if json_out:
            _print_json({"ok": False, "errors": [str(p) for p in err.problems], "gpus": []})
        else:
            _print_problems(err)
        raise typer.Exit(code=err.exit_code) from None
    if json_out:
        _print_json(report)
        return
    typer.echo(f"driver {report['driver_version']} (CUDA {report['cuda_driver_version']})")
    for gpu in report["gpus"]:
        model = gpu["catalog_model"] or f"not in the catalog ({gpu['catalog_reason']})"
        mig = gpu["mig"]
        mode = "no MIG" if not mig["capable"] else f"MIG {mig['current']} (pending {mig['pending']})"
        typer.echo(
            f"GPU {gpu['index']}: {gpu['name']} {gpu['pci_device_id']} {gpu['memory_mib']} MiB, {mode}"
        )
        typer.echo(f"  catalog: {model}")
        for instance in gpu["mig_instances"]:
            typer.echo(
                f"  GPU instance {instance['gpu_instance_id']}: {instance['profile']}@{instance['start']}"
            )
