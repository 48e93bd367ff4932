"""A reviewed patch: files as they are and as proposed, as one unified diff, and the round-trip YAML that edits an
environment file keeping its comments, quotes and untouched lines as written. Every command that proposes a change
for review (capacity, promote) writes it this way; none applies it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Proposal:
    files: dict[str, tuple[str | None, str]] = field(default_factory=dict)  # relative path -> (old, new)
    applied: list[str] = field(default_factory=list)  # pools whose change is in the patch
    withheld: dict[str, str] = field(default_factory=dict)  # pool -> why its change is not in the patch

    @property
    def patch(self) -> str:
        import difflib

        out: list[str] = []
        for rel, (old, new) in sorted(self.files.items()):
            out += difflib.unified_diff((old or "").splitlines(True), new.splitlines(True),
                                        fromfile="/dev/null" if old is None else f"a/{rel}", tofile=f"b/{rel}")
        return "".join(out)


def roundtrip_yaml() -> Any:
    from ruamel.yaml import YAML

    y = YAML()
    y.preserve_quotes = True
    y.width = 4096
    y.indent(mapping=2, sequence=4, offset=2)
    return y


def dump_yaml(y: Any, data: Any) -> str:
    import io

    buf = io.StringIO()
    y.dump(data, buf)
    return buf.getvalue()


def keep_untouched_lines(original: str, reloaded: str, edited: str) -> str:
    """`edited` (the round-trip dump after the edits) with every stretch the edits did not touch taken from
    `original` as written: the dump re-wraps some untouched lines (long flow mappings), which a patch must not."""
    from difflib import SequenceMatcher

    orig, base, new = original.splitlines(True), reloaded.splitlines(True), edited.splitlines(True)
    units: list[tuple[int, int, int, int]] = []  # (base start, base end, original start, original end)
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, orig, base, autojunk=False).get_opcodes():
        if tag == "equal":
            lines = [(j, j + 1, i1 + j - j1, i1 + j - j1 + 1) for j in range(j1, j2)]
            if units and units[-1][0] == units[-1][1]:  # the original's own opening lines go with the first line
                lines[0] = (j1, j1 + 1, 0, i1 + 1)
                units.pop()
            units += lines
        elif j1 == j2:  # lines only the original has: kept with the stretch before them (or from the top)
            units[-1:] = [(*units[-1][:3], i2)] if units else [(0, 0, 0, i2)]
        elif units and units[-1][0] == units[-1][1]:
            units[-1] = (j1, j2, 0, i2)
        else:
            units.append((j1, j2, i1, i2))
    changes = [op for op in SequenceMatcher(None, base, new, autojunk=False).get_opcodes() if op[0] != "equal"]
    dirty = {u for u in units for _, j1, j2, _, _ in changes
             if (j1 < u[1] and u[0] < j2) or (j1 == j2 and u[0] < j1 < u[1])}
    unit_of = {j: u for u in units for j in range(u[0], u[1])}
    out: list[str] = []
    for tag, j1, j2, k1, k2 in SequenceMatcher(None, base, new, autojunk=False).get_opcodes():
        if tag != "equal":
            out += new[k1:k2]
            continue
        for j in range(j1, j2):
            unit = unit_of.get(j)
            if unit is None or unit in dirty:
                out.append(base[j])
            elif j == unit[0]:
                out += orig[unit[2]:unit[3]]
    return "".join(out)

