"""`gpushare preview`: the Pulumi program's offline preview for a stack, as a resource tree or one JSON object."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpushare.cli.common import fail
from gpushare.core.errors import GpushareError

if TYPE_CHECKING:
    from gpushare.ops.preview import Plan, PlannedResource

MAX_SIBLINGS = 20  # per parent and type; the rest is counted, not listed


def preview_command(
    env: Annotated[str, typer.Option("--env", "-e", help="Stack name (Pulumi.<env>.yaml), or a path to a stack or "
                                     "environment file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write every Kubernetes object under "
                                             "DIR/manifests/ and each Helm release's values under DIR/helm-values/.")
                   ] = None,
) -> None:
    """Offline preview of `pulumi up -s ENV`: the program under Pulumi's mock engine, every Kubernetes object
    validated (strict schemas of pinned Kubernetes minors, CRD schemas); exit 1 if anything is invalid."""
    from gpushare.ops.preview import NOT_CHECKED, run_preview  # lazy: pulls in pulumi, ~1 s to import

    try:
        result = run_preview(env, out)
    except GpushareError as err:
        if as_json:
            print(json.dumps({"ok": False, "resources": [], "errors": [str(p) for p in err.problems], "warnings": [],
                              "problems": [p.as_dict() for p in err.problems]}, indent=2))
            raise typer.Exit(code=err.exit_code) from None

        raise fail(err, as_json) from None

    if as_json:
        print(json.dumps(result.as_json(), indent=2))
    else:
        from rich.console import Console
        from rich.markup import escape

        console = Console(highlight=False)
        assert result.plan is not None
        console.print(resource_tree(result.plan, console.width))
        kinds = sorted({o.kind for o in result.objects})
        at = ", ".join(f"{minor} ({cluster})" for cluster, minor in sorted(result.checked_at.items()))
        # Footer lines wrap at word boundaries to the terminal's width (Rich's default), never run past it.
        console.print(f"{len(result.plan.resources)} resources; {len(result.objects)} Kubernetes objects "
                      f"({', '.join(kinds)}) validated against each cluster's Kubernetes minor, {at or 'none'} "
                      "(strict schemas), and the CRD schemas in gpushare/data", markup=False)
        if result.written and out is not None:
            console.print(f"wrote {len(result.written)} files under {out}/manifests and {out}/helm-values",
                          markup=False)
        for w in result.warnings:
            console.print(f"[yellow]warning[/]: {escape(w)}")
        for e in result.errors:
            console.print(f"[bold red]error[/]: {escape(e)}")
        if out is not None and not result.ok:
            console.print("nothing written: the preview has errors")
        for line in NOT_CHECKED:
            console.print(line, style="dim", markup=False)
    if not result.ok:
        raise typer.Exit(code=1)


def summary(r: PlannedResource) -> str:
    """The inputs a reviewer looks at first, per resource type."""
    i: Any = r.inputs
    meta = i.get("metadata", {}) if isinstance(i.get("metadata"), dict) else {}
    where = f"{meta['namespace']}/{meta.get('name')}" if meta.get("namespace") else str(meta.get("name", ""))
    if r.type == "pulumi:providers:kubernetes":
        return f"context {i.get('context')}"
    if r.type.endswith("helm.sh/v3:Release"):
        return f"chart {i.get('chart')} {i.get('version')} -> {i.get('namespace')}/{i.get('name')}"
    if r.type.endswith(":NodePatch"):
        taints = ", ".join(f"{t['key']}={t.get('value', '')}:{t['effect']}"
                           for t in i.get("spec", {}).get("taints", []))
        labels = f"node {meta.get('name')}: {len(meta.get('labels', {}))} labels"
        return f"{labels}, taints {taints}" if taints else labels
    if r.type.endswith(":ConfigMap"):
        return f"{where}: {', '.join(sorted(i.get('data', {})))}"
    if r.type.startswith("kubernetes:"):
        return f"{i.get('kind', '')} {where}".strip()
    if r.type.startswith("gcp:container"):
        node = i.get("nodeConfig", {})
        acc = node.get("guestAccelerators", [{}])[0]
        sharing = acc.get("gpuSharingConfig") or {}
        extra = [f"{sharing['gpuSharingStrategy']} x{sharing['maxSharedClientsPerGpu']}"] if sharing else []
        if acc.get("gpuPartitionSize"):
            extra.append(f"MIG {acc['gpuPartitionSize']}")
        driver = acc.get("gpuDriverInstallationConfig", {}).get("gpuDriverVersion")
        return (f"{node.get('machineType')} with {acc.get('count')} x {acc.get('type')}"
                f"{' (' + ', '.join(extra) + ')' if extra else ''}, driver {driver}")
    if r.type.startswith("aws:eks"):
        scaling = i.get("scalingConfig", {})
        return (f"{i.get('amiType')} {', '.join(i.get('instanceTypes', []))}, "
                f"{scaling.get('minSize')}..{scaling.get('maxSize')} nodes")
    return ""


TREE_INDENT = 4  # columns Rich's Tree guides take per level ("├── ")


def resource_tree(plan: Plan, width: int | None = None) -> Any:
    """The resources under their parents. With `width`, what is too long for the room left at its depth is
    shortened rather than cut mid-word by Rich: a name drops its parent's name (children are named `<parent>-...`),
    shown as `…-rest` (and, if still too long, breaks after a hyphen), and a type its module (`kubernetes:…:Kind`).
    `--json` has both whole."""
    import textwrap

    from rich.text import Text
    from rich.tree import Tree

    tree = Tree(Text.assemble(("stack " + plan.stack, "bold"), " (offline preview)"))
    nodes: dict[str | None, Any] = {None: tree}
    children: dict[str | None, list[PlannedResource]] = defaultdict(list)
    by_urn = {r.urn: r for r in plan.resources}
    for r in plan.resources:
        children[r.parent if r.parent in by_urn else None].append(r)

    def fitted(r: PlannedResource, depth: int) -> tuple[str, str]:
        """(type, name), each shortened only where it would not fit on a line of its own at this depth."""
        room = None if width is None else width - TREE_INDENT * depth
        type_, name = r.type, r.name
        if room is None:
            return type_, name
        parts = type_.split(":")
        if len(type_) > room and len(parts) == 3:  # provider:module:Kind, e.g. kubernetes:apps/v1:Deployment
            type_ = f"{parts[0]}:…:{parts[2]}"
        parent = by_urn.get(r.parent or "")
        if len(name) > room and parent is not None and name.startswith(parent.name + "-"):
            name = "…" + name[len(parent.name):]
        if len(name) > room:  # still too long: break after a hyphen, as hyphenated names are broken by hand
            name = "\n".join(textwrap.wrap(name, room, break_on_hyphens=True))
        return type_, name

    def add(parent: str | None, depth: int) -> None:
        by_type: dict[str, int] = defaultdict(int)
        for r in children.get(parent, []):
            by_type[r.type] += 1
            if by_type[r.type] > MAX_SIBLINGS:
                continue
            type_, name = fitted(r, depth)
            label = Text.assemble((type_, "cyan"), " ", (name, "bold"))
            if r.protect:
                label.append(" (protected)", "magenta")
            text = summary(r)
            if text:
                label.append("  " + text, "dim")
            nodes[r.urn] = nodes[parent].add(label)
            add(r.urn, depth + 1)
        for type_, count in by_type.items():
            if count > MAX_SIBLINGS:
                nodes[parent].add(Text(f"... and {count - MAX_SIBLINGS} more {type_}", "dim"))

    add(None, 1)
    return tree
