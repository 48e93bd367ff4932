"""dcgm-exporter's counters file: every one gpushare renders is read the way dcgm-exporter reads it (Go's
encoding/csv with Comment '#', fields trimmed of spaces, exactly three, a known DCGM field, a type).

CASES is also what tests/nvidia/test_dcgm_exporter_counters.py hands to Go's own reader, so that the Python model
and Go agree on each of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpushare.core.errors import GpushareError
from gpushare.core.resolve import resolve
from gpushare.render.monitoring import dcgm_counters
from gpushare.render.monitoring import fields as fields_module
from gpushare.render.monitoring.counters import known_fields, read_counters
from gpushare.render.monitoring.fields import DEFAULTS_FILE, REQUIRED_FIELDS, DcgmField, default_fields
from tests.conftest import ROOT

SHIPPED = sorted([*ROOT.glob("environments/*.yaml"), *ROOT.glob("examples/environments/*.yaml")])
G, F = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"
ISSUE_ROW = ("DCGM_EXP_XID_ERRORS_COUNT, counter, XID errors reported during the exporter's last window, "
             "labelled by xid.")

# (id, file text, verdict, what gpushare's message says). verdict: "ok" both accept; "refused" both refuse;
# "gpushare" dcgm-exporter would take it, gpushare's own rules refuse it.
CASES: list[tuple[str, str, str, str]] = [
    ("plain", f"{G}, gauge, GPU utilization (in %).\n", "ok", ""),
    ("comma-in-help", f"{G}, gauge, x\n{ISSUE_ROW}\n", "refused", "4 fields"),
    ("comma-in-first-row", f"{ISSUE_ROW}\n{G}, gauge, x\n", "refused", "4 fields"),
    ("quoted-comma", f'{G},gauge,"a, b"\n', "ok", ""),
    ("space-before-quote", f'{G}, gauge, "a, b"\n', "refused", 'bare "'),
    ("bare-quote", f'{G}, gauge, a 5" screen\n', "refused", 'bare "'),
    ("doubled-quotes", f'{G},gauge,"say ""hi"""\n', "ok", ""),
    ("text-after-quote", f'{G},gauge,"a" b\n', "refused", "not CSV"),
    ("unterminated-quote", f'{G},gauge,"a\n', "refused", "not CSV"),
    ("indented-comment", f"  # not a comment in Go\n{G}, gauge, x\n", "refused", "1 fields"),
    ("comments-and-blank-lines", f"# c\n\n{G}, gauge, x\n\n# d, with a comma\n{F}, gauge, y\n", "ok", ""),
    ("line-of-spaces", f"{G}, gauge, x\n   \n", "refused", "1 fields"),
    ("crlf", f"{G}, gauge, x\r\n{F}, gauge, y\r\n", "ok", ""),
    ("no-final-newline", f"{G}, gauge, x", "ok", ""),
    ("tab-before-type", f"{G},\tgauge, x\n", "refused", "type '\\tgauge'"),
    ("space-before-comma", "DCGM_FI_DEV_DEC_UTIL ,     gauge, Decoder utilization (in %).\n", "ok", ""),
    ("unknown-field", "DCGM_FI_DEV_GPU_UTILIZATION, gauge, x\n", "refused", "unknown DCGM field"),
    ("lowercase-field", "dcgm_fi_dev_gpu_util, gauge, x\n", "refused", "unknown DCGM field"),
    ("legacy-field", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, gauge, x\n", "ok", ""),
    ("capitalised-type", f"{G}, Gauge, x\n", "refused", "type 'Gauge'"),
    ("histogram", f"{G}, histogram, x\n", "gpushare", "type 'histogram': dcgm-exporter accepts it"),
    ("exporter-field-any-type", "DCGM_EXP_XID_ERRORS_COUNT, sometimes, x\n", "gpushare", "type 'sometimes'"),
    ("help-across-lines", f'{G},gauge,"a\nb"\n', "gpushare", "help text spans lines"),
    ("comment-inside-quoted-help", f'{G},gauge,"a\n# b"\n', "gpushare", "help text spans lines"),
    ("only-comments", "# nothing here\n\n", "gpushare", "no fields"),
]


