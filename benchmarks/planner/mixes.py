"""Generated demand for the planner benchmark: four mixes, fixed seeds, any number of workloads.

- inference-heavy: many online services of 2-40 GiB and small compute shares, some latency-sensitive or untrusted;
- training-heavy: large batch jobs (30-80 GiB, most of a GPU's compute) beside a few notebooks;
- mixed: online, batch and dev work in equal parts;
- adversarial: sizes just above MIG instance sizes, halves and thirds of a GPU, and compute shares just above
  k/7 of a GPU, so that every rounding in a planner costs a unit.
GPU models: H100 80GB HBM3 as many as needed, A100-SXM4-80GB and L4 in limited numbers.
"""

from __future__ import annotations

import random
from typing import Any

from gpushare.planner.demand import Demand

MIXES = ("inference-heavy", "training-heavy", "mixed", "adversarial")
SEEDS = {"inference-heavy": 11, "training-heavy": 23, "mixed": 37, "adversarial": 41}


def _round(value: float, step: float) -> float:
    return round(max(step, round(value / step) * step), 4)


def _online(rng: random.Random) -> dict[str, Any]:
    memory = rng.choice([rng.uniform(2, 12), rng.uniform(8, 24), rng.uniform(16, 40)])
    return {"kind": "online", "memory_gib": _round(memory, 0.5), "compute": _round(rng.uniform(0.03, 0.45), 0.01),
            "replicas": rng.choice([1, 2, 2, 3, 4, 6, 8]),
            "latency": rng.choices(["high", "medium", "low"], [0.2, 0.5, 0.3])[0]}


def _batch(rng: random.Random, large: bool) -> dict[str, Any]:
    if large:
        memory, compute = rng.uniform(30, 80), rng.uniform(0.5, 1.0)
    else:
        memory, compute = rng.uniform(6, 40), rng.uniform(0.1, 0.6)
    # At most 79 GiB: with the default 0.5 GiB CUDA context reserve a replica still fits a whole 80 GiB GPU.
    return {"kind": "batch", "memory_gib": _round(min(memory, 79.0), 1.0), "compute": _round(compute, 0.05),
            "replicas": rng.choice([1, 1, 2, 4])}


def _dev(rng: random.Random) -> dict[str, Any]:
    return {"kind": "dev", "memory_gib": _round(rng.uniform(2, 16), 0.5),
            "compute": _round(rng.uniform(0.02, 0.2), 0.01), "replicas": rng.choice([1, 1, 2])}


# Just above the memory of H100 MIG instances (9.75, 19.62, 39.5), of halves and thirds of 80 GiB and of an L4.
_AWKWARD_MEMORY = (9.8, 10.0, 19.7, 20.0, 24.1, 26.7, 27.0, 39.6, 40.1, 41.0, 47.5, 53.4)
_AWKWARD_COMPUTE = (0.15, 0.29, 0.3, 0.43, 0.44, 0.51, 0.58, 0.72)


def _adversarial(rng: random.Random) -> dict[str, Any]:
    return {"kind": rng.choice(["online", "batch", "dev"]), "memory_gib": rng.choice(_AWKWARD_MEMORY),
            "compute": rng.choice(_AWKWARD_COMPUTE), "replicas": rng.choice([1, 2, 3, 5, 7]),
            "latency": rng.choices(["high", "medium", "low"], [0.3, 0.3, 0.4])[0]}


def workload(mix: str, rng: random.Random) -> dict[str, Any]:
    if mix == "inference-heavy":
        w = _online(rng) if rng.random() < 0.8 else _dev(rng)
    elif mix == "training-heavy":
        w = _batch(rng, large=rng.random() < 0.7) if rng.random() < 0.85 else _dev(rng)
    elif mix == "mixed":
        w = rng.choice([_online, lambda r: _batch(r, r.random() < 0.4), _dev])(rng)
    elif mix == "adversarial":
        w = _adversarial(rng)
    else:
        raise ValueError(f"unknown mix {mix!r}; use one of {', '.join(MIXES)}")
    if rng.random() < 0.1:
        w["trust"] = "untrusted"
    return w


def demand(mix: str, workloads: int, seed: int | None = None) -> Demand:
    rng = random.Random(SEEDS[mix] * 1_000_003 + workloads if seed is None else seed)
    items = []
    for k in range(workloads):
        w = workload(mix, rng)
        items.append({"name": f"w{k:05d}", "tenant": f"t{rng.randrange(max(1, workloads // 10)):04d}", **w})
    replicas = sum(w["replicas"] for w in items)
    gpus = [
        {"model": "NVIDIA H100 80GB HBM3"},
        {"model": "NVIDIA A100-SXM4-80GB", "count": max(1, replicas // 20)},
        {"model": "NVIDIA L4", "count": max(1, replicas // 20)},
    ]
    return Demand.model_validate({"name": f"{mix}-{workloads}", "gpus": gpus, "workloads": items})
