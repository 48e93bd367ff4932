"""`gpushare import` (a running cluster's GPU sharing into a workspace) and `gpushare drift` (Git against the
cluster, per node). Both only read the cluster."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpushare.cli.common import EnvOption, JsonOption, TimeoutOption, fail, finite, key_values
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.files import check_output_file, write_file
from gpushare.core.paths import WORKSPACE_MARKER, project_root
from gpushare.core.words import counted, name_order
from gpushare.ops.timeouts import DEFAULT_TIMEOUT

if TYPE_CHECKING:
    from rich.console import Console

    from gpushare.ops.brownfield.cluster import ClusterState
    from gpushare.ops.brownfield.drift import Drift, DriftReport
    from gpushare.ops.brownfield.importer import ImportResult

FromOption = Annotated[Path | None, typer.Option("--from", help="Folder of `kubectl get ... -o yaml` dumps "
                                                 "(docs/adoption.md lists the commands).")]
KubeconfigOption = Annotated[Path | None, typer.Option("--kubeconfig", help="Read the cluster live through the "
                                                       "Kubernetes Python client (gpushare's `live` extra).")]
ContextOption = Annotated[str | None, typer.Option("--context", help="Kubeconfig context (default: the current).")]


def one_source(from_dir: Path | None, kubeconfig: Path | None) -> None:
    if (from_dir is None) == (kubeconfig is None):
        raise GpushareError(Problem("give exactly one of --from and --kubeconfig", path="--from",
                                    fix="--from DIR reads dumps; --kubeconfig FILE reads the cluster live"),
                            exit_code=2)


def read_cluster(from_dir: Path | None, kubeconfig: Path | None, context: str | None,
                 timeout: float = DEFAULT_TIMEOUT) -> ClusterState:
    """The cluster's state from dumps or live. Whatever cannot be read of it (a dump that is not YAML, an object
    kubectl would not write) is unusable input, exit 2: exit 1 means an environment that does not validate (import)
    or drift (drift)."""
    one_source(from_dir, kubeconfig)
    try:
        if from_dir is not None:
            from gpushare.ops.brownfield.cluster import read_dumps  # lazy: pydantic models, ~0.2 s to import

            return read_dumps(from_dir)
        assert kubeconfig is not None
        from gpushare.ops.brownfield.live import read_live  # lazy: pydantic models, ~0.2 s to import

        return read_live(kubeconfig, context, timeout=timeout)
    except GpushareError as err:
        if err.exit_code == 1:
            raise GpushareError(err.problems, exit_code=2) from None
        raise


def import_command(
    env: Annotated[str, typer.Option("--env", "-e", help="Name of the environment to write (a DNS label).")],
    from_dir: FromOption = None,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    out: Annotated[Path | None, typer.Option("--out", help="The workspace to write into (`gpushare init DIR` makes "
                                             "one); default: the workspace you are in. Nothing is overwritten.")]
    = None,
    as_json: JsonOption = False,
    timeout: TimeoutOption = DEFAULT_TIMEOUT,
) -> None:
    """Write an environment file, sharing profiles and a Pulumi stack that reproduce a running cluster's GPU sharing
    into a workspace, overwriting nothing; what gpushare cannot express is listed (`unsupported`), never dropped.
    Never writes to the cluster."""
    from gpushare.ops.brownfield.adoption import adoption_stage  # lazy: pulls in pulumi, ~1 s to import
    from gpushare.ops.brownfield.importer import import_cluster  # lazy: pydantic models, ~0.2 s to import

    try:
        one_source(from_dir, kubeconfig)
        _check_env_name(env)
        workspace = out if out is not None else project_root()
        if not (workspace / WORKSPACE_MARKER).is_file():
            raise GpushareError(Problem(f"--out is not a gpushare workspace (no {WORKSPACE_MARKER})",
                                        file=str(workspace), fix=f"create one first: gpushare init {workspace}"),
                                exit_code=2)
        today = date.today()
        result = import_cluster(read_cluster(from_dir, kubeconfig, context, timeout), env, existing_profiles(workspace),
                                context=context, toolkit_floor=_toolkit_floor(workspace), today=today,
                                priorities=_priorities(workspace))
        stage = adoption_stage(workspace, env, result.files, today)
        result.files.update(stage.files)
        _write_files(workspace, result)
        configs, problems, todo = _resolved_configs(workspace, result)
    except GpushareError as err:
        raise fail(err, as_json) from None
    from gpushare.ops.brownfield.importer import operator_takeover  # lazy: pydantic models, ~0.2 s to import

    takeover = operator_takeover(result.operator_release, env, env)
    todo = [f"REMEDIATION (no waiver may cover it; check fails until it is fixed): {r['rule']} at {r['where']}: "
            f"{r['message']}; fix: {r['fix']}" for r in stage.remediation] + todo + ([takeover] if takeover else [])
    source = f"--from {from_dir}" if from_dir is not None else f"--kubeconfig {kubeconfig}" + (
        f" --context {context}" if context else "")
    if as_json:
        print(json.dumps({"ok": not problems, **result.as_dict(), "adoption": stage.as_dict(), "configs": configs,
                          "next": todo, "errors": problems}, indent=2))
    else:
        _print_import(workspace, result, configs, problems, todo, source)
        if stage.waived:
            print(f"adoption: {len(stage.waived)} rule(s) the cluster breaks as it runs, waived until fixed in "
                  f"policies/waivers.d/{env}-adoption.yaml (each with its fix; docs/adoption.md)")
    if problems:
        raise typer.Exit(code=1)


def _toolkit_floor(workspace: Path) -> str | None:
    """The CVE floor of the workspace's guardrails, which the import raises an older toolkit to; None where the
    guardrails cannot be read (check says why)."""
    from gpushare.core.guardrails import load_guardrails  # lazy: pydantic models, ~0.2 s to import

    try:
        return load_guardrails(workspace / "policies" / "guardrails.yaml").toolkit.min_version
    except GpushareError:
        return None


def _priorities(workspace: Path) -> dict[str, tuple[int, str]]:
    """gpushare's online and batch PriorityClasses (value, preemption policy) as the workspace's guardrails set
    them: a cluster's own class equal to one is kept in its place."""
    from gpushare.core.guardrails import load_guardrails  # lazy: pydantic models, ~0.2 s to import

    try:
        classes = load_guardrails(workspace / "policies" / "guardrails.yaml").tenancy.priority_classes
    except GpushareError:
        return {}
    return {str(k): (v.value, v.preemption_policy) for k, v in classes.items()}


