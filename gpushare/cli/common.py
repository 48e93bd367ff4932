"""What every command shares: the common options and `fail`, which prints a domain error (located problems
with their fixes, or one JSON object) and returns the exit to raise."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpushare.core.errors import GpushareError, Problem, printable
from gpushare.ops.timeouts import MAX_TIMEOUT, TIMEOUT_ENV

if TYPE_CHECKING:
    from rich.console import Console, JustifyMethod, RenderableType
    from rich.text import Text

    Cell = str | Text

EnvOption = Annotated[str, typer.Option("--env", "-e", help="Environment name under environments/, or a path.")]
ProfilesOption = Annotated[
    Path | None, typer.Option("--profiles", help="Profiles directory (default: profiles/ beside environments/).")
]
PrometheusOption = Annotated[str, typer.Option("--prometheus",
                                               help="Prometheus base URL, e.g. http://prometheus:9090")]
LAST_UNIX_SECOND = 253_402_300_799  # 9999-12-31T23:59:59Z, the last time datetime and Prometheus both hold


def finite(param: typer.CallbackParam, value: float | None) -> float | None:
    """Click's float options take `nan` and `inf`, which no option of gpushare means (and nan passes min/max).
    A located error, not a usage box: the CLI's boundary prints it like any other, with --json too."""
    if value is not None and not math.isfinite(value):
        raise GpushareError(Problem(f"{value} is not a finite number", path=_option(param),
                                    fix="give a number, e.g. 300"), exit_code=2)
    return value


def unix_time(param: typer.CallbackParam, value: float | None) -> float | None:
    if finite(param, value) is not None and not 0 <= value <= LAST_UNIX_SECOND:  # type: ignore[operator]
        raise GpushareError(Problem(f"{value:g} is not a time in Unix seconds between 1970 and 9999",
                                    path=_option(param), fix="give one, e.g. `date +%s`, or leave the option out "
                                    "for now"), exit_code=2)
    return value


def _option(param: typer.CallbackParam) -> str:
    return max(param.opts, key=len) if param.opts else str(param.name)


EndOption = Annotated[float | None, typer.Option("--end", callback=unix_time,
                                                 help="End of the window, Unix seconds (default: now).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
# The one bound on gpushare's requests to a server, the same option (and variable) on every command that reads one.
TimeoutOption = Annotated[float, typer.Option(
    "--timeout", min=0.1, max=MAX_TIMEOUT, callback=finite, envvar=TIMEOUT_ENV, show_envvar=True,
    help="Seconds one request to the server may take, from connecting to the last byte of its answer; a server that "
         "stays silent or trickles bytes is given up after it.")]


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
            # Messages quote user input ([pool] names, YAML paths): never read them as Rich markup, and never hand
            # the terminal a control character from a file name or value (an escape sequence would act, not show).
            where = f"[bold]{escape(printable(p.where))}[/]: " if p.where else ""
            console.print(f"  {where}{escape(printable(p.message, keep=chr(10) + chr(9)))}", soft_wrap=True)
            if p.fix:
                console.print(f"    [green]fix[/]: {escape(printable(p.fix, keep=chr(10) + chr(9)))}", soft_wrap=True)
    return typer.Exit(code=err.exit_code)


def fits(console: Console, tables: Sequence[RenderableType]) -> bool:
    """Whether every table shows at the console's width with no cell wrapped."""
    from rich.measure import Measurement

    wide = console.options.update_width(10_000)
    return all(Measurement.get(console, wide, t).maximum <= console.width for t in tables)


def as_text(cell: Cell) -> Text:
    """A cell as Rich Text: plain strings are never read as markup (`labels[gpushare.io/pool]` stays whole)."""
    from rich.text import Text

    return cell if isinstance(cell, Text) else Text(cell)


def print_records(console: Console, title: str, columns: Sequence[str], rows: Sequence[Mapping[str, Cell]], *,
                  heading: Sequence[str] = (), head: Callable[[Mapping[str, Cell]], Cell] | None = None,
                  justify: Mapping[str, JustifyMethod] | None = None, no_wrap: Collection[str] = (),
                  show_lines: bool = True, shell: Collection[str] = ()) -> None:
    """Rows as a table where it fits the console's width unwrapped; otherwise one block per row, so nothing is cut
    mid-word into a narrow column: a heading line (the `heading` columns, default the first), then `column: value`
    for the other non-empty columns, the values wrapped beside their keys. `head` formats the heading line from the
    row (default: the heading columns' values, two spaces apart). The `shell` columns hold shell commands, one a
    line: in a block, one too long for its line is continued with ` \\`, so it still runs as pasted."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, show_lines=show_lines)
    for col in columns:
        table.add_column(col, overflow="fold", justify=(justify or {}).get(col, "left"),
                         no_wrap=col in no_wrap)
    for row in rows:
        table.add_row(*(as_text(row.get(col, "")) for col in columns))
    if fits(console, [table]):
        console.print(table)
        return
    head_columns = tuple(heading or columns[:1])
    console.print(Text(title, style="bold"))
    for row in rows:
        line = as_text(head(row)) if head is not None else \
            Text("  ").join(as_text(row[c]) for c in head_columns if row.get(c))
        rest = [(col, row[col]) for col in columns if col not in head_columns and row.get(col)]
        if rest:
            console.print()
        console.print(line)
        if rest:
            key_values(console, [(col, as_text(value)) for col, value in rest], shell=shell)


def key_values(console: Console, pairs: Sequence[tuple[str, Text]], indent: int = 2,
               shell: Collection[str] = ()) -> None:
    """`key: value` lines, each value wrapped at word boundaries under its own column (no trailing padding); the
    values of `shell` keys are shell commands, continued with ` \\` where one is too long for its line."""
    from rich.text import Text

    width = max(len(k) for k, _ in pairs) + 2
    room = max(20, console.width - indent - width)
    for key, value in pairs:
        lines = [Text(part) for command in value.plain.splitlines() for part in shell_lines(command, room)] \
            if key in shell else value.wrap(console, room, overflow="fold")
        for i, line in enumerate(lines):
            line.rstrip()
            head = f"{key}:".ljust(width) if i == 0 else " " * width
            console.print(Text(" " * indent + head) + line, soft_wrap=True)


_SHELL_WORD = re.compile(r"""(?:[^\s'"]+|'[^']*'|"(?:\\.|[^"\\])*")+""")


def shell_lines(command: str, width: int) -> list[str]:
    """A shell command in lines of at most `width` where its words allow, each but the last ending ` \\` (the shell
    reads them as one line); broken only between words, never inside a quoted one."""
    lines: list[str] = []
    for word in _SHELL_WORD.findall(command):
        if lines and len(lines[-1]) + 1 + len(word) + 2 <= width:
            lines[-1] += f" {word}"
        else:
            lines.append(f"  {word}" if lines else word)
    return [f"{line} \\" for line in lines[:-1]] + lines[-1:] if lines else [command]
