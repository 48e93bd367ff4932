"""The one exception type the CLI turns into a readable message and a non-zero exit."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Characters of a server's answer, an exception's text or a path quoted in a message: enough to recognise it, and a
# message stays a few lines however long (or hostile) what it quotes.
EXCERPT_CHARS = 300
# What a terminal acts on instead of showing: C0 controls (ESC starts an escape sequence that can recolour, move the
# cursor, set the window title or hide text; CR rewrites the line), DEL, C1 controls (0x9b is a one-byte CSI), and
# Unicode's bidirectional overrides and isolates, which reorder what is shown ("Trojan Source").
_UNSHOWABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str, keep: str = "") -> str:
    """`text` with every character a terminal would act on written as an escape (`\\x1b`, `\\u202e`), so a name from
    user input (a file name, an option's value) prints as what it is; the characters in `keep` (e.g. newline and
    tab in a message of several lines) stay. Rich markup escaping is another matter: do both."""
    return _UNSHOWABLE.sub(lambda m: m.group() if m.group() in keep else _escaped(m.group()), text)


def _escaped(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input: where it is, what is wrong, and how to fix it."""

    message: str
    file: str | None = None
    path: str | None = None
    fix: str | None = None
    line: int | None = None

    @property
    def where(self) -> str:
        place = self.file or ""
        if self.line is not None and place:
            place = f"{place}:{self.line}"
        if self.path:
            place = f"{place}: {self.path}" if place else self.path
        return place

    def __str__(self) -> str:
        text = f"{self.where}: {self.message}" if self.where else self.message
        if self.fix:
            text += f" (fix: {self.fix})"
        return text

    def as_dict(self) -> dict[str, object]:
        return {"file": self.file, "line": self.line, "path": self.path, "message": self.message, "fix": self.fix}


@dataclass
class GpushareError(Exception):
    """Bad input or an impossible request. `exit_code` 1 = invalid input, 2 = unusable input, 3 = no GPU/NVML."""

    problems: list[Problem] = field(default_factory=list)
    exit_code: int = 1

    def __init__(self, problems: list[Problem] | Problem | str, exit_code: int = 1) -> None:
        if isinstance(problems, str):
            problems = [Problem(problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems = list(dict.fromkeys(problems))  # one problem found twice (two paths to it) prints once
        self.exit_code = exit_code
        super().__init__("\n".join(str(p) for p in self.problems))
