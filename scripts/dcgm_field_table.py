#!/usr/bin/env python3
"""Write gpushare's table of the DCGM field names dcgm-exporter accepts (gpushare/render/monitoring/dcgm-fields.csv).

dcgm-exporter looks each counters-file name up with go-dcgm's `dcgm.GetFieldID` (the `dcgmFields` and
`legacyDCGMFields` maps of pkg/dcgm/const_fields.go), then in its own `DCGM_EXP_*` names (internal/pkg/counters).
Give this script go-dcgm's const_fields.go at the commit the pinned exporter requires:

    scripts/dcgm_field_table.py const_fields.go --commit <go-dcgm commit> --note <why> \\
        > gpushare/render/monitoring/dcgm-fields.csv
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

# dcgm-exporter's own fields (internal/pkg/counters/exporter_counters.go: iota + 9000); no DCGM id behind them.
EXPORTER_FIELDS = {"DCGM_EXP_XID_ERRORS_COUNT": 9001, "DCGM_EXP_CLOCK_EVENTS_COUNT": 9002,
                   "DCGM_EXP_GPU_HEALTH_STATUS": 9003, "DCGM_EXP_P2P_STATUS": 9004}


def go_map(text: str, name: str) -> dict[str, int]:
    body = re.search(rf"^var {name} = map\[string\]Short\{{\n(.*?)^\}}", text, re.S | re.M)
    if body is None:
        raise SystemExit(f"dcgm_field_table.py: no `var {name} = map[string]Short{{...}}` in the file")
    return {m[1]: int(m[2]) for m in re.finditer(r'^\s*"(\w+)":\s*(\d+),', body[1], re.M)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("const_fields", type=Path, help="go-dcgm pkg/dcgm/const_fields.go")
    parser.add_argument("--commit", required=True, help="the go-dcgm commit the file is from (written to the header)")
    parser.add_argument("--note", default="", help="why that commit (one line, written to the header)")
    args = parser.parse_args()
    text = args.const_fields.read_text()
    rows = [(n, i, "field") for n, i in go_map(text, "dcgmFields").items()]
    rows += [(n, i, "legacy") for n, i in go_map(text, "legacyDCGMFields").items()]
    rows += [(n, i, "exporter") for n, i in EXPORTER_FIELDS.items()]
    out = sys.stdout
    out.write(f"# DCGM field names dcgm-exporter accepts in its counters file. Written by scripts/dcgm_field_table.py "
              f"from\n# NVIDIA/go-dcgm pkg/dcgm/const_fields.go @ {args.commit} (dcgmFields, legacyDCGMFields) and "
              "NVIDIA/dcgm-exporter\n# internal/pkg/counters/exporter_counters.go (DCGM_EXP_*). Do not edit by hand.\n")
    if args.note:
        out.write(f"# {args.note}\n")
    out.write("name,id,kind\n")
    for name, ident, kind in sorted(rows):
        out.write(f"{name},{ident},{kind}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
