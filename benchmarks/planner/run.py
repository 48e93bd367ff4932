"""Planner benchmark: `python benchmarks/planner/run.py [--sizes 50,500,5000] [--mixes ...] [--env ENV]`.

For every generated mix and size, prints GPUs used, the lower bound, their ratio, the one-GPU-per-replica
baseline, projected compute utilization and the wall time of the whole plan (problem, solve, check). Targets:
ratio <= 1.05 within 10 s up to 500 workloads, <= 1.10 within 60 s at 5,000. Machines here are shared and noisy,
so nothing here is a pass/fail test; the figures go to benchmarks/README.md ("Planner").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.planner.mixes import MIXES, demand  # noqa: E402
from gpushare.planner.pack import plan_demand  # noqa: E402

TARGETS = {50: (1.05, 10.0), 500: (1.05, 10.0), 5000: (1.10, 60.0)}


def target(size: int) -> tuple[float, float]:
    return TARGETS.get(size, (1.05, 10.0) if size <= 500 else (1.10, 60.0))


def run(mix: str, size: int, env: str | None = None) -> dict[str, object]:
    ratio_target, seconds = target(size)
    spec = demand(mix, size)
    start = time.monotonic()
    plan = plan_demand(spec, env=env, time_limit=seconds)
    wall = time.monotonic() - start
    ratio = plan.gpus_used / plan.lower_bound if plan.lower_bound else float("inf")
    return {
        "mix": mix, "workloads": size, "replicas": plan.baseline_gpus, "gpus": plan.gpus_used,
        "lower_bound": plan.lower_bound, "ratio": round(ratio, 4), "baseline": plan.baseline_gpus,
        "compute_util": plan.utilization()["compute"], "memory_util": plan.utilization()["memory"],
        "seconds": round(wall, 2), "method": plan.method, "converged": plan.converged,
        "met": ratio <= ratio_target and wall <= seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,500,5000")
    parser.add_argument("--mixes", default=",".join(MIXES))
    parser.add_argument("--env", default=None, help="plan within this environment's guardrails (default: none)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    header = (f"{'mix':<16}{'workloads':>10}{'replicas':>9}{'GPUs':>7}{'bound':>7}{'ratio':>8}{'baseline':>9}"
              f"{'compute':>9}{'memory':>8}{'seconds':>9}  target")
    if not args.json:
        print(header)
    for size in [int(s) for s in args.sizes.split(",")]:
        for mix in args.mixes.split(","):
            row = run(mix, size, args.env)
            rows.append(row)
            if not args.json:
                ratio_target, seconds = target(size)
                print(f"{row['mix']:<16}{row['workloads']:>10}{row['replicas']:>9}{row['gpus']:>7}"
                      f"{row['lower_bound']:>7g}{row['ratio']:>8.3f}{row['baseline']:>9}"
                      f"{row['compute_util']:>9.0%}{row['memory_util']:>8.0%}{row['seconds']:>9.2f}  "
                      f"{'met' if row['met'] else 'MISSED'} (<= {ratio_target} in {seconds:g} s)", flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
