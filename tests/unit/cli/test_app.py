"""The command line as a whole (gpushare.cli): `python -m gpushare`, every option of every command documented in
docs/cli.md and no other, every command a message names exists, and every error starts with a lower-case
"error:"."""

from __future__ import annotations

from typer.testing import CliRunner

from gpushare.cli import app
from tests.conftest import ROOT

runner = CliRunner()


def test_python_m_gpushare_works() -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "gpushare", "--help"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and "plan" in proc.stdout


def test_every_option_of_every_command_is_in_cli_md_and_no_other() -> None:
    """docs/cli.md says each option is checked against `--help`: this is the check (a flag pair counts once)."""
    import re

    import typer

    root = typer.main.get_command(app)
    documented: dict[tuple[str, ...], set[str]] = {}
    for row in (ROOT / "docs" / "cli.md").read_text().splitlines():
        if not row.startswith("| `gpushare "):
            continue
        usage = row.split("`")[1].split()[1:]
        command, path = root, []
        while usage and usage[0] in getattr(command, "commands", {}):
            command = command.commands[usage[0]]
            path.append(usage.pop(0))
        documented.setdefault(tuple(path), set()).update(re.findall(r"(?<![\w-])--[a-z][a-z-]*", " ".join(usage)))
    wrong = {}
    for path, said in documented.items():
        command = root
        for name in path:
            command = command.commands[name]
        options = [[o for o in p.opts + p.secondary_opts if o.startswith("--")] for p in command.params
                   if p.param_type_name == "option"]
        missing = [names[0] for names in options if not said & set(names)]
        unknown = sorted(said - {o for names in options for o in names})
        if missing or unknown:
            wrong[" ".join(path)] = (missing, unknown)
    assert wrong == {}
    assert {" ".join(p) for p in documented} >= {"validate", "plan", "pack", "check", "gpus", "init"}


def test_every_command_a_message_names_exists() -> None:
    """Fixes and hints say "run `gpushare X`": X must be a command (`gpushare gpu list` was not)."""
    import re

    import typer

    root = typer.main.get_command(app)
    named: set[tuple[str, ...]] = set()
    for source in (ROOT / "gpushare").rglob("*.py"):
        for words in re.findall(r"`gpushare ((?:[a-z][a-z-]*)(?: [a-z][a-z-]*)?)", source.read_text()):
            named.add(tuple(words.split()))
    assert ("gpus",) in named and len(named) > 10
    missing = []
    for words in sorted(named):
        command = getattr(root, "commands", {}).get(words[0])
        if command is None:
            missing.append(" ".join(words))
        elif len(words) > 1 and hasattr(command, "commands") and words[1] not in command.commands:
            missing.append(" ".join(words))
    assert missing == []


def test_errors_start_lower_case_error_everywhere() -> None:
    """A usage error Click finds and a problem gpushare finds both read `error: ...`, never `Error`."""
    import re
    import subprocess
    import sys

    usage = runner.invoke(app, ["check", "--bogus"])
    assert usage.exit_code == 2, usage.output
    assert "error: No such option: --bogus" in usage.output and "Error" not in usage.output
    assert "Try 'gpushare check --help' for help." in usage.output
    missing = runner.invoke(app, ["capacity", "--env", "dev"])
    assert missing.exit_code == 2 and "error: Missing option '--prometheus'" in missing.output
    domain = runner.invoke(app, ["validate", "--env", "staging"])
    assert domain.exit_code == 2 and domain.output.startswith("error: 1 problem"), domain.output
    # As a user runs it, through the boundary.
    proc = subprocess.run([sys.executable, "-m", "gpushare", "rollout", "--env", "dev", "--forks", "0"],
                          capture_output=True, text=True, check=False, cwd=ROOT)
    assert proc.returncode == 2 and "error: Invalid value for '--forks'" in proc.stderr, proc.stderr
    assert "Error" not in proc.stderr + proc.stdout
    written = [f"{path.relative_to(ROOT)}:{n}" for path in (ROOT / "gpushare").rglob("*.py")
               for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"(?<!\w)Error:", line)]
    assert written == []
