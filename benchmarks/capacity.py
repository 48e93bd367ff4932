"""Benchmark: `gpushare capacity` at real scrape rates and fleet sizes, on a real Prometheus (Debian's 2.42) on
127.0.0.1 at its default query limits (--query.max-samples 50,000,000, --query.timeout 2m).

Cases (`--case 200`, `--case 2000`, default both, the big one last):
- 200 GPUs x 14 days at a 30 s scrape: the exporters' series (DCGM, kube-state-metrics, Kueue), written day by day
  as OpenMetrics and imported with promtool while the next day is written. `gpushare capacity --source raw` reads
  them (history from before the rules). Then the recording rules are evaluated for real (promtool, pass by pass,
  gpushare.ops.backfill.rule_levels) over the last two hours, and every series capacity reads is written over the
  rest of the window from those evaluated values (repeated), as the rules would have recorded it; capacity then
  reads the recorded series. `--backfill-hours N` also times `gpushare capacity --backfill-rules --data-dir` itself
  over the last N hours (five promtool passes against the running server).
- 2,000 GPUs x 30 days from the rules: two hours of exporter series, the rules evaluated over them, and the
  series capacity reads generated over the 30 days the same way.
Prints gpushare's wall time and peak RSS (the CLI runs as a child process; its own rusage) beside the query time
Prometheus reports (evalTotalTime summed over the queries). Targets: 200 GPUs <= 60 s and <= 500 MiB, with and
without rules; 2,000 GPUs from the rules <= 120 s. Run under `nice -n 10`: building the data takes many minutes.
Run: `nice -n 10 .venv/bin/python benchmarks/capacity.py [--case 200|2000] [--backfill-hours 6]`."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.prometheus.scenarios import PoolLoad, Scenario, backfill_recording_rules, write_openmetrics  # noqa: E402
from tests.prometheus.server import prometheus_server  # noqa: E402

DAY = 86400
EVALUATED = 2 * 3600  # the span the rules are really evaluated over; the rest of the window repeats it
DEFAULT_MAX_SAMPLES = 50_000_000
# Per 200 GPUs: 64 time-sliced L40S (2 pods each), 64 H100 cut in two MIG instances, 72 whole H100s.
POOLS = [
    ("bench-ts", "NVIDIA L40S", 46068, "inference-ts2", 8, 8, dict(util=0.2, replicas=2, pod_memory_mib=6144,
                                                                 resource="nvidia_com_gpu_shared")),
    ("bench-mig", "NVIDIA H100 80GB HBM3", 81559, "mig-llm-serving", 8, 8,
     dict(util=0.1, mig={"4g.40gb": (1, 40448), "3g.40gb": (1, 40448)}, pod_memory_mib=4096)),
    ("bench-whole", "NVIDIA H100 80GB HBM3", 81559, "exclusive", 9, 8, dict(util=0.55, pod_memory_mib=40960)),
]


def environment_file(path: Path, scale: int) -> None:
    import yaml

    pools = []
    address = 0
    for name, model, _mib, profile, hosts, gpus, _load in POOLS:
        entries = []
        for h in range(hosts * scale):
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
                     "quota": {"nvidia.com/gpu.shared": 128 * scale, "nvidia.com/mig-4g.40gb": 64 * scale,
                               "nvidia.com/mig-3g.40gb": 64 * scale, "nvidia.com/gpu": 72 * scale}}],
    }, sort_keys=False))


def loads(scale: int) -> list[PoolLoad]:
    return [PoolLoad(name, model, mib, {f"{name}-{h}": gpus for h in range(hosts * scale)}, "bench",
                     queue="tenant-bench" if name == "bench-ts" else None, **load)  # type: ignore[arg-type]
            for name, model, mib, _profile, hosts, gpus, load in POOLS]


def import_by_day(write: Callable[[int, int, TextIO], int], start: int, end: int, work: Path, data: Path) -> int:
    """Write [start, end) one day at a time and import each day with promtool while the next is written."""
    samples = 0
    running: tuple[subprocess.Popen[bytes], Path] | None = None

    def finish() -> None:
        if running is not None:
            if running[0].wait() != 0:
                raise SystemExit(f"promtool failed to import {running[1]}")
            running[1].unlink()

    try:
        for day, t in enumerate(range(start, end, DAY)):
            source = work / f"day-{day}.om"
            with source.open("w") as out:
                samples += write(t, min(end, t + DAY), out)
            finish()
            running = (subprocess.Popen(["promtool", "tsdb", "create-blocks-from", "openmetrics",
                                         "--max-block-duration=24h", str(source), str(data)],
                                        stdout=subprocess.DEVNULL), source)
        finish()
    finally:
        if running is not None and running[0].poll() is None:  # interrupted: stop our promtool too
            running[0].kill()
    return samples


def raw_series(scale: int, start: int, end: int, work: Path, data: Path, step: int = 30) -> int:
    def write(t0: int, t1: int, out: TextIO) -> int:
        return write_openmetrics(Scenario(pools=loads(scale), start=t0, end=t1 - step, step=step), out)
    return import_by_day(write, start, end, work, data)


def api(url: str, path: str, **params: str) -> Any:
    body = urllib.parse.urlencode(params).encode()
    with urllib.request.urlopen(f"{url}/api/v1/{path}", data=body, timeout=600) as response:  # noqa: S310
        return json.loads(response.read())["data"]


def capacity_records() -> set[str]:
    """The recorded series `gpushare capacity` reads (its recorded-source queries and the coverage check)."""
    from gpushare.core.guardrails import load_guardrails
    from gpushare.core.resolve import resolve
    from gpushare.ops.capacity import _window_queries
    from gpushare.render.monitoring.promql import metric_names

    fleet = resolve(ROOT / "tests" / "prometheus" / "capacity" / "dev.yaml", ROOT / "profiles")
    names = {"gpushare:pool_utilization:ratio"}
    for _name, expr, _apply in _window_queries(fleet, load_guardrails(), fleet.pools, "1d", "recorded"):
        names |= {n for n in metric_names(expr) if n.startswith("gpushare:")}
    return names


def recorded_series(env: Path, data: Path, work: Path, start: int, end: int) -> tuple[int, float]:
    """Evaluate the rules over [end - EVALUATED, end], then write what capacity reads of them over [start, end -
    EVALUATED) by repeating the evaluated values minute by minute. Returns (samples written, seconds evaluating)."""
    from gpushare.core.guardrails import load_guardrails
    from gpushare.core.resolve import resolve
    from gpushare.render.monitoring import prometheus_rule_groups

    began = time.perf_counter()
    groups = prometheus_rule_groups(resolve(env, ROOT / "profiles"), load_guardrails())
    backfill_recording_rules(groups, data, work, end - EVALUATED, end)
    evaluated = time.perf_counter() - began
    patterns: list[tuple[str, list[str | None]]] = []
    with prometheus_server(data, work) as url:
        for name in sorted(capacity_records()):
            for series in api(url, "query_range", query=name, start=str(end - EVALUATED), end=str(end - 60),
                              step="60")["result"]:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(series["metric"].items()) if k != "__name__")
                values: list[str | None] = [None] * (EVALUATED // 60)
                for t, v in series["values"]:
                    values[(int(t) - (end - EVALUATED)) // 60] = v
                patterns.append((f"{name}{{{labels}}} ", values))
    stop = end - EVALUATED

    def write(t0: int, t1: int, out: TextIO) -> int:
        count = 0
        for head, values in patterns:
            lines = [f"{head}{values[(t - stop) // 60 % len(values)]} {t}\n" for t in range(t0, t1, 60)
                     if values[(t - stop) // 60 % len(values)] is not None]
            out.writelines(lines)
            count += len(lines)
        out.write("# EOF\n")
        return count
    return import_by_day(write, start, stop, work, data), evaluated


def run_capacity(env: Path, url: str, days: int, end: int, source: str, work: Path) -> dict[str, Any]:
    command = [str(ROOT / ".venv" / "bin" / "gpushare"), "capacity", "--env", str(env), "--prometheus", url,
               "--window", f"{days}d", "--end", str(end), "--json", "--source", source,
               "--patch", str(work / "bench.patch")]
    started = time.perf_counter()
    with (work / "out.json").open("w") as out, (work / "err.txt").open("w") as err:
        child = subprocess.Popen(command, stdout=out, stderr=err)
        _pid, status, usage = os.wait4(child.pid, 0)  # this child's own rusage: its peak RSS
    elapsed = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"gpushare capacity failed: {(work / 'err.txt').read_text()}"
                         f"{(work / 'out.json').read_text()}")
    report: dict[str, Any] = json.loads((work / "out.json").read_text())
    report["bench_seconds"], report["bench_rss_mib"] = elapsed, usage.ru_maxrss / 1024
    return report


def show(label: str, report: dict[str, Any], target: int) -> None:
    print(f"  {label} ({report['source']}): {report['bench_seconds']:.1f} s end to end (target <= {target} s), "
          f"peak RSS {report['bench_rss_mib']:.0f} MiB (target <= 500 MiB); Prometheus query time "
          f"{report['prometheus_query_seconds']:.1f} s over {report['queries']} queries; "
          f"GPUs that could be freed: {report['gpus_freed']}", flush=True)


def time_backfill(env: Path, url: str, data: Path, work: Path, hours: int, end: int) -> None:
    command = [str(ROOT / ".venv" / "bin" / "gpushare"), "capacity", "--env", str(env), "--prometheus", url,
               "--window", f"{hours}h", "--end", str(end), "--json", "--backfill-rules", str(work / "backfill"),
               "--data-dir", str(data)]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    report = json.loads(result.stdout)
    print(f"  gpushare capacity --backfill-rules --data-dir over {hours} h: {time.perf_counter() - started:.0f} s, "
          f"passes {[p['state'] for p in report['passes']]}", flush=True)


def case(scale: int, days: int, with_raw: bool, backfill_hours: int) -> None:
    gpus = 200 * scale
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp:
        work = Path(tmp)
        (work / "environments").mkdir()
        env = work / "environments" / "dev.yaml"
        environment_file(env, scale)
        (work / "profiles").symlink_to(ROOT / "profiles")
        data = work / "data"
        data.mkdir()
        end = int(time.time()) // 3600 * 3600 - 3 * 3600
        start = end - days * DAY
        print(f"{gpus} GPUs x {days} d:", flush=True)
        began = time.perf_counter()
        raw_start = start if with_raw else end - EVALUATED - 600
        samples = raw_series(scale, raw_start, end, work, data)
        print(f"  exporter series at 30 s: {samples / 1e6:.1f} M samples from {(end - raw_start) / 3600:.0f} h, "
              f"imported in {time.perf_counter() - began:.0f} s", flush=True)
        if with_raw:
            with prometheus_server(data, work, max_samples=DEFAULT_MAX_SAMPLES) as url:
                show("raw series, cold", run_capacity(env, url, days, end, "raw", work), 60)
                show("raw series, warm", run_capacity(env, url, days, end, "raw", work), 60)
        if backfill_hours:  # on a copy: the recorded series below must not meet these
            import shutil

            copy = Path(shutil.copytree(data, work / "data-backfill", ignore=shutil.ignore_patterns("lock")))
            with prometheus_server(copy, work, max_samples=DEFAULT_MAX_SAMPLES) as url:
                time_backfill(env, url, copy, work, backfill_hours, end)
            shutil.rmtree(copy)
        began = time.perf_counter()
        samples, evaluated = recorded_series(env, data, work, start, end)
        print(f"  rules evaluated over {EVALUATED // 3600} h in {evaluated:.0f} s; recorded series capacity reads "
              f"written over the window: {samples / 1e6:.1f} M samples in {time.perf_counter() - began:.0f} s",
              flush=True)
        with prometheus_server(data, work, max_samples=DEFAULT_MAX_SAMPLES) as url:
            target = 60 if scale == 1 else 120
            show("recording rules, cold", run_capacity(env, url, days, end, "auto", work), target)
            show("recording rules, warm", run_capacity(env, url, days, end, "auto", work), target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=["200", "2000", "all"], default="all")
    parser.add_argument("--backfill-hours", type=int, default=0)
    parser.add_argument("--days", type=int, help="a shorter window than the targets' (a quick trial run)")
    args = parser.parse_args()
    if args.case in ("200", "all"):
        case(1, args.days or 14, True, args.backfill_hours)
    if args.case in ("2000", "all"):
        case(10, args.days or 30, False, 0)


if __name__ == "__main__":
    main()
