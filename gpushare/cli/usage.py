"""How gpushare explains its own usage: every command's `--help`, and the usage errors Click finds.

Help follows the terminal's width as the tables do: option names beside their help where the help column holds the
longest word, otherwise the help under the names, so no word is cut or shortened with "…" at 80 columns. Help text is
plain text, never Rich markup (`pip install 'gpushare[mitogen]'` stays whole). A usage error starts `error:` as every
other error of gpushare does. `lay_out` gives every command and group of a Typer app, at any depth, these classes."""

from __future__ import annotations

import inspect
import io
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperCommand, TyperGroup

try:  # Typer 0.28 carries its own copy of Click
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
except ImportError:  # pragma: no cover - earlier Typer releases use Click itself
    from click.exceptions import ClickException, NoArgsIsHelpError  # type: ignore[assignment]

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

MAX_NAMES = 30  # option names longer than this put their help on the next line
MIN_HELP = 30  # a help column narrower than this (or than its longest word) puts every help under its names
INDENT = 2


class Command(TyperCommand):
    def format_help(self, ctx: Any, formatter: Any) -> None:
        formatter.write(render_help(self, ctx))


class Group(TyperGroup):
    def format_help(self, ctx: Any, formatter: Any) -> None:
        formatter.write(render_help(self, ctx))

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, windows_expand_args: bool = True, **extra: Any) -> Any:
        """Click's standalone mode, with usage errors printed as gpushare prints errors (`error: ...`)."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except NoArgsIsHelpError as err:
            typer.echo(err.format_message())
            sys.exit(err.exit_code)
        except ClickException as err:
            print_usage_error(err)
            sys.exit(err.exit_code)
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)  # typer.Exit(code) comes back as its code


def lay_out(app: typer.Typer) -> None:
    """Give every command and group of `app`, found by walking it, gpushare's help and usage errors."""
    app.info.cls = Group
    for command in app.registered_commands:
        if command.cls in (None, TyperCommand):
            command.cls = Command
    for group in app.registered_groups:
        group.cls = Group
        if group.typer_instance is not None:
            lay_out(group.typer_instance)


def print_usage_error(err: ClickException) -> None:
    from rich.console import Console
    from rich.text import Text

    console = Console(stderr=True, highlight=False)
    ctx = getattr(err, "ctx", None)
    if ctx is not None:
        console.print(ctx.get_usage(), markup=False, soft_wrap=True)
        if ctx.command.get_help_option(ctx) is not None:
            console.print(f"Try '{ctx.command_path} {ctx.help_option_names[0]}' for help.", markup=False,
                          soft_wrap=True)
    console.print(Text.assemble(("error", "bold red"), ": ", err.format_message()), soft_wrap=True)


def render_help(command: Any, ctx: Any) -> str:
    """The help of `command` at the terminal's width (or COLUMNS; 80 where output is not a terminal)."""
    from rich.console import Console
    from rich.text import Text

    out = io.StringIO()
    console = Console(file=out, highlight=False, force_terminal=True if sys.stdout.isatty() else None)
    width = console.width
    usage = command.get_usage(ctx)
    _print(console, Text.assemble(("Usage:", "bold"), usage.removeprefix("Usage:")), width)
    if command.help:
        console.print()
        deprecated = "(deprecated) " if getattr(command, "deprecated", False) else ""
        for i, paragraph in enumerate(_paragraphs(deprecated + command.help)):
            if i:
                console.print()
            _print(console, Text(paragraph), width, INDENT)
    sections: list[tuple[str, list[tuple[Text, Text]]]] = [("Arguments", []), ("Options", [])]
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        names, text = record
        said = getattr(param, "help", None) or ""
        # Click appends `[default: ...; required]` to the help: shown dim, after it.
        said, extra = (said, text[len(said):]) if text.startswith(said) else (text, "")
        described = Text(" ".join(said.split()))
        if extra.strip():
            described.append(("  " if said else "") + extra.strip(), style="dim")
        section = sections[0][1] if param.param_type_name == "argument" else sections[1][1]
        section.append((Text(names, style="bold cyan"), described))
    if hasattr(command, "list_commands"):
        rows = []
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            about = sub.short_help or " ".join((sub.help or "").split())
            rows.append((Text(name, style="bold cyan"), Text(about)))
        sections.append(("Commands", rows))
    for title, rows in sections:
        if rows:
            console.print()
            console.print(Text(f"{title}:", style="bold"))
            _rows(console, rows, width)
    if getattr(command, "epilog", None):
        for paragraph in _paragraphs(command.epilog):
            console.print()
            _print(console, Text(paragraph), width, INDENT)
    return out.getvalue()


def _paragraphs(text: str) -> list[str]:
    """Click's rules: paragraphs apart, each rewrapped, except one marked with \\b (kept line by line)."""
    out = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        if paragraph.startswith("\b"):
            out.append(paragraph.lstrip("\b").strip("\n"))
        elif paragraph.strip():
            out.append(" ".join(paragraph.split()))
    return out


def _print(console: Console, text: Text, width: int, indent: int = 0) -> None:
    from rich.text import Text

    for line in text.wrap(console, max(10, width - indent)):
        line.rstrip()
        console.print(Text(" " * indent) + line, soft_wrap=True)


def _rows(console: Console, rows: list[tuple[Text, Text]], width: int) -> None:
    """Names beside their help where the help column holds every word of it, else the help under the names."""
    from rich.text import Text

    names = max((n.cell_len for n, _ in rows if n.cell_len <= MAX_NAMES), default=0)
    room = width - INDENT - names - 2
    longest = max((len(w) for _, about in rows for w in about.plain.split()), default=0)
    beside = names > 0 and room >= max(MIN_HELP, longest)
    for name, about in rows:
        if beside and name.cell_len <= names:
            lines = about.wrap(console, room) or [Text()]
            for i, line in enumerate(lines):
                line.rstrip()
                head = Text(" " * INDENT) + name + " " * (names - name.cell_len + 2) if i == 0 else \
                    Text(" " * (INDENT + names + 2))
                console.print(head + line, soft_wrap=True)
        else:
            console.print(Text(" " * INDENT) + name, soft_wrap=True)
            _print(console, about, width, INDENT + 4)
