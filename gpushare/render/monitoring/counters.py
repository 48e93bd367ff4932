"""A dcgm-exporter counters file read the way dcgm-exporter reads it, so that gpushare never ships one it refuses.

dcgm-exporter (internal/pkg/counters/counter_config.go: ReadCSVFile, readConfigMap, ExtractCounters) reads the file,
or the ConfigMap carrying it, with Go's encoding/csv, `Comment = '#'` and every other reader setting at its default:
- a line whose first character is `#` is a comment, an empty line is skipped (a line of spaces is a record);
- leading spaces stay (no TrimLeadingSpace), so a field is quoted only when `"` is its very first character, and a
  `"` anywhere in an unquoted field is an error (no LazyQuotes);
then it trims spaces (spaces only, not tabs) from every field and wants exactly three, a name go-dcgm's field table
or its own DCGM_EXP_* names know (dcgm-fields.csv, written by scripts/dcgm_field_table.py) and a Prometheus type.
Anything else and the exporter exits at start, so no GPU metric reaches Prometheus.

Python's csv module decodes the fields (quoted fields, doubled quotes, closing quotes, fields across lines); what it
does differently from Go (comments, bare quotes) is handled here. gpushare adds rules of its own: types only gauge,
counter or label, no line break in a help text (it would end the exporter's `# HELP` line), at least one field.
tests/nvidia/test_dcgm_exporter_counters.py runs Go's own reader, set up the same way, on the same files and on
broken ones.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib.resources import files

from gpushare.core.errors import GpushareError, Problem

FIELDS_FILE = "dcgm-fields.csv"
# What dcgm-exporter accepts for a DCGM field (internal/pkg/counters/variables.go, promMetricType) ...
EXPORTER_TYPES = ("gauge", "counter", "histogram", "summary", "label")
# ... and what gpushare writes (dcgm-exporter turns no DCGM field into a histogram or summary).
GPUSHARE_TYPES = ("gauge", "counter", "label")
COMMA_FIX = ("reword the help text without a comma (dcgm-exporter splits every row at each comma and wants exactly "
             "three fields)")


@dataclass(frozen=True)
class CounterRow:
    line: int  # the row's first line in the file, counting from 1
    name: str
    type: str
    help: str


@cache
def known_fields() -> dict[str, str]:
    """DCGM field name -> kind (field, legacy, exporter): every name dcgm-exporter looks up successfully."""
    text = files("gpushare.render.monitoring").joinpath(FIELDS_FILE).read_text()
    rows = csv.DictReader(line for line in text.splitlines() if not line.startswith("#"))
    return {row["name"]: row["kind"] for row in rows}


class _Lines:
    """The file's lines for csv.reader, skipping comments and empty lines only where Go's reader does: before a
    record, never inside a quoted field that runs on. Keeps the raw lines of the record being read."""

    def __init__(self, text: str) -> None:
        if text.endswith("\r"):
            text = text[:-1]  # Go drops a trailing \r before the end of the file
        # Lines end at \n only (str.splitlines would also split at \r, \v, \f, ...); Go reads \r\n as \n.
        parts = text.split("\n")
        self._lines = [(p[:-1] if p.endswith("\r") else p) + "\n" for p in parts[:-1]] + [p for p in parts[-1:] if p]
        self._next = 0
        self.start = 0  # line number of the current record's first line
        self.raw: list[str] = []

    def next_record(self) -> None:
        self.raw = []

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        while self._next < len(self._lines):
            line = self._lines[self._next]
            self._next += 1
            if not self.raw:
                if line.startswith("#") or line == "\n":
                    continue
                self.start = self._next
            self.raw.append(line)
            return line
        raise StopIteration


def _bare_quote(raw: str) -> int | None:
    """Offset of a `"` inside an unquoted field (Go's ErrBareQuote), or None. A field is quoted only if `"` is its
    first character; whatever else is wrong with a quoted field, Python's csv (strict) has already refused."""
    i = 0
    while True:
        if raw.startswith('"', i):
            i += 1
            while True:  # to the closing quote; "" is a quote inside the field
                j = raw.find('"', i)
                if j < 0:
                    return None
                if not raw.startswith('""', j):
                    i = j + 1
                    break
                i = j + 2
            if not raw.startswith(",", i):
                return None
            i += 1
            continue
        end = raw.find(",", i)
        field = raw[i:] if end < 0 else raw[i:end]
        if '"' in field:
            return i + field.index('"')
        if end < 0:
            return None
        i = end + 1


def _records(text: str, source: str) -> Iterator[tuple[int, list[str]]]:
    lines = _Lines(text)
    reader = csv.reader(lines, delimiter=",", quotechar='"', doublequote=True, skipinitialspace=False, strict=True)
    while True:
        lines.next_record()
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            raise GpushareError(Problem(f"not CSV as Go's encoding/csv reads it: {err}", file=source,
                                        line=lines.start,
                                        fix='quote a field only with " as its first character, closed by " and '
                                            'a comma or the end of the line')) from None
        raw = "".join(lines.raw)
        at = _bare_quote(raw)
        if at is not None:
            line = lines.start + raw.count("\n", 0, at)
            column = at - (raw.rfind("\n", 0, at) + 1) + 1
            raise GpushareError(Problem(f'bare " in an unquoted field at column {column} (Go\'s encoding/csv: '
                                        f"ErrBareQuote); dcgm-exporter refuses the file", file=source, line=line,
                                        fix='drop the " (a quoted field must start with it, with no space before)'))
        yield lines.start, record


def read_counters(text: str, source: str) -> list[CounterRow]:
    """The rows of a counters file as dcgm-exporter takes them; a GpushareError listing every row it would refuse."""
    known = known_fields()
    rows: list[CounterRow] = []
    problems: list[Problem] = []
    for line, record in _records(text, source):
        fields = [f.strip(" ") for f in record]  # strings.Trim(r, " "): spaces only
        if len(fields) != 3:
            problems.append(Problem(
                f"{len(fields)} fields ({', '.join(repr(f) for f in fields)}); dcgm-exporter wants exactly three "
                "(DCGM field, Prometheus type, help) and exits", file=source, line=line, path=fields[0],
                fix=COMMA_FIX if len(fields) > 3 else "write the row as `DCGM_FI_..., gauge|counter|label, help`"))
            continue
        name, kind, help_text = fields
        if name not in known:
            problems.append(Problem(
                f"unknown DCGM field {name!r}: dcgm-exporter finds it neither in go-dcgm's field table nor among "
                "its DCGM_EXP_* fields and exits", file=source, line=line, path=name,
                fix=f"use a name listed in gpushare/render/monitoring/{FIELDS_FILE} (spelled exactly, no tabs)"))
        if kind not in GPUSHARE_TYPES:
            accepted = "dcgm-exporter accepts it, but " if kind in EXPORTER_TYPES else ""
            problems.append(Problem(
                f"type {kind!r}: {accepted}gpushare writes only {', '.join(GPUSHARE_TYPES)}", file=source,
                line=line, path=name, fix="use gauge for a level, counter for a running total, label for text"))
        if "\n" in help_text:
            problems.append(Problem("help text spans lines: it would end dcgm-exporter's `# HELP` line early",
                                    file=source, line=line, path=name, fix="write the help text on one line"))
        rows.append(CounterRow(line, name, kind, help_text))
    if not rows and not problems:
        problems.append(Problem("no fields: dcgm-exporter would export nothing", file=source,
                                fix="list at least one `DCGM_FI_..., type, help` row"))
    if problems:
        raise GpushareError(problems)
    return rows
