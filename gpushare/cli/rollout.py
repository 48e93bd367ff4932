"""`gpushare rollout`: an environment rolled out in canary batches with health gates, resumable, with rollback."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpushare.cli.common import TimeoutOption, fail, finite, print_records
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.files import check_output_file
from gpushare.core.paths import ansible_environment, mitogen_environment, project_root
from gpushare.core.words import counted
from gpushare.ops.rollout.batches import DEFAULT_BATCHES, parse_batches
from gpushare.ops.timeouts import AWX_JOB_TIMEOUT, DEFAULT_TIMEOUT, GATE_TIMEOUT, MAX_AWX_JOB_TIMEOUT

if TYPE_CHECKING:
    from rich.progress import TaskID

    from gpushare.core.resolve import ResolvedFleet
    from gpushare.ops.rollout.execute import Result
    from gpushare.ops.rollout.journal import Journal
    from gpushare.ops.rollout.plan import RolloutPlan, Step

EXIT_STOPPED = 3  # a manual step (Pulumi without its CLI, a Git revert) is pending: run it, then --resume


def rollout_command(
    env: Annotated[str, typer.Option("--env", "-e", help="Environment name under environments/, or a path.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the batches and steps; change nothing.")] = False,
    batches: Annotated[str, typer.Option("--batches", help="Batch sizes: host counts or shares of all hosts, "
                                         "the last repeating (as Ansible's serial).")] = DEFAULT_BATCHES,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the journal's unfinished rollout; hosts that "
                                         "passed are not run again.")] = False,
    rollback: Annotated[bool, typer.Option("--rollback", help="Re-apply the last revision that succeeded to the "
                                           "hosts that changed since.")] = False,
    kubeconfig: Annotated[Path | None, typer.Option("--kubeconfig", help="Kubeconfig for cordon, labels and the "
                                                    "device-plugin gate (kubectl).")] = None,
    journal_path: Annotated[Path | None, typer.Option("--journal", help="Journal file (default "
                                                      ".gpushare/rollouts/<env>/journal.jsonl).")] = None,
    pulumi_confirmed: Annotated[bool, typer.Option("--pulumi-confirmed", help="Without the Pulumi CLI: the printed "
                                                   "Pulumi commands have been run (for non-interactive runs).")]
    = False,
    previous: Annotated[str | None, typer.Option("--previous", help="Git revision the fleet runs now, where the "
                                                 "journal has no succeeded rollout: its configs are kept until the "
                                                 "prune step.")] = None,
    forks: Annotated[int, typer.Option("--forks", min=1, help="Ansible forks per batch.")] = 10,
    gate_timeout: Annotated[float, typer.Option("--gate-timeout", min=0, max=86_400, callback=finite,
                                                help="Seconds to wait for the device plugin to advertise a node's "
                                                     "resources.")] = GATE_TIMEOUT,
    waivers: Annotated[Path | None, typer.Option("--waivers", help="Waivers file for the check "
                                                 "(default policies/waivers.yaml).")] = None,
    accept_drift: Annotated[bool, typer.Option("--accept-drift", help="Start although the hosts show drift the "
                                               "rollout cannot explain (see `gpushare drift`).")] = False,
    accept_impact: Annotated[bool, typer.Option("--accept-impact", help="Adopted environments: start although "
                                                "`gpushare diff` finds "
                                                "running work the rollout would deny, leave Pending, evict or "
                                                "refuse.")] = False,
    awx_url: Annotated[str | None, typer.Option("--awx-url", help="Hand each batch to this AWX / automation "
                                                "controller as a job launch instead of running Ansible here "
                                                "(token in $CONTROLLER_OAUTH_TOKEN).")] = None,
    awx_template: Annotated[list[str] | None, typer.Option("--awx-template", help="With --awx-url: PLAYBOOK=ID, the "
                                                           "job template of rollout.yml and of verify.yml.")] = None,
    awx_job_timeout: Annotated[float | None, typer.Option(
        "--awx-job-timeout", min=1, max=MAX_AWX_JOB_TIMEOUT, callback=finite,
        help=f"With --awx-url: seconds a batch's job may run, from its launch to its end (default "
             f"{AWX_JOB_TIMEOUT:g}); past it the job is canceled and its hosts fail.")] = None,
    timeout: TimeoutOption = DEFAULT_TIMEOUT,
    mitogen: Annotated[bool, typer.Option("--mitogen", help="Converge each batch under Mitogen's mitogen_free "
                                          "strategy (pip install 'gpushare[mitogen]'): less controller CPU per "
                                          "task; not with --awx-url.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (no progress display).")] = False,
) -> None:
    """Roll an environment out: Pulumi adds configs, bare-metal hosts converge batch by batch behind health gates,
    Pulumi prunes; resumable from the journal, with rollback. Exit 0 done, 1 refused or failed, 2 bad input,
    3 stopped at a manual step."""
    from gpushare.core.resolve import resolve_env  # lazy: pydantic models, ~0.2 s to import
    from gpushare.ops.rollout.journal import Journal  # lazy: pydantic models, ~0.2 s to import
    from gpushare.ops.rollout.plan import plan_rollout, state_dir  # lazy: pydantic models and Jinja2, ~0.3 s to import

    # A dry run resolves the journal's revisions in a throwaway folder: it changes nothing, revisions/ included.
    scratch = Path(tempfile.mkdtemp(prefix="gpushare-dry-run-")) if dry_run else None
    try:
        if resume and rollback:
            raise GpushareError(Problem("--resume and --rollback together", path="--rollback",
                                        fix="--resume continues the unfinished rollout or rollback; give one"),
                                exit_code=2)
        if kubeconfig is not None and not kubeconfig.exists():
            raise GpushareError(Problem("file not found", file=str(kubeconfig), path="--kubeconfig",
                                        fix="give the kubeconfig of the environment's clusters"), exit_code=2)
        parse_batches(batches)
        templates = _awx_templates(awx_url, awx_template or [], awx_job_timeout)
        strategy_env = _strategy_env(mitogen, awx_url)
        fleet = resolve_env(env)
        journal = Journal(journal_path or state_dir(fleet.environment) / "journal.jsonl")
        check_output_file(journal.path, [fleet.source], option="--journal")
        if kubeconfig is not None and not (resume or rollback or dry_run or accept_drift):
            _refuse_on_drift(fleet, kubeconfig)
        if not (resume or rollback):
            _check(env, waivers, as_json, refuse=True)
        if kubeconfig is not None and fleet.env.adoption is not None and not (resume or rollback or accept_impact):
            _refuse_on_impact(env, fleet, kubeconfig)
        plan = plan_rollout(fleet.source, fleet, journal, batches, kind="rollback" if rollback else "rollout",
                            resume=resume, kubeconfig=kubeconfig is not None, previous=previous, scratch=scratch)
        if rollback:
            _check(str(plan.env_file), waivers, as_json, refuse=False)
        if dry_run:
            if as_json:
                print(json.dumps(plan.as_dict(), indent=2))
            else:
                _print_plan(plan)
            return
    except GpushareError as err:
        raise fail(err, as_json) from None
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)

    if not (plan.done_hosts or any(plan.batches)) and plan.kind == "rollback":
        _say(as_json, "; ".join(plan.notes))
        return

    result = _execute(plan, journal, kubeconfig, pulumi_confirmed, forks, gate_timeout, as_json, awx_url, templates,
                      strategy_env, awx_job_timeout if awx_job_timeout is not None else AWX_JOB_TIMEOUT, timeout)
    if as_json:
        print(json.dumps({"ok": result.status == "succeeded", **plan.as_dict(), **result.as_dict()}, indent=2))
    else:
        from rich.console import Console

        console = Console(highlight=False)
        colour = {"succeeded": "green", "failed": "red", "stopped": "yellow"}[result.status]
        console.print(f"[{colour}]{plan.kind} {result.status}[/]: ", end="")
        console.print(result.reason, markup=False, soft_wrap=True)
        for f in result.failures:
            console.print(f"  {f.host} ({f.gate}): ", end="", style="red")
            console.print(f.message, markup=False, soft_wrap=True)
        console.print(f"journal: {result.journal}", markup=False)
    if result.status == "failed":
        raise typer.Exit(code=1)
    if result.status == "stopped":
        raise typer.Exit(code=EXIT_STOPPED)


def _say(as_json: bool, message: str) -> None:
    if as_json:
        print(json.dumps({"ok": True, "message": message}))
    else:
        print(message)


def _refuse_on_drift(fleet: ResolvedFleet, kubeconfig: Path) -> None:
    from gpushare.ops.rollout.adapters import Kube  # lazy: pydantic models and Jinja2, ~0.3 s to import
    from gpushare.ops.rollout.drift_gate import unexplained_drift  # lazy: pydantic models and Jinja2, ~0.3 s to import

    drift = unexplained_drift(fleet, Kube(kubeconfig))
    if drift:
        raise GpushareError([Problem(f"{fleet.environment}: {len(drift)} drift items the rollout cannot explain; it "
                                     "does not start", fix=f"repair them (gpushare drift --env {fleet.environment} "
                                     "--kubeconfig ...), or pass --accept-drift to roll out anyway"),
                             *[Problem(f"{d.kind}: git {d.git}, cluster {d.cluster}", file=d.node, path=d.field)
                               for d in drift]], exit_code=1)


def _refuse_on_impact(env: str, fleet: ResolvedFleet, kubeconfig: Path) -> None:
    """`gpushare diff` per cluster (through its kubeconfig_context), on an adopted environment (its `adoption:` block:
    a cluster that ran before gpushare, whose guards are staged): a rollout that would break running work (a guard
    moved to deny or enforce, a taint, a quota, a resource name) does not start unless told to."""
    from gpushare.ops.brownfield.livediff import BREAKING, Api, live_diff  # lazy: pulls in pulumi, ~1 s to import

    problems = []
    for cluster in fleet.clusters.values():
        report = live_diff(env, Api(kubeconfig, cluster.kubeconfig_context), cluster.name)
        for i in report.impact:
            if i.effect in BREAKING:
                problems.append(Problem(f"{i.workload} {i.effect}: {i.reason}", file=f"cluster {cluster.name}",
                                        path=i.cause, fix=i.fix))
    if problems:
        raise GpushareError([Problem(f"{fleet.environment}: the rollout would break {len(problems)} running "
                                     "workload(s) (impact below, as `gpushare diff` shows it); it does not start",
                                     fix=f"fix what each says (gpushare diff --env {fleet.environment} --kubeconfig "
                                     "...), or pass --accept-impact to roll out anyway"), *problems], exit_code=1)


def _check(env: str, waivers: Path | None, as_json: bool, refuse: bool) -> None:
    """`gpushare check` (with the offline plan): a rollout of a failing environment refuses to start."""
    from gpushare.ops.preview import plan_resources  # lazy: pulls in pulumi, ~1 s to import
    from gpushare.policy.context import context_for  # lazy: pydantic models and Jinja2, ~0.3 s to import
    from gpushare.policy.evaluate import evaluate  # lazy: pydantic models and Jinja2, ~0.3 s to import
    from gpushare.policy.waivers import load_waivers  # lazy: pydantic models and Jinja2, ~0.3 s to import

    ctx = context_for(env, plan_resources(env))
    waiver_list, waiver_file = load_waivers(waivers)
    report = evaluate(ctx, waiver_list, date.today(), waiver_file)
    if report.ok:
        return
    problems = [Problem(f"{v.rule}: {v.message}", path=v.where, fix=v.fix) for v in report.violations
                if v.level == "mandatory"]
    if refuse:
        raise GpushareError([Problem(f"{report.environment} fails `gpushare check`; the rollout does not start",
                                     fix=f"fix the violations below (gpushare check --env {env})"), *problems],
                            exit_code=1)
    print(f"warning: the revision rolled back to fails `gpushare check` now ({len(problems)} mandatory "
          "violations); rolling back anyway", file=sys.stderr)


def _print_plan(plan: RolloutPlan) -> None:
    from rich.console import Console
    from rich.text import Text

    console = Console(highlight=False)
    dirty = " (uncommitted changes)" if plan.dirty else ""
    title = f"gpushare {plan.kind}: {plan.environment} at {plan.revision[:12]}{dirty}"
    rows: list[dict[str, str | Text]] = []
    for i, step in enumerate(plan.steps, 1):
        d = step.detail
        if step.step == "batch":
            done = sorted(set(d["hosts"]) - set(d["run"]))
            what = f"batch {d['batch']}: {d['playbook']} --limit, then gates {', '.join(d['gates'])}"
            hosts = ", ".join(d["run"]) + (f" (done: {', '.join(done)})" if done else "")
            rows.append({"#": str(i), "step": step.step, "what": what, "hosts": hosts})
        else:
            what_text = Text(str(d.get("description", "")))
            if d.get("skip"):
                what_text.append(f" (skipped: {d['skip']})", style="dim")
            rows.append({"#": str(i), "step": step.step, "what": what_text,
                         "commands": "\n".join(d.get("commands", []))})
    # Narrower than the table: a block per step headed "#  step"; a command too long for its line is continued
    # with a backslash, so each one still runs as pasted.
    print_records(console, title, ("#", "step", "what", "hosts", "commands"), rows, heading=("#", "step"),
                  no_wrap=("commands",), shell=("commands",))
    for note in plan.notes:
        console.print(f"note: {note}", markup=False)


def _awx_templates(url: str | None, values: list[str], job_timeout: float | None = None) -> dict[str, int]:
    from gpushare.ops.rollout.awx import controller_url, parse_templates  # lazy: pydantic, Jinja2: ~0.3 s

    if url is None:
        if values:
            raise GpushareError(Problem("--awx-template without --awx-url", path="--awx-template",
                                        fix="give --awx-url, or leave both out to run Ansible here"), exit_code=2)
        if job_timeout is not None:
            raise GpushareError(Problem("--awx-job-timeout without --awx-url", path="--awx-job-timeout",
                                        fix="give --awx-url, or leave --awx-job-timeout out to run Ansible here"),
                                exit_code=2)
        return {}
    controller_url(url)  # http(s) with a host, nothing a URL cannot carry: refused here, before anything runs
    return parse_templates(values)


def _strategy_env(mitogen: bool, awx_url: str | None) -> dict[str, str]:
    """--mitogen: the settings that run the converge plays under Mitogen, refused before anything runs where Mitogen
    is missing or the batches go to AWX (its execution environment decides the strategy: -e gpushare_strategy)."""
    if not mitogen:
        return {}
    if awx_url is not None:
        raise GpushareError(Problem("--mitogen with --awx-url", path="--mitogen",
                                    fix="set gpushare_strategy=mitogen_free in the job template's extra variables "
                                        "(with Mitogen in its execution environment), and leave --mitogen out"),
                            exit_code=2)

    return mitogen_environment()


def _execute(plan: RolloutPlan, journal: Journal, kubeconfig: Path | None, pulumi_confirmed: bool, forks: int,
             gate_timeout: float, as_json: bool, awx_url: str | None = None,
             awx_templates: dict[str, int] | None = None, strategy_env: dict[str, str] | None = None,
             awx_job_timeout: float = AWX_JOB_TIMEOUT, timeout: float = DEFAULT_TIMEOUT) -> Result:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from gpushare.ops.rollout import adapters  # lazy: pydantic models and Jinja2, ~0.3 s to import
    from gpushare.ops.rollout.execute import Progress as Callbacks  # lazy: pydantic models and Jinja2, ~0.3 s to import
    from gpushare.ops.rollout.execute import execute  # lazy: pydantic models and Jinja2, ~0.3 s to import

    err = Console(stderr=True, highlight=False)

    def confirm(step: Step) -> bool:
        commands = step.detail["commands"]
        if pulumi_confirmed:
            err.print(f"{step.step}: confirmed as run (--pulumi-confirmed):", markup=False)
            for c in commands:
                err.print(f"  {c}", markup=False)
            return True
        err.print(f"{step.step} (the Pulumi CLI is not installed): {step.detail.get('description', '')}. Run:",
                  markup=False)
        for c in commands:
            err.print(f"  {c}", markup=False)
        if sys.stdin.isatty() and not as_json:
            return typer.confirm("Done?", default=False, err=True)
        return False

    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=err, disable=as_json, transient=False)
    host_tasks: dict[str, TaskID] = {}
    batch_tasks: dict[int, TaskID] = {}
    host_batch: dict[str, int] = {}

    def on_step(step: Step, status: str) -> None:
        if as_json or step.step == "check":
            return
        err.print(f"{step.step}: {status}", markup=False)
        if status == "manual":
            err.print(f"  next, by hand: {step.detail.get('description', '')}", markup=False)
            for c in step.detail.get("commands", []):
                err.print(f"    {c}", markup=False)

    def on_batch(index: int, hosts: list[str]) -> None:
        batch_tasks[index] = progress.add_task(f"batch {index} ({counted(len(hosts), 'host')})", total=len(hosts))
        for h in hosts:
            host_batch[h] = index
            host_tasks[h] = progress.add_task(f"  {h}: starting", total=1)

    def on_host(host: str, status: str) -> None:
        task = host_tasks.get(host)
        if task is None:
            return
        progress.update(task, description=f"  {host}: {status}")
        if status in ("passed", "failed"):
            progress.update(task, completed=1)
            progress.advance(batch_tasks[host_batch[host]])

    def on_task(host: str, task_name: str) -> None:
        task = host_tasks.get(host)
        if task is not None:
            progress.update(task, description=f"  {host}: {task_name}")

    ansible: adapters.AnsibleRunner
    if awx_url is not None:
        from gpushare.ops.rollout.awx import AwxBackend  # lazy: pydantic models and Jinja2, ~0.3 s to import

        # The controller's job templates bring their own inventory, credentials and kubeconfig.
        ansible = AwxBackend(awx_url, awx_templates or {}, journal.path.parent / "logs", timeout=awx_job_timeout,
                             request_timeout=timeout)
    else:
        ansible = adapters.AnsibleBackend(journal.path.parent / "logs", forks=forks, kubeconfig=kubeconfig,
                                          on_task=on_task, strategy_env=strategy_env)
    pulumi = adapters.PulumiRunner(confirm, on_output=None if as_json else lambda line: err.print(line, markup=False,
                                                                                                 end=""))
    kube = adapters.Kube(kubeconfig) if kubeconfig is not None else None
    with progress:
        return execute(plan, journal, ansible, pulumi, kube, Callbacks(on_step, on_batch, on_host),
                       gate_timeout=gate_timeout)


def ansible_env_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of shell lines.")] = False,
    mitogen: Annotated[bool, typer.Option(
        "--mitogen", help="Also run the converge plays (site.yml, rollout.yml) under Mitogen's mitogen_free strategy "
        "(pip install 'gpushare[mitogen]'): less controller CPU per task.")] = False,
) -> None:
    """Print the settings that point Ansible at this machine's gpushare (its playbooks, roles, modules, inventory
    plugin) and the workspace's ansible.cfg, for running playbooks by hand: eval "$(gpushare ansible-env)"."""
    import shlex

    try:
        env = ansible_environment(project_root())
        if mitogen:
            env.update(mitogen_environment())
    except GpushareError as err:
        raise fail(err, as_json) from None
    if as_json:
        print(json.dumps(env, indent=2))
        return
    for key, value in env.items():
        print(f"export {key}={shlex.quote(value)}")
