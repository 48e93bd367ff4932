#!/usr/bin/env python3
"""Regenerate the recorded DCGM history that `gpushare demo-metrics` serves (gpushare/data/demo/): three days of the
dev environment (environments/dev.yaml) at a 5-minute step, written by the test suite's own generator
(tests/prometheus/scenarios.write_openmetrics, the series dcgm-exporter, kube-state-metrics and Kueue write) as
OpenMetrics, xz-compressed, with a JSON file beside it giving the window and the SHA-256 of the uncompressed text.

    .venv/bin/python scripts/demo_history.py           # or `make demo-history`: rewrite both files
    .venv/bin/python scripts/demo_history.py --check   # exit 1 where the shipped files are not what this writes

Run it after changing environments/dev.yaml's pools or hosts, the loads below, or the generator;
tests/unit/ops/test_demo.py fails while the shipped history is not what this script writes. Nothing here is random:
the same code writes the same bytes (the compressed file may differ between xz versions; its text may not)."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.prometheus.scenarios import PoolLoad, Scenario, write_openmetrics  # noqa: E402

DEMO = ROOT / "gpushare" / "data" / "demo"
HISTORY = DEMO / "dev-history.om.xz"
META = DEMO / "dev-history.json"
ENVIRONMENT = ROOT / "environments" / "dev.yaml"

END = 1_795_996_800  # 2026-11-30 00:00 UTC: the last sample; a multiple of the step
DAYS = 3
STEP = 300  # gpushare's query step (guardrails capacity.step): every step of its window reads a sample
# What dcgm-exporter reports as a whole GPU's framebuffer (FB_USED + FB_FREE), MiB.
FRAMEBUFFER_MIB = {"NVIDIA A100-SXM4-80GB": 81920, "NVIDIA H100 80GB HBM3": 81559, "NVIDIA L4": 23034}
# Per pool of dev: the tenant's namespace and Kueue queue, and what its GPUs did (busy share, daily swing, memory).
# a100-inference: MIG instances of search's services, the 3g.40gb ones busiest; h100-training: research's training
# jobs keep the whole H100s busy with work waiting in the queue; l4-notebooks: 3 of 4 replicas per L4 held by
# notebooks that mostly idle.
LOADS: dict[str, dict[str, Any]] = {
    "a100-inference": dict(namespace="search-inference", queue="tenant-search", util=0.3, swing=0.15,
                           mig_util={"3g.40gb": 0.82, "2g.20gb": 0.35, "1g.10gb": 0.04},
                           mig_memory_mib={"3g.40gb": 24576, "2g.20gb": 12288, "1g.10gb": 4096}),
    "h100-training": dict(namespace="research-training", queue="tenant-research", util=0.78, swing=0.12,
                          pod_memory_mib=65536, pending=3, wait_seconds=1800),
    "l4-notebooks": dict(namespace="ds-notebooks", queue="tenant-notebooks", util=0.18, swing=0.1,
                         pod_memory_mib=3072, allocated_share=0.75),
}


def pool_loads() -> list[PoolLoad]:
    """One load per pool of environments/dev.yaml: its hosts, GPU model, MIG layout and replicas as resolved."""
    from gpushare.core.resolve import resolve

    fleet = resolve(ENVIRONMENT, ROOT / "profiles")
    loads = []
    for pool in fleet.pools:
        load = dict(LOADS[pool.name])
        first = pool.nodes[0]
        model = first.gpu_model
        if first.mig_layout:
            load["mig"] = {name: (count, round(model.profiles[name].memory_gib * 1024))
                           for name, count in first.mig_layout.items()}
        elif first.sharing != "exclusive":
            (resource, advertised), = first.advertised.items()
            load["replicas"] = advertised // first.gpus_per_node
            load["resource"] = resource.replace(".", "_").replace("/", "_").replace("-", "_")
        loads.append(PoolLoad(pool.name, model.name, FRAMEBUFFER_MIB[model.name],
                              {node.name: node.gpus_per_node for node in pool.nodes}, **load))
    return loads


def history() -> tuple[str, dict[str, Any]]:
    """The OpenMetrics text (samples at END - DAYS + STEP, ..., END) and the metadata written beside it."""
    out = io.StringIO()
    loads = pool_loads()
    start = END - DAYS * 86400 + STEP
    samples = write_openmetrics(Scenario(pools=loads, start=start, end=END, step=STEP), out)
    text = out.getvalue()
    return text, {"environment": "dev", "source": "environments/dev.yaml", "generator": "scripts/demo_history.py",
                  "pools": [load.pool for load in loads], "start": start, "end": END, "step": STEP,
                  "window": f"{DAYS}d", "samples": samples, "sha256": hashlib.sha256(text.encode()).hexdigest()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare the shipped files with what this writes")
    args = parser.parse_args()
    text, meta = history()
    samples = meta["samples"]
    if args.check:
        shipped = json.loads(META.read_text()) if META.exists() else None
        unpacked = lzma.decompress(HISTORY.read_bytes()).decode() if HISTORY.exists() else None
        if shipped != meta or unpacked != text:
            print(f"{HISTORY.relative_to(ROOT)} is out of date: run .venv/bin/python scripts/demo_history.py",
                  file=sys.stderr)
            return 1
        print(f"{HISTORY.relative_to(ROOT)} is up to date ({samples:,} samples, sha256 {meta['sha256'][:12]})")
        return 0
    DEMO.mkdir(parents=True, exist_ok=True)
    HISTORY.write_bytes(lzma.compress(text.encode(), preset=6))
    META.write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {HISTORY.relative_to(ROOT)} ({HISTORY.stat().st_size / 1024:.0f} KiB, {samples:,} samples, "
          f"{len(text) / 2**20:.1f} MiB of OpenMetrics) and {META.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
