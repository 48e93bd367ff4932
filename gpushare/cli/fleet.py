"""`gpushare validate`, `plan`, `render` and `schema`: the environment file checked, shown and rendered."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpushare.cli.common import EnvOption, JsonOption, ProfilesOption, fail, fits
from gpushare.core.errors import GpushareError, printable
from gpushare.core.files import check_output_dir, write_files
from gpushare.core.paths import default_profiles_dir, environment_path
from gpushare.core.words import counted

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from gpushare.core.resolve import ResolvedFleet, ResolvedPool, Totals
    from gpushare.core.tenancy import ClusterTenancy


def _resolve(env: str, profiles: Path | None) -> ResolvedFleet:
    from gpushare.core.resolve import resolve_env  # lazy: pydantic models, ~0.2 s to import

    return resolve_env(env, profiles)


def withheld_quota(tenancy: dict[str, ClusterTenancy]) -> list[str]:
    """A warning per quota the environment gives an untrusted tenant that its Kueue queue does not: on a resource only
    shared (time-sliced or MPS) pools of the cluster advertise, which untrusted tenants never get."""
    notes = []
    for cluster, ct in tenancy.items():
        for share in ct.shares:
            t = share.tenant
            for resource, count in sorted(t.quota.items()):
                if count and resource in share.nominal and not share.nominal[resource] and t.trust == "untrusted":
                    notes.append(
                        f"tenant {t.name} (untrusted): quota {count} {resource} withheld in cluster {cluster}: only "
                        "shared (time-sliced or MPS) pools advertise it, and untrusted tenants get GPUs only from "
                        "hardware-isolated ones; `gpushare check` fails untrusted-tenants-hardware-isolated until the "
                        "quota names an exclusive or MIG resource")
    return notes


def validate_command(env: EnvOption, profiles: ProfilesOption = None, as_json: JsonOption = False) -> None:
    """Check an environment: schema, GPU models, MIG layouts, profiles, hosts, tenants and rendering."""
    from gpushare.core.guardrails import load_guardrails  # lazy: pydantic models, ~0.2 s to import
    from gpushare.core.site_vars import check_site_vars  # lazy: pydantic models, ~0.2 s to import
    from gpushare.core.tenancy import fleet_tenancy  # lazy: pydantic models, ~0.2 s to import
    from gpushare.render.fleet import render_fleet  # lazy: pydantic models and Jinja2, ~0.3 s to import

    try:
        fleet = _resolve(env, profiles)
        rendered = render_fleet(fleet)
        tenancy = fleet_tenancy(fleet, load_guardrails())
        # The site settings Ansible reads beside the file (group_vars/, host_vars/): what reaches hosts' files.
        site_warnings = check_site_vars(Path(fleet.source))
    except GpushareError as err:
        raise fail(err, as_json) from None
    warnings = fleet.warnings + [w for ct in tenancy.values() for w in ct.warnings] + withheld_quota(tenancy)
    warnings += site_warnings
    if as_json:
        print(json.dumps({"ok": True, "environment": fleet.environment, "errors": [], "warnings": warnings,
                          "files": sorted(rendered.files)}, indent=2))
        return
    from rich.console import Console
    from rich.markup import escape

    console = Console(highlight=False)
    t = fleet.totals
    # The file's path is the user's --env as typed: shown as text, never as markup or a terminal escape.
    console.print(
        f"[bold green]ok[/]: environment [bold]{escape(fleet.environment)}[/] ({escape(printable(str(fleet.source)))}) "
        f"is valid: {counted(len(fleet.pools), 'pool')}, {counted(sum(n.count for n in fleet.nodes), 'node')}, "
        f"{counted(t.physical_gpus, 'GPU')}, "
        f"{t.advertised_total} schedulable GPU resources, {len(rendered.files)} files to render"
    )
    for w in warnings:
        console.print(f"[yellow]warning[/]: {escape(printable(w, keep=chr(10) + chr(9)))}", soft_wrap=True)


def _fmt_resources(resources: dict[str, int]) -> str:
    return "\n".join(f"{name} x{count}" for name, count in sorted(resources.items()))


def _pool_cells(p: ResolvedPool) -> dict[str, str]:
    """One pool as the plan shows it, column by column; multi-valued cells hold one value per line."""
    layouts = sorted({"\n".join(f"{k} x{v}" for k, v in n.mig_layout.items()) if n.mig_layout else "-"
                      for n in p.nodes})
    gpus = Counter(n.gpu_model.name.removeprefix("NVIDIA ") for n in p.nodes for _ in range(n.count)
                   for _ in range(n.gpus_per_node))
    if p.cloud is not None:
        nodes = f"{p.cloud.node_count} x {p.cloud.machine_type} ({p.nodes[0].managed_by})"
    else:
        nodes = "\n".join(n.name for n in p.nodes)
    return {"pool": p.name, "cluster": p.cluster, "nodes": nodes,
            "GPUs": "\n".join(f"{c} x {m}" for m, c in sorted(gpus.items())),
            "profile": f"{p.profile}\n({p.sharing})", "MIG layout per GPU": "\n".join(layouts),
            "advertised": _fmt_resources(p.totals.advertised), "ratio": f"{p.totals.oversubscription:.2f}",
            "isolation": p.isolation}


def _total_rows(fleet: ResolvedFleet) -> list[tuple[str, Totals]]:
    rows: list[tuple[str, Totals]] = [(f"cluster {name}", ct) for name, ct in fleet.cluster_totals.items()]
    return [*rows, (f"environment {fleet.environment}", fleet.totals)]


def _tenant_rows(tenancy: dict[str, ClusterTenancy]) -> list[dict[str, str]]:
    return [{"tenant": s.tenant.name, "namespace": s.tenant.namespace, "trust": s.tenant.trust,
             "priority": s.tenant.priority, "cluster": cluster,
             "guaranteed": _fmt_resources({k: v for k, v in s.nominal.items() if v}) or "-",
             "borrowable": _fmt_resources({k: v for k, v in s.borrowable.items() if v}) or "-"}
            for cluster, ct in tenancy.items() for s in ct.shares]


_TENANTS_TITLE = "tenants: guaranteed (Kueue nominal quota) and borrowable from idle quota"
_ALLOCATION_TITLE = "GPU allocation per cluster and profile: what each path gives, what does not carry over to DRA"
# What a profile kind loses or changes on a DRA cluster (docs/dra.md); facts from the driver's and Kueue's sources.
_DRA_NOT_CARRIED = {
    "exclusive": ["plain nvidia.com/gpu requests are refused by admission (the driver's own DeviceClass serves "
                  "them outside gpushare's quota): pods name the claim template"],
    "time-slicing": ["sharing across pods only through the driver's ConsumableShares (alpha; Kubernetes' "
                     "DRAConsumableCapacity on the cluster): a claim takes one share, as a replica, and Kueue "
                     "counts the shares it consumes (its alpha KueueDRAIntegrationConsumableCapacity, which gpushare "
                     "turns on)",
                     "a claim may ask for part of the GPU's memory, which the scheduler counts but nothing enforces; "
                     "the device plugin's replicas are equal slices with no memory accounting at all"],
    "mps": ["refused: MPS shares a GPU across pods only through the device plugin"],
    "mig": ["Kueue counts each MIG slice as one device, as the plugin's nvidia.com/mig-* resources"],
    "mig-time-slicing": ["no time-slice interval on MIG devices (the driver's MigDeviceConfig has none)",
                         "sharing across pods only through ConsumableShares (alpha), one share per claim",
                         "Kueue counts each MIG slice as one device"],
}


def preemption_note(kubernetes_version: str) -> str:
    """What the cluster's Kubernetes minor does about priority preemption when the GPU a pod needs is a DRA device
    another pod holds (docs/dra.md; tests/cluster/test_dra_partitionable.py shows it)."""
    from gpushare.core import kubeversions  # lazy: pydantic models, ~0.2 s to import

    minor = kubeversions.text(kubeversions.minor(kubernetes_version))
    if kubeversions.preempts_dra_pods(kubernetes_version):
        return f"priority preemption: Kubernetes {minor}'s scheduler preempts pods for the DRA devices they hold"
    return (f"priority preemption: Kubernetes {minor}'s scheduler does not evict a lower-priority pod for the DRA "
            "device it holds (online work waits for it); Kueue still preempts by quota, and the claims of the "
            "workloads it evicts are freed")


def allocation_rows(fleet: ResolvedFleet) -> list[dict[str, str]]:
    """Per cluster and profile: what the cluster's path gives (resources, or DeviceClasses mapped to the same quota
    names) and, on DRA clusters, what does not carry over from the device plugin. Empty without a DRA cluster."""
    from gpushare.core import dra  # lazy: pydantic models, ~0.2 s to import

    if not any(dra.is_dra(c) for c in fleet.clusters.values()):
        return []
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for pool in fleet.pools:
        key = (pool.cluster, pool.profile)
        if key in rows:
            continue
        cluster = fleet.clusters[pool.cluster]
        row = {"cluster": pool.cluster, "profile": f"{pool.profile} ({pool.sharing})",
               "path": cluster.gpu_allocation, "gives": _fmt_resources(pool.totals.advertised), "not carried over": "-"}
        if dra.is_dra(cluster):
            classes = [c for c in dra.class_plans(fleet, pool.cluster) if c.profile == pool.profile]
            row["gives"] = "\n".join(f"{c.name} -> quota {c.resource}" for c in classes) or "-"
            notes = list(_DRA_NOT_CARRIED.get(pool.sharing, []))
            mode = next(p.mig_mode for p in fleet.env.pools if p.name == pool.name)
            if pool.sharing in dra.MIG_KINDS and mode == "dynamic":
                notes.append("dynamic MIG: the driver's DynamicMIG (alpha) makes instances per claim")
            gates = sorted(g for g in dra.profile_gates(pool.sharing, mode)
                           if dra.driver_facts().gates[g].maturity == "alpha")
            if gates:
                notes.append(f"alpha driver gates: {', '.join(gates)}")
            notes.append(preemption_note(cluster.kubernetes_version))
            row["not carried over"] = "\n".join(notes) or "-"
        rows[key] = row
    return list(rows.values())


def _plan_tables(fleet: ResolvedFleet, pools: list[dict[str, str]], tenants: list[dict[str, str]],
                 allocation: list[dict[str, str]] | None = None) -> list[Table]:
    """The wide layout: pools, totals, tenants and (with a DRA cluster) GPU allocation paths as tables."""
    from rich.table import Table

    table = Table(title=f"gpushare plan: {fleet.environment}", show_lines=True)
    for col in pools[0] if pools else ():
        table.add_column(col, justify="right" if col == "ratio" else "left", overflow="fold",
                         no_wrap=col in ("pool", "profile", "MIG layout per GPU", "advertised"))
    for cells in pools:
        table.add_row(*cells.values())
    totals = Table(title="totals")
    for col in ("scope", "physical GPUs", "hardware units", "schedulable", "oversubscription"):
        totals.add_column(col, justify="left" if col == "scope" else "right")
    for scope, t in _total_rows(fleet):
        totals.add_row(scope, str(t.physical_gpus), str(t.hardware_units), str(t.advertised_total),
                       f"{t.oversubscription:.2f}", style="bold" if scope.startswith("environment") else None)
    tables = [table, totals]
    if tenants:
        tenant_table = Table(title=_TENANTS_TITLE)
        for col in tenants[0]:
            tenant_table.add_column(col, overflow="fold", no_wrap=col in ("guaranteed", "borrowable"))
        for row in tenants:
            tenant_table.add_row(*row.values())
        tables.append(tenant_table)
    if allocation:
        paths = Table(title=_ALLOCATION_TITLE, show_lines=True)
        for col in allocation[0]:
            paths.add_column(col, overflow="fold")
        for row in allocation:
            paths.add_row(*row.values())
        tables.append(paths)
    return tables


def _key_values(console: Console, pairs: dict[str, str], indent: int = 2) -> None:
    """`key: value` lines; a value of several lines, or too long a line, continues under the value column."""
    import textwrap

    width = max(len(k) for k in pairs) + 2
    room = max(20, console.width - indent - width)
    for key, value in pairs.items():
        lines = [w for line in value.split("\n") for w in textwrap.wrap(line, room, break_on_hyphens=False) or [""]]
        for i, line in enumerate(lines):
            head = f"{key}:".ljust(width) if i == 0 else " " * width
            console.print(" " * indent + head + line, markup=False, highlight=False, soft_wrap=True)


def _print_plan_blocks(console: Console, fleet: ResolvedFleet, pools: list[dict[str, str]],
                       tenants: list[dict[str, str]], allocation: list[dict[str, str]] | None = None) -> None:
    """The narrow layout (a terminal narrower than the tables, or output that is not a terminal)."""
    import textwrap

    from rich.markup import escape

    console.print(f"[bold]gpushare plan: {escape(fleet.environment)}[/]")
    for cells in pools:
        console.print(f"\npool [bold]{escape(cells['pool'])}[/]")
        one_line = {"nodes": cells["nodes"].replace("\n", ", "), "profile": cells["profile"].replace("\n", " ")}
        _key_values(console, {k: one_line.get(k, v) for k, v in cells.items() if k != "pool"})
    console.print("\n[bold]totals[/]")
    _key_values(console, {scope: f"{counted(t.physical_gpus, 'GPU')}, {counted(t.hardware_units, 'hardware unit')}, "
                                 f"{t.advertised_total} schedulable, ratio {t.oversubscription:.2f}"
                          for scope, t in _total_rows(fleet)})
    if tenants:
        console.print(f"\n[bold]{_TENANTS_TITLE}[/]")
        for row in tenants:
            head = (f"tenant {row['tenant']} in {row['cluster']}: namespace {row['namespace']}, "
                    f"{row['trust']}, {row['priority']}")
            for line in textwrap.wrap(head, max(40, console.width), subsequent_indent="    "):
                console.print(line, markup=False, highlight=False, soft_wrap=True)
            _key_values(console, {"guaranteed": row["guaranteed"], "borrowable": row["borrowable"]})
    if allocation:
        console.print(f"\n[bold]{_ALLOCATION_TITLE}[/]")
        for row in allocation:
            console.print(f"{row['profile']} in {row['cluster']} ({row['path']})", markup=False, soft_wrap=True)
            _key_values(console, {"gives": row["gives"], "not carried over": row["not carried over"]})


def plan_command(env: EnvOption, profiles: ProfilesOption = None, as_json: JsonOption = False) -> None:
    """Show what every pool and node becomes: GPUs, profile, MIG layout, advertised resources, ratio."""
    from gpushare.core.guardrails import load_guardrails  # lazy: pydantic models, ~0.2 s to import
    from gpushare.core.tenancy import fleet_tenancy  # lazy: pydantic models, ~0.2 s to import

    try:
        fleet = _resolve(env, profiles)
        tenancy = fleet_tenancy(fleet, load_guardrails())
    except GpushareError as err:
        raise fail(err, as_json) from None
    warnings = fleet.warnings + [w for ct in tenancy.values() for w in ct.warnings] + withheld_quota(tenancy)
    if as_json:
        shares = {c: {s.tenant.name: {"guaranteed": s.nominal, "borrowable": s.borrowable} for s in ct.shares}
                  for c, ct in tenancy.items()}
        extra = {"allocation": allocation_rows(fleet)} if allocation_rows(fleet) else {}
        print(json.dumps({"ok": True, **fleet.as_dict(), "tenancy": shares, **extra, "warnings": warnings},
                         indent=2))
        return
    from rich.console import Console
    from rich.markup import escape

    console = Console(highlight=False)
    pools, tenants = [_pool_cells(p) for p in fleet.pools], _tenant_rows(tenancy)
    allocation = allocation_rows(fleet)
    tables = _plan_tables(fleet, pools, tenants, allocation)
    if fits(console, tables):
        for table in tables:
            console.print(table)
    else:
        _print_plan_blocks(console, fleet, pools, tenants, allocation)
    console.print("oversubscription = schedulable GPU resources / hardware units\n"
                  "(a hardware unit is a whole GPU or a MIG instance)")
    for w in warnings:
        console.print(f"[yellow]warning[/]: {escape(w)}", soft_wrap=True)
    console.print("full detail: gpushare plan --json")


def render_command(
    env: EnvOption,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write (replaced as a whole).")],
    profiles: ProfilesOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write the mig-parted config, device-plugin configs, toolkit config.toml and containerd drop-in."""
    from gpushare.render.fleet import render_fleet, write_rendered  # lazy: pydantic models and Jinja2, ~0.3 s to import

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
    from gpushare.core.schemas import json_schemas  # lazy: pydantic models, ~0.2 s to import

    check_output_dir(out, option="--out")
    # All or none: on a full disk no schema is half-replaced and no folder this command made is left behind.
    files = {out / name: json.dumps(content, indent=2, sort_keys=True) + "\n"
             for name, content in json_schemas().items()}
    write_files(files)
    for path in files:
        print(printable(str(path)))
