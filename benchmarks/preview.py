"""Offline preview benchmark, one process: the Pulumi program for a synthetic 1,000-node, 8,000-GPU environment
under the SDK's mock engine, beside a bare program that registers the same number of trivial resources under the
same engine (and, to separate gpushare's own work from the engine's per-property cost, a flat program replaying the
same resources with the same inputs); then the whole `gpushare preview` (schema validation and YAML writing), in
process and as a cold command. These machines are noisy: CPU seconds are measured beside wall seconds, and the
ratios are the figures."""

from __future__ import annotations

import functools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.foundation import synthetic_environment  # noqa: E402

GPUS, GPUS_PER_HOST = 8_000, 8
TARGET_RATIO = 1.5
BARE_PROGRAM = '''
import pulumi

for i in range({count}):
    pulumi.CustomResource("bench:index:Trivial", f"trivial-{{i}}", {{}})
'''
REPLAY_PROGRAM = '''
import json
import pulumi

for name, inputs in json.load(open({path!r})):
    pulumi.CustomResource("bench:index:Replay", name, inputs)
'''


def stack_config(env_file: Path) -> dict[str, object]:
    return {"gpushare:environment": str(env_file), "gpushare:monitoring": {"mode": "install"},
            "gpushare:clusters": {"metal": {"kubeconfigContext": "bench-admin"}}}


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float, Any]:
    """Median wall and CPU seconds (CPU covers the engine's worker threads too) and the last result."""
    walls, cpus, result = [], [], None
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus), result


def main(repeat: int = 5) -> None:
    from gpushare.ops.preview import collect_plan, run_preview

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        env_file = synthetic_environment(directory, GPUS, GPUS_PER_HOST)
        config = stack_config(env_file)
        collect_plan("synthetic", config)  # warm: imports, catalog, chart values, templates
        ours_wall, ours_cpu, plan = timed(lambda: collect_plan("synthetic", config), repeat)
        count = len(plan.resources)
        nodes = len(plan.of_type(":NodePatch"))
        programs = {"bare": BARE_PROGRAM.format(count=count)}
        replay = directory / "replay.json"
        replay.write_text(json.dumps([[r.name, r.inputs] for r in plan.resources]))
        programs["replay"] = REPLAY_PROGRAM.format(path=str(replay))
        figures = {}
        for name, source in programs.items():
            path = directory / f"{name}.py"
            path.write_text(source)
            collect_plan(name, {}, program=path)
            wall, cpu, other = timed(functools.partial(collect_plan, name, {}, program=path), repeat)
            assert len(other.resources) == count
            figures[name] = (wall, cpu)
        bare_wall, bare_cpu = figures["bare"]
        replay_wall, replay_cpu = figures["replay"]
        print(f"== Pulumi program under the mock engine: {nodes} nodes, {GPUS} GPUs, {count} resources "
              f"(median of {repeat}; wall / CPU seconds)")
        print(f"gpushare program          {ours_wall:6.2f} / {ours_cpu:5.2f}")
        print(f"bare: {count} trivial     {bare_wall:6.2f} / {bare_cpu:5.2f}   ratio {ours_wall / bare_wall:.2f} / "
              f"{ours_cpu / bare_cpu:.2f} (target <= {TARGET_RATIO}: "
              f"{'met' if ours_wall / bare_wall <= TARGET_RATIO else 'MISSED'})")
        print(f"flat replay, same inputs  {replay_wall:6.2f} / {replay_cpu:5.2f}   "
              f"ratio {ours_wall / replay_wall:.2f} / {ours_cpu / replay_cpu:.2f} "
              "(gpushare's own work: fleet, checks, components)")

        whole_wall, whole_cpu, result = timed(
            lambda: run_preview("synthetic", directory / "out", config=config), max(1, repeat // 2))
        assert result.ok, result.errors[:3]
        print(f"== whole preview in process: {whole_wall:.2f} s wall / {whole_cpu:.2f} s CPU "
              f"({len(result.objects)} objects validated against Kubernetes 1.31 and 1.33 and the CRDs, "
              f"{len(result.written)} YAML files written)")
        stack = directory / "Pulumi.synthetic.yaml"
        stack.write_text(yaml.safe_dump({"config": config}))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "gpushare", "preview", "--env", str(stack), "--out",
                        str(directory / "cold"), "--json"], check=True, capture_output=True, cwd=ROOT)
        print(f"== cold `gpushare preview --json --out DIR` process: {time.perf_counter() - t0:.2f} s wall")


if __name__ == "__main__":
    main()