def _check_env_name(env: str) -> None:
    import re

    from gpushare.core.spec import NAME_PATTERN  # lazy: pydantic models, ~0.2 s to import

    if re.fullmatch(NAME_PATTERN, env) is None or len(env) > 63:
        raise GpushareError(Problem(f"--env {env!r} is not a DNS label", path="--env",
                                    fix="use lowercase letters, digits and '-', e.g. prod"), exit_code=2)


def existing_profiles(workspace: Path) -> dict[str, object]:
    """The workspace's profiles by name: an imported profile equal to one of them reuses it."""
    from gpushare.core.spec import load_profile_file  # lazy: pydantic models, ~0.2 s to import

    found: dict[str, object] = {}
    for path in sorted((workspace / "profiles").glob("*.yaml")):
        profile, _ = load_profile_file(path)
        found[profile.name] = profile
    return found


def _write_files(workspace: Path, result: ImportResult) -> None:
    """Every file or none: all targets are checked before the first is written, and none may exist."""
    taken = [rel for rel in result.files if (workspace / rel).exists()]
    if taken:
        raise GpushareError(Problem(f"import would overwrite {', '.join(sorted(taken))}", file=str(workspace),
                                    fix="choose another --env name, or move those files away"), exit_code=2)
    for rel in result.files:
        check_output_file(workspace / rel)
    for rel, text in result.files.items():
        write_file(workspace / rel, text)


