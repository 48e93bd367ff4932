"""The gpushare command line: a thin Typer layer over the library, one module per command group.

Heavy imports (pydantic models, Jinja2, Pulumi, Ansible) happen inside the commands that need them, so that
`gpushare mig validate`, called in CI loops, starts cold in well under half a second."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import typer

from gpushare.cli.adopt import drift_command, import_command
from gpushare.cli.capacity import capacity_command
from gpushare.cli.check import check_command
from gpushare.cli.common import fail
from gpushare.cli.demo import demo_metrics_command
from gpushare.cli.diff import diff_command
from gpushare.cli.fleet import plan_command, render_command, schema_command, validate_command
from gpushare.cli.gpu import discover_command, gpus_command, mig_app
from gpushare.cli.init import init_command
from gpushare.cli.pack import pack_command
from gpushare.cli.preview import preview_command
from gpushare.cli.promote import promote_command
from gpushare.cli.rollout import ansible_env_command, rollout_command
from gpushare.cli.showback import showback_command
from gpushare.cli.usage import lay_out
from gpushare.core.errors import EXCERPT_CHARS, GpushareError, printable

app = typer.Typer(
    name="gpushare",
    help="Infrastructure as code for shared GPUs: check, plan and render MIG, time-slicing and MPS fleets.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.command("init")(init_command)
app.command("validate")(validate_command)
app.command("plan")(plan_command)
app.command("render")(render_command)
app.add_typer(mig_app, name="mig")
app.command("gpus")(gpus_command)
app.command("discover", help="List the local GPUs through NVML and match them to the catalog.")(discover_command)
app.command("check")(check_command)
app.command("capacity")(capacity_command)
app.command("preview")(preview_command)
app.command("pack")(pack_command)
app.command("promote")(promote_command)
app.command("rollout")(rollout_command)
app.command("ansible-env")(ansible_env_command)
app.command("showback")(showback_command)
app.command("demo-metrics")(demo_metrics_command)
app.command("import")(import_command)
app.command("drift")(drift_command)
app.command("diff")(diff_command)
app.command("schema")(schema_command)
lay_out(app)  # last, after every command: their --help and usage errors (gpushare/cli/usage.py)

__all__ = ["app", "fail", "main"]


EXIT_INTERNAL = 70  # EX_SOFTWARE: gpushare itself failed, whatever the input


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _terminate_as_interrupt() -> None:
    """SIGTERM and SIGHUP (a CI job cancelled, a terminal closed) end gpushare as Ctrl-C does: by an exception, so
    every write's cleanup runs (temporary files removed, the old output left whole) instead of the process simply
    stopping. A handler someone else installed is left alone."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _interrupt)


def main(argv: list[str] | None = None) -> Any:
    """The one boundary of every command: exit 0, 1 (invalid input or a failed check), 2 (unusable input or
    usage), 3 (no GPU or NVML), 130 (interrupted) or 70 (an internal error, in one line); never a traceback."""
    args = list(argv if argv is not None else sys.argv[1:])
    as_json = "--json" in args
    _terminate_as_interrupt()
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

    first = what.splitlines()[0][:EXCERPT_CHARS] if what else "unknown"
    line = (f"gpushare: internal error ({first}); this is a bug in gpushare, not in your input. Report it with "
            f"the output of: GPUSHARE_DEBUG=1 gpushare {shlex.join(args)}")
    line = printable(line)  # the arguments as typed: a control character in one must not reach the terminal
    if as_json:
        print(json.dumps({"ok": False, "errors": [line], "internal": True}))
    else:
        print(line, file=sys.stderr)
    return EXIT_INTERNAL
