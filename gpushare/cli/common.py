"""What every command shares: the common options and `fail`, which prints a domain error (located problems
with their fixes, or one JSON object) and returns the exit to raise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from gpushare.core.errors import GpushareError

EnvOption = Annotated[str, typer.Option("--env", "-e", help="Environment name under environments/, or a path.")]
ProfilesOption = Annotated[
    Path | None, typer.Option("--profiles", help="Profiles directory (default: profiles/ beside environments/).")
]
PrometheusOption = Annotated[str, typer.Option("--prometheus",
                                               help="Prometheus base URL, e.g. http://prometheus:9090")]
EndOption = Annotated[float | None, typer.Option("--end", help="End of the window, Unix seconds (default: now).")]
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