@pytest.mark.parametrize(("text", "verdict", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_counters_are_read_as_dcgm_exporter_reads_them(text: str, verdict: str, says: str) -> None:
    if verdict == "ok":
        rows = read_counters(text, "counters.csv")
        assert rows and all(r.name in known_fields() and r.type == "gauge" for r in rows)
        return
    with pytest.raises(GpushareError) as info:
        read_counters(text, "counters.csv")
    assert says in str(info.value) and "counters.csv:" in str(info.value)


def test_fields_are_decoded_like_gos_reader() -> None:
    (row,) = read_counters(f'{G},gauge,"say ""hi"", twice"\n', "c.csv")
    assert (row.name, row.type, row.help) == (G, "gauge", 'say "hi", twice')
    rows = read_counters(f"# c\n\n{G} ,  gauge ,  x y  \r\n{F}, counter, z", "c.csv")
    assert [(r.line, r.name, r.type, r.help) for r in rows] == [(3, G, "gauge", "x y"), (4, F, "counter", "z")]


def test_the_row_the_issue_found_names_file_line_field_and_fix() -> None:
    with pytest.raises(GpushareError) as info:
        read_counters(f"# header\n{G}, gauge, x\n{ISSUE_ROW}\n", "monitoring/dcgm-exporter-counters.csv")
    (problem,) = info.value.problems
    assert (problem.file, problem.line, problem.path) == ("monitoring/dcgm-exporter-counters.csv", 3,
                                                          "DCGM_EXP_XID_ERRORS_COUNT")
    assert problem.fix and "without a comma" in problem.fix


@pytest.mark.parametrize("env_file", SHIPPED, ids=[p.relative_to(ROOT).as_posix() for p in SHIPPED])
def test_every_shipped_environment_renders_a_counters_file_dcgm_exporter_takes(env_file: Path) -> None:
    from gpushare.program.components import operator_values as ov

    fleet = resolve(env_file)
    text = dcgm_counters(fleet)
    rows = read_counters(text, env_file.name)
    assert REQUIRED_FIELDS <= {r.name for r in rows}
    assert all(r.help and "," not in r.help for r in rows)
    # The ConfigMap the GPU Operator mounts for the exporter carries the same file.
    assert ov.dcgm_counters_configmap_data(fleet) == {ov.DCGM_COUNTERS_KEY: text}


def test_a_field_dcgm_exporter_would_refuse_stops_the_render(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = DcgmField("DCGM_EXP_XID_ERRORS_COUNT", "counter",
                       "XID errors reported during the exporter's last window, labelled by xid.", "gpushare: health")
    others = tuple(f for f in fields_module.EXTRA_FIELDS if f.name != broken.name)
    monkeypatch.setattr(fields_module, "EXTRA_FIELDS", (*others, broken))
    with pytest.raises(GpushareError) as info:
        dcgm_counters(resolve(ROOT / "environments" / "dev.yaml"))
    text = str(info.value)
    assert "dcgm-exporter-counters.csv.j2 (rendered for dev)" in text and "DCGM_EXP_XID_ERRORS_COUNT" in text


def test_the_field_table_knows_every_field_nvidias_default_files_name() -> None:
    import re

    text = (ROOT / "gpushare" / "render" / "monitoring" / DEFAULTS_FILE).read_text()
    # Commented-out rows too: a user may turn any of them on.
    named = set(re.findall(r"^#?\s*(DCGM_(?:FI|EXP)_\w+)\s*,", text, re.M))
    assert len(named) > 40 and named <= set(known_fields())
    assert {f.name for f in default_fields()} <= named