def _resolved_configs(out: Path, result: ImportResult) -> tuple[dict[str, list[str]], list[str], list[str]]:
    """Source config -> the content-named configs gpushare renders for it (one per distinct node content); the
    written environment's problems; what `gpushare check` will still ask for."""
    from gpushare.core.resolve import resolve  # lazy: pydantic models, ~0.2 s to import
    from gpushare.ops.brownfield.importer import still_needed  # lazy: pydantic models, ~0.2 s to import

    try:
        fleet = resolve(out / "environments" / f"{result.environment}.yaml", out / "profiles")
    except GpushareError as err:
        return {}, [str(p) for p in err.problems], []
    by_name = {n.name: n for n in fleet.nodes}
    configs: dict[str, set[str]] = {}
    for node in result.nodes:
        git = by_name[node.name]
        if node.device_plugin_config and git.device_plugin_config:
            configs.setdefault(f"device-plugin.config={node.device_plugin_config}", set()).add(
                git.device_plugin_config)
        if node.mig_config and git.mig_config:
            configs.setdefault(f"mig.config={node.mig_config}", set()).add(git.mig_config)
    return {k: sorted(v) for k, v in sorted(configs.items())}, [], still_needed(out, fleet)


def _print_import(out: Path, result: ImportResult, configs: dict[str, list[str]], problems: list[str],
                  todo: list[str], source: str) -> None:
    print(f"imported environment {result.environment} into {out}: {counted(len(result.files), 'file')}, "
          f"{counted(len(result.nodes), 'node')}")
    for used, profiles in result.mapping.items():
        print(f"  {used} -> profile {', '.join(profiles)}")
    for used, names in configs.items():
        print(f"  {used} -> {', '.join(names)} (rendered name)")
    if result.unsupported:
        print(f"not expressed ({len(result.unsupported)}; also in imports/{result.environment}-report.yaml):")
        for u in result.unsupported:
            print(f"  {u.object} {u.field}: {u.reason}")
    for p in problems:
        print(f"error: {p}")
    env = result.environment
    steps = [*todo, f"gpushare validate --env {env}", f"gpushare check --env {env}",
             f"gpushare drift --env {env} {source}"]
    print(f"next (in {out}; docs/adoption.md):")
    for i, step in enumerate(steps, 1):
        print(f"  {i}. {step}")


def drift_command(
    env: EnvOption,
    from_dir: FromOption = None,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    cluster: Annotated[str | None, typer.Option("--cluster", help="Which of the environment's clusters the dumps "
                                                "or the context show (needed where it has several).")] = None,
    stuck_after: Annotated[float, typer.Option(
        "--stuck-after", min=0, max=525_600, callback=finite,  # a year: beyond it the threshold means "never"
        help="Minutes a MIG change may stay pending or rebooting before it counts as drift.")] = 30.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="List every pending change under its node, not "
                                          "one line per kind.")] = False,
    as_json: JsonOption = False,
    timeout: TimeoutOption = DEFAULT_TIMEOUT,
) -> None:
    """Per node, Git against the cluster: gpushare's labels, MIG config and state, paused operands, device-plugin
    config against what the node advertises, taints, toolkit version, unknown nodes and missing hosts. Exit 1 on
    drift."""
    from gpushare.core.resolve import resolve_env  # lazy: pydantic models, ~0.2 s to import
    from gpushare.ops.brownfield.drift import find_drift  # lazy: pydantic models and Jinja2, ~0.3 s to import

    try:
        one_source(from_dir, kubeconfig)
        fleet = resolve_env(env)
        name = pick_cluster(list(fleet.clusters), cluster)
        state = read_cluster(from_dir, kubeconfig, context, timeout)
        report = find_drift(fleet, state, name, datetime.now(UTC), timedelta(minutes=stuck_after))
    except GpushareError as err:
        raise fail(err, as_json) from None
    if as_json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print_drift(report, verbose=verbose)
    if not report.ok:
        raise typer.Exit(code=1)


def pick_cluster(clusters: list[str], wanted: str | None) -> str:
    if wanted is None and len(clusters) == 1:
        return clusters[0]
    if wanted in clusters:
        return wanted
    raise GpushareError(Problem(f"--cluster {wanted!r} is not one of the environment's clusters" if wanted else
                                "the environment has several clusters", path="--cluster",
                                fix=f"name the one the dumps show: --cluster one of {', '.join(clusters)}"),
                        exit_code=2)


# The order kinds are listed in, within a node and in the counts: what a rollout refuses to start on first.
DRIFT_KINDS = ("missing-host", "unknown-node", "mig-state", "paused-operand", "advertised", "mig-config",
               "device-plugin", "taint", "label", "toolkit-version")


