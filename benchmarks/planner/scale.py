"""Planner scale benchmark: `python benchmarks/planner/scale.py [--totals 12800,51200,204800]`.

`gpushare pack` (plan, checks and the JSON document) on a demand of eight workload shapes with many replicas each,
--time-limit 5, each size in a process of its own (for its peak memory). Prints the wall time, the time spent in
first-fit decreasing (`solve.pack_kinds`), the peak resident memory, and the time per replica as a ratio to the
smallest size's: near 1 means the work grows with the replicas, not faster. Target: ratio <= 2 up to the
demand's bound of 250,000 replicas (gpushare.planner.demand.MAX_TOTAL_REPLICAS). Not a pass/fail test; the
figures go to benchmarks/README.md ("Planner scale")."""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SHAPES = [(18, 0.25, "online"), (9, 0.1, "online"), (36, 0.4, "online"), (8, 0.12, "batch"),
          (20, 0.3, "batch"), (6, 0.05, "dev"), (3, 0.03, "dev"), (11, 0.07, "batch")]


def one(total: int) -> dict[str, float]:
    from gpushare.planner.demand import Demand
    from gpushare.planner.pack import plan_demand
    from gpushare.planner.solve import rounding as solve

    spent = {"first_fit": 0.0}
    real = solve.pack_kinds

    def timed(data, wanted):  # type: ignore[no-untyped-def]
        start = time.monotonic()
        try:
            return real(data, wanted)
        finally:
            spent["first_fit"] += time.monotonic() - start

    solve.pack_kinds = timed  # type: ignore[assignment]
    per = total // len(SHAPES)
    demand = Demand.model_validate({
        "gpus": [{"model": "NVIDIA H100 80GB HBM3"}, {"model": "NVIDIA L4", "cost": 0.2}],
        "workloads": [{"name": f"w{k}", "tenant": "t", "kind": kind, "memory_gib": m, "compute": c,
                       "replicas": per} for k, (m, c, kind) in enumerate(SHAPES)]})
    start = time.monotonic()
    plan = plan_demand(demand, time_limit=5.0)
    text = json.dumps(plan.as_json())
    wall = time.monotonic() - start
    return {"replicas": per * len(SHAPES), "gpus": plan.gpus_used, "seconds": round(wall, 2),
            "first_fit_seconds": round(spent["first_fit"], 3), "json_mib": round(len(text) / 2**20, 1),
            "peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--totals", default="12800,51200,204800")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return
    rows = []
    for total in (int(t) for t in args.totals.split(",")):
        out = subprocess.run([sys.executable, __file__, "--one", str(total)], capture_output=True, text=True,
                             check=True, cwd=ROOT)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = rows[0]["seconds"] / rows[0]["replicas"]
    print(f"{'replicas':>9} {'GPUs':>7} {'seconds':>8} {'first-fit s':>11} {'JSON MiB':>8} {'peak MiB':>8} "
          f"{'s/replica ratio':>15}")
    for r in rows:
        ratio = (r["seconds"] / r["replicas"]) / base
        print(f"{r['replicas']:>9,} {r['gpus']:>7,} {r['seconds']:>8} {r['first_fit_seconds']:>11} "
              f"{r['json_mib']:>8} {r['peak_mib']:>8} {ratio:>15.2f}")


if __name__ == "__main__":
    main()
