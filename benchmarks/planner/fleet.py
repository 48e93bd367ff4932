"""Re-planning benchmark: `python benchmarks/planner/fleet.py [--sizes 50,500,5000] [--mixes mixed,...]`.

For every mix and size: a fleet planned for last quarter's demand (the same mix and size, another seed) is written
as the dev environment of a fresh workspace (`gpushare init`); this quarter's demand is then re-planned onto it with
`gpushare pack --fleet dev` (H100s may be added). Prints GPUs reconfigured / the proven lower bound on them, hosts
drained, GPUs added / the proven lower bound on them, GPUs idle, GPUs used / the GPU lower bound and the wall
time. Not a test: the figures go to
benchmarks/README.md ("Planner: re-planning a fleet").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.planner.mixes import SEEDS, demand  # noqa: E402
from gpushare.planner.demand import Demand  # noqa: E402
from gpushare.planner.pack import plan_demand  # noqa: E402
from gpushare.planner.pack_output import env_section  # noqa: E402


def write_fleet(root: Path, mix: str, size: int) -> None:
    """Last quarter's plan as environments/dev.yaml (its cluster, tenants and defaults kept)."""
    previous = demand(mix, size, seed=SEEDS[mix] * 7 + size)
    section = env_section(plan_demand(previous, env="dev", time_limit=600))
    path = root / "environments" / "dev.yaml"
    env = yaml.safe_load(path.read_text())
    env["pools"] = section["pools"]
    env["profiles"] = env.get("profiles", []) + section.get("profiles", [])
    path.write_text(yaml.safe_dump(env, sort_keys=False))


def run(mix: str, size: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ws"
        subprocess.run([sys.executable, "-m", "gpushare", "init", str(root)], check=True, capture_output=True)
        os.environ["GPUSHARE_ROOT"] = str(root)
        write_fleet(root, mix, size)
        spec = demand(mix, size)
        current = Demand.model_validate({**spec.model_dump(), "gpus": [{"model": "NVIDIA H100 80GB HBM3"}]})
        start = time.monotonic()
        plan = plan_demand(current, fleet="dev", time_limit=600)
        wall = time.monotonic() - start
    assert plan.changes is not None
    c = plan.changes
    return {"mix": mix, "workloads": size, "fleet_gpus": c.gpus_freed + plan.gpus_used - c.gpus_added,
            "reconfigured": c.gpus_reconfigured, "change_bound": c.lower_bound,
            "hosts_drained": len(c.nodes_drained), "added": c.gpus_added, "added_bound": c.gpus_added_bound,
            "idle": c.gpus_freed,
            "gpus": plan.gpus_used, "gpu_bound": plan.lower_bound, "seconds": round(wall, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,500,5000")
    parser.add_argument("--mixes", default="inference-heavy,mixed")
    args = parser.parse_args()
    for size in [int(s) for s in args.sizes.split(",")]:
        for mix in args.mixes.split(","):
            print(json.dumps(run(mix, size)), flush=True)


if __name__ == "__main__":
    main()