def print_drift(report: DriftReport, verbose: bool = False) -> None:
    """The summary first (counts by kind, nodes), then each drift item under its node, then the pending changes:
    one line per kind with the nodes it touches, or with `verbose` each under its node. Values are plain text,
    never markup (`labels[gpushare.io/pool]` keeps its brackets), wrapped at word boundaries."""
    from rich.console import Console
    from rich.text import Text

    console = Console(highlight=False)
    console.print(Text(_drift_summary(report)))
    counts = [(section, Text(", ".join(f"{k} {n}" for k, n in _by_kind(items).items())))
              for section, items in (("drift", report.drift), ("pending", report.pending)) if items]
    if counts:
        key_values(console, counts)
    if report.drift:
        console.print()
        console.print(Text("drift, by node:"))
        _print_by_node(console, report.drift, pending=False)
    if report.pending and verbose:
        console.print()
        console.print(Text("pending (the next rollout applies these), by node:"))
        _print_by_node(console, report.pending, pending=True)
    elif report.pending:
        console.print()
        console.print(Text("pending (the next rollout applies these; --verbose lists each):"))
        kinds = _by_kind(report.pending)
        digits = len(str(max(kinds.values())))
        room = max(20, console.width - 2 - max(len(k) for k in kinds) - 2)  # key_values' room beside the keys
        key_values(console, [(kind, Text(_nodes_text(f"{count:>{digits}}", sorted(
            {d.node for d in report.pending if d.kind == kind}, key=name_order), room, report.nodes)))
            for kind, count in kinds.items()])


def _drift_summary(report: DriftReport) -> str:
    drift = f"{counted(len(report.drift), 'drift item')} on {counted(len({d.node for d in report.drift}), 'node')}" \
        if report.drift else "no drift"
    pending = f"{len(report.pending)} pending on {counted(len({d.node for d in report.pending}), 'node')}" \
        if report.pending else "nothing pending"
    compared = f" ({counted(report.nodes, 'node')} compared)" if report.nodes else ""
    return f"{report.environment}: {drift}, {pending}{compared}"


def _kind_order(kind: str) -> tuple[int, str]:
    return (DRIFT_KINDS.index(kind) if kind in DRIFT_KINDS else len(DRIFT_KINDS), kind)


def _by_kind(items: list[Drift]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for d in sorted(items, key=lambda d: _kind_order(d.kind)):
        counts[d.kind] = counts.get(d.kind, 0) + 1
    return counts


def _print_by_node(console: Console, items: list[Drift], pending: bool) -> None:
    """A heading line per node (`node: 3 drift items`), then its items by kind: `kind  field  git: X  cluster: Y`
    where that fits the width, otherwise `kind  field` and the values beside their keys below it."""
    from rich.cells import cell_len
    from rich.text import Text

    by_node: dict[str, list[Drift]] = {}
    for d in items:
        by_node.setdefault(d.node, []).append(d)
    for node, entries in sorted(by_node.items(), key=lambda item: name_order(item[0])):
        console.print(Text(f"{node}: {f'{len(entries)} pending' if pending else counted(len(entries), 'drift item')}"))
        for d in sorted(entries, key=lambda d: _kind_order(d.kind)):  # stable: a kind's items keep their order
            line = f"  {d.kind}  {d.field}  git: {d.git}  cluster: {d.cluster}"
            if cell_len(line) <= console.width and "\n" not in line:
                console.print(Text(line), soft_wrap=True)
                continue
            console.print(Text(f"  {d.kind}  {d.field}"))
            key_values(console, [("git", Text(d.git)), ("cluster", Text(d.cluster))], indent=4)


def _nodes_text(count: str, nodes: list[str], room: int, compared: int = 0) -> str:
    """`30 on 5 nodes: a, b, c, d, e`, naming as many nodes as fit in `room` and then `and N more`; one node:
    `1 on a`; every node compared (more than one): `30 on all 5 nodes`."""
    if len(nodes) == 1:
        return f"{count} on {nodes[0]}"
    if len(nodes) == compared:
        return f"{count} on all {compared} nodes"
    text = f"{count} on {len(nodes)} nodes: {nodes[0]}"
    for i, name in enumerate(nodes[1:], 1):
        rest = len(nodes) - i - 1
        more = f" and {rest} more" if rest else ""
        if len(text) + 2 + len(name) + len(more) > room:  # the previous name's check left room for `and N more`
            return f"{text} and {len(nodes) - i} more"
        text += f", {name}"
    return text
