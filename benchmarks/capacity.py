"""Benchmark: `gpushare capacity` over a backfilled week at one-minute resolution for 200 GPUs (about 2 million
samples per DCGM metric) on a real Prometheus (Debian's package) on 127.0.0.1.

The week is backfilled twice: the exporters' series (DCGM, kube-state-metrics, Kueue) with promtool, then what
gpushare's recording rules would have recorded over it (promtool evaluating the rendered rules, level by level),
as a fleet whose rules have run for the week has. `gpushare capacity` reads the recorded pool series then; `--raw`
also times the fallback on the exporters' series alone (history from before the rules were deployed).
Prints gpushare's own wall time and peak memory (the CLI runs as a child process; its rusage), and the query time
Prometheus reports (evalTotalTime summed over the queries). Targets: under 30 s end to end, under 500 MiB.
Run: `.venv/bin/python benchmarks/capacity.py` (needs promtool and prometheus: `make promtool`). Not part of the
test suite: building the week of data takes minutes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.prometheus.scenarios import PoolLoad, Scenario, backfill, backfill_recording_rules  # noqa: E402
from tests.prometheus.server import prometheus_server  # noqa: E402

DAYS = 7
# 200 GPUs: 64 time-sliced L40S (2 pods each), 64 H100 cut in two MIG instances, 72 whole H100s.
POOLS = [
    ("bench-ts", "NVIDIA L40S", 46068, "inference-ts2", 8, 8, dict(util=0.2, replicas=2, pod_memory_mib=6144,
                                                                 resource="nvidia_com_gpu_shared")),
    ("bench-mig", "NVIDIA H100 80GB HBM3", 81559, "mig-llm-serving", 8, 8,
     dict(util=0.1, mig={"4g.40gb": (1, 40448), "3g.40gb": (1, 40448)}, pod_memory_mib=4096)),
    ("bench-whole", "NVIDIA H100 80GB HBM3", 81559, "exclusive", 9, 8, dict(util=0.55, pod_memory_mib=40960)),
]


def environment_file(path: Path) -> None:
    import yaml

    pools = []
    address = 0
    for name, model, _mib, profile, hosts, gpus, _load in POOLS:
        entries = []
        for h in range(hosts):
            address += 1
            entries.append({"name": f"{name}-{h}", "address": f"10.97.{address // 250}.{address % 250 + 1}",
                            "gpu_count": gpus})
        pools.append({"name": name, "cluster": "bench", "purpose": "inference", "gpu_model": model,
                      "profile": profile, "hosts": entries})
    path.write_text(yaml.safe_dump({
        "name": "dev", "defaults": {"driver_branch": 580, "toolkit_version": "1.18.2", "containerd_version": "2.1"},
        "clusters": [{"name": "bench", "kind": "bare-metal", "kubernetes_version": "1.33",
                      "mig_strategy": "mixed", "cdi": True}],
        "pools": pools,
        "tenants": [{"name": "bench", "namespace": "bench", "trust": "trusted", "priority": "online",
                     "quota": {"nvidia.com/gpu.shared": 128, "nvidia.com/mig-4g.40gb": 64,
                               "nvidia.com/mig-3g.40gb": 64, "nvidia.com/gpu": 72}}],
    }, sort_keys=False))


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp:
        work = Path(tmp)
        (work / "environments").mkdir()
        env = work / "environments" / "dev.yaml"
        environment_file(env)
        (work / "profiles").symlink_to(ROOT / "profiles")
        end = int(time.time()) // 60 * 60 - 600
        loads = [PoolLoad(name, model, mib, {f"{name}-{h}": gpus for h in range(hosts)}, "bench",
                          queue="tenant-bench" if name == "bench-ts" else None, **load)  # type: ignore[arg-type]
                 for name, model, mib, _profile, hosts, gpus, load in POOLS]
        data = work / "data"
        data.mkdir()
        started = time.perf_counter()
        samples = backfill(Scenario(pools=loads, start=end - DAYS * 86400, end=end), work, data)
        gpus = sum(hosts * g for _n, _m, _mib, _p, hosts, g, _l in POOLS)
        print(f"backfilled {samples / 1e6:.1f} M samples ({gpus} GPUs, {DAYS} d at 1 min; "
              f"{gpus * DAYS * 1440 / 1e6:.2f} M per DCGM metric) in {time.perf_counter() - started:.0f} s")
        from gpushare.core.guardrails import load_guardrails
        from gpushare.core.resolve import resolve
        from gpushare.render.monitoring import prometheus_rule_groups

        started = time.perf_counter()
        groups = prometheus_rule_groups(resolve(env, ROOT / "profiles"), load_guardrails())
        backfill_recording_rules(groups, data, work, end - DAYS * 86400, end)
        print(f"recording rules evaluated over the week in {time.perf_counter() - started:.0f} s")
        runs = [("recorded, cold", "auto"), ("recorded, warm", "auto")]
        if "--raw" in sys.argv:
            runs.append(("raw series only", "raw"))
        with prometheus_server(data, work) as url:
            for attempt, source in runs:
                command = [str(ROOT / ".venv" / "bin" / "gpushare"), "capacity", "--env", str(env), "--prometheus",
                           url, "--window", f"{DAYS}d", "--end", str(end), "--json", "--source", source,
                           "--patch", str(work / "bench.patch")]
                started = time.perf_counter()
                with (work / "out.json").open("w") as out, (work / "err.txt").open("w") as err:
                    child = subprocess.Popen(command, stdout=out, stderr=err)
                    _pid, status, usage = os.wait4(child.pid, 0)  # this child's own rusage: its peak RSS
                elapsed = time.perf_counter() - started
                if os.waitstatus_to_exitcode(status) != 0:
                    raise SystemExit(f"gpushare capacity failed: {(work / 'err.txt').read_text()}"
                                     f"{(work / 'out.json').read_text()}")
                report = json.loads((work / "out.json").read_text())
                print(f"{attempt} ({report['source']}): gpushare capacity {elapsed:.1f} s end to end "
                      f"(target < 30 s), peak RSS {usage.ru_maxrss / 1024:.0f} MiB (target < 500 MiB); "
                      "Prometheus query time "
                      f"{report['prometheus_query_seconds']:.1f} s over {report['queries']} queries; "
                      f"GPUs that could be freed: {report['gpus_freed']}")

if __name__ == "__main__":
    main()
