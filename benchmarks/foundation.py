"""Foundation benchmark, one process: MIG layout checks against a naive checker, resolving a synthetic
10,000-GPU environment, and a cold `gpushare mig validate` process. Prints ratios and targets; these
machines are noisy, so nothing here is a pass/fail test."""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = [
    ("NVIDIA A100-SXM4-80GB", "mig-balanced"),
    ("NVIDIA H100 80GB HBM3", "mig-llm-serving"),
    ("NVIDIA H100 80GB HBM3", "exclusive"),
    ("NVIDIA A100-SXM4-40GB", "mig-small"),
    ("NVIDIA L4", "notebooks-ts4"),
    ("NVIDIA H100 NVL", "mig-small-ts2"),
]


def synthetic_environment(directory: Path, gpus: int = 10_000, gpus_per_host: int = 8) -> Path:
    """A bare-metal environment of `gpus` GPUs spread over pools of different models and profiles."""
    hosts = gpus // gpus_per_host
    pools = []
    for i, (model, profile) in enumerate(MODELS):
        count = hosts // len(MODELS) + (1 if i < hosts % len(MODELS) else 0)
        pools.append({
            "name": f"pool-{i}", "cluster": "metal", "purpose": "inference", "gpu_model": model,
            "profile": profile,
            "hosts": [{"name": f"p{i}-h{j}", "address": f"10.{i}.{j // 250}.{j % 250 + 1}",
                       "gpu_count": gpus_per_host} for j in range(count)],
        })
    data = {
        "name": "synthetic",
        "defaults": {"driver_branch": 580, "toolkit_version": "1.18.2"},
        "clusters": [{"name": "metal", "kind": "bare-metal", "kubernetes_version": "1.33"}],
        "pools": pools,
    }
    path = directory / "synthetic.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def resolve_seconds(gpus: int = 10_000, repeat: int = 3) -> tuple[float, float, int]:
    """Median seconds to resolve (parse + validate + resolve) and, separately, to only resolve the parsed model."""
    from gpushare.core import resolve as r

    with tempfile.TemporaryDirectory() as tmp:
        path = synthetic_environment(Path(tmp), gpus)
        whole, only = [], []
        fleet = None
        for _ in range(repeat):
            t0 = time.perf_counter()
            fleet = r.resolve(path, ROOT / "profiles")
            whole.append(time.perf_counter() - t0)
            env, doc = r.spec.load_environment(path)
            profiles = r.load_profiles(ROOT / "profiles", env, doc)
            t0 = time.perf_counter()
            r._Resolver(env, doc, profiles).run(path)
            only.append(time.perf_counter() - t0)
        assert fleet is not None
        return statistics.median(whole), statistics.median(only), fleet.totals.physical_gpus


def main() -> None:
    from benchmarks import mig_check

    print("== MIG layout check: gpushare vs naive bitmask backtracking (same process, same layouts)")
    mig_check.main()
    print()
    print("== resolve a synthetic environment (one core)")
    whole, only, gpus = resolve_seconds()
    print(f"resolve {gpus} GPUs: {whole:.3f} s including YAML parsing and schema validation "
          f"({only:.3f} s resolution alone); target under 2 s -> {'met' if whole < 2 else 'MISSED'}")


if __name__ == "__main__":
    main()
