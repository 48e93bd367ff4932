"""How fast is the exact MIG check next to the obvious way of doing it; how fast does `mig validate` start?

Run: python benchmarks/mig_check.py. Prints layouts per second for gpushare's check_layout (errors, warnings
and a witness placement included) and for a naive bitmask backtracking checker, asserts they agree on every
layout, and prints the ratio gpushare/naive (target >= 0.5) and the median wall time of a cold
`mig validate` process (target < 0.5 s). The measuring functions are importable for a combined benchmark.
"""

from __future__ import annotations

import gc
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gpushare.core.catalog import GpuModel, load_catalog
from gpushare.core.mig import Instance, Layout, MigCheck, check_layout, clear_check_cache

SEED = 20_240_611
LAYOUT_COUNT = 100_000
REPEATS = 3
RATIO_TARGET = 0.5
COLD_CLI_TARGET_S = 0.5
REPO = Path(__file__).resolve().parent.parent

Sample = tuple[GpuModel, Layout]


def exact_models() -> list[GpuModel]:
    """The MIG models whose geometry is taken from real driver output (confidence exact)."""
    return [m for m in load_catalog().models.values() if m.mig_capable and m.confidence == "exact"]


def random_layouts(models: Sequence[GpuModel], count: int = LAYOUT_COUNT, seed: int = SEED) -> list[Sample]:
    """Random multisets of 1-7 instances of one model's profiles: valid and invalid layouts both occur."""
    rng = random.Random(seed)
    instances = {m.name: [Instance(p) for p in m.profiles] for m in models}
    samples = []
    for _ in range(count):
        model = rng.choice(models)
        samples.append((model, tuple(rng.choices(instances[model.name], k=rng.randint(1, 7)))))
    return samples


def naive_check(model: GpuModel, layout: Layout) -> bool:
    """The obvious checker: profiles exist, max counts, totals, then recursive placement over a bitmask."""
    profiles = model.profiles
    counts: dict[str, int] = {}
    for instance in layout:
        if instance.profile not in profiles:
            return False
        counts[instance.profile] = counts.get(instance.profile, 0) + 1
    for name, count in counts.items():
        if count > profiles[name].max_count:
            return False
    if sum(profiles[n].compute_slices * c for n, c in counts.items()) > model.compute_slices_total:
        return False
    for engine, total in model.engine_totals.items():
        if sum(dict(profiles[n].engines).get(engine, 0) * c for n, c in counts.items()) > total:
            return False
    units = model.placement_units_total
    items = sorted((profiles[i.profile] for i in layout), key=lambda p: -p.memory_slices)

    def place(k: int, used: int) -> bool:
        if k == len(items):
            return True
        profile = items[k]
        bits = (1 << profile.memory_slices) - 1
        for start in profile.placements:
            mask = bits << start
            if start + profile.memory_slices <= units and not used & mask and place(k + 1, used | mask):
                return True
        return False

    return place(0, 0)


def time_checker(
    check: Callable[[GpuModel, Layout], object], samples: Sequence[Sample], collect: bool = False
) -> tuple[float, list]:
    """Seconds for one pass over the samples, and the checker's answers in order.

    The garbage collector is paused unless `collect`, as timeit does: keeping 100,000 answers alive would
    otherwise charge the allocating checker for full collections that a real caller does not trigger.
    """
    enabled = gc.isenabled()
    if not collect:
        gc.disable()
    try:
        started = time.perf_counter()
        answers = [check(model, layout) for model, layout in samples]
        return time.perf_counter() - started, answers
    finally:
        if enabled:
            gc.enable()


def cold_check_layout_seconds(samples: Sequence[Sample], collect: bool = False) -> tuple[float, list]:
    """One pass of check_layout starting from empty caches (no placement tables, no memoised verdicts)."""
    clear_check_cache()
    return time_checker(check_layout, samples, collect)


def witness_fits(model: GpuModel, layout: Layout, check: MigCheck) -> bool:
    """The witness places exactly the layout's instances at allowed, non-overlapping starts."""
    used = 0
    for placement in check.placements:
        profile = model.profiles[placement.profile]
        mask = ((1 << profile.memory_slices) - 1) << placement.start
        if placement.start not in profile.placements or used & mask:
            return False
        if placement.start + profile.memory_slices > model.placement_units_total:
            return False
        used |= mask
    return sorted(p.profile for p in check.placements) == sorted(i.profile for i in layout)


def compare(samples: Sequence[Sample], repeats: int = REPEATS) -> dict[str, float]:
    """Time both checkers (best of `repeats`; gpushare from empty caches and warm) and assert they agree."""
    naive_s, naive_answers = min(time_checker(naive_check, samples) for _ in range(repeats))
    cold_s, checks = min((cold_check_layout_seconds(samples) for _ in range(repeats)), key=lambda r: r[0])
    warm_s = min(time_checker(check_layout, samples)[0] for _ in range(repeats))
    naive_gc_s = time_checker(naive_check, samples, collect=True)[0]
    cold_gc_s = cold_check_layout_seconds(samples, collect=True)[0]
    for (model, layout), check, expected in zip(samples, checks, naive_answers, strict=True):
        assert check.ok == expected, (
            f"disagree on {model.name} {layout}: gpushare {check.ok}, naive {expected}"
        )
        if check.ok:
            assert witness_fits(model, layout, check), (
                f"bad witness on {model.name} {layout}: {check.placements}"
            )
    count = len(samples)
    return {
        "layouts": count,
        "valid": sum(naive_answers),
        "naive_per_s": count / naive_s,
        "gpushare_cold_per_s": count / cold_s,
        "gpushare_warm_per_s": count / warm_s,
        "naive_gc_per_s": count / naive_gc_s,
        "gpushare_cold_gc_per_s": count / cold_gc_s,
    }


def cold_cli_seconds(argv: Sequence[str], runs: int = 7) -> float:
    """Median wall time of running argv as a fresh process (exit status 0 or 1 both count as an answer)."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(list(argv), cwd=REPO, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - started)
        if done.returncode not in (0, 1):
            raise RuntimeError(f"{argv} exited {done.returncode}: {done.stderr.strip()}")
    return statistics.median(times)


def validate_argv() -> tuple[list[str], str]:
    """The cold `mig validate` command: through `python -m gpushare` once __main__.py exists."""
    args = ["mig", "validate", "--gpu", "NVIDIA H100 80GB HBM3", "--layout", "1g.10gb=2,2g.20gb=1,3g.40gb=1"]
    if (REPO / "gpushare" / "__main__.py").exists():
        return [sys.executable, "-m", "gpushare", *args], "python -m gpushare"
    # Without the main CLI, run the same Typer app the lead engineer mounts as `gpushare mig`.
    code = (
        "import sys; from gpushare.cli.gpu import mig_app; "
        f"sys.argv = ['gpushare mig', *{args[1:]!r}]; mig_app()"
    )
    return [sys.executable, "-c", code], "python -c 'mig_app()' (gpushare/__main__.py does not exist yet)"


# The same shape of command with nothing of gpushare in it: what Typer alone costs to start on this machine.
TYPER_FLOOR_CODE = (
    "import sys, typer\n"
    "app = typer.Typer()\n"
    "@app.command()\n"
    "def validate(gpu: str = typer.Option(...), layout: str = typer.Option(...), json_out: bool = False):\n"
    "    print(gpu, layout)\n"
    "sys.argv = ['x', '--gpu', 'g', '--layout', 'l']\n"
    "app()\n"
)


def main() -> int:
    models = exact_models()
    samples = random_layouts(models)
    figures = compare(samples)
    naive = figures["naive_per_s"]
    print(f"models: {', '.join(m.name for m in models)}")
    count, valid = figures["layouts"], figures["valid"]
    print(f"layouts: {count:,} (seed {SEED}), valid: {valid:,}; both checkers agree on every one")
    print(f"best of {REPEATS} passes, garbage collector paused (timeit's convention):")
    print(f"  naive bitmask backtracking:        {naive:>10,.0f} layouts/s")
    for label, key in (("from empty caches", "gpushare_cold_per_s"), ("warm caches", "gpushare_warm_per_s")):
        rate = figures[key]
        print(f"  gpushare check_layout, {label + ':':<18}{rate:>10,.0f} layouts/s  ratio {rate / naive:.2f}")
    naive_gc, cold_gc = figures["naive_gc_per_s"], figures["gpushare_cold_gc_per_s"]
    print(
        f"one pass with the collector on: naive {naive_gc:,.0f}/s, gpushare from empty caches "
        f"{cold_gc:,.0f}/s, ratio {cold_gc / naive_gc:.2f}"
    )
    ratio = figures["gpushare_cold_per_s"] / naive
    argv, how = validate_argv()
    seconds = cold_cli_seconds(argv)
    floor = cold_cli_seconds([sys.executable, "-c", TYPER_FLOOR_CODE])
    print(f"cold `mig validate` via {how}: median {seconds:.3f} s")
    print(f"  for scale, a two-option Typer app that does nothing: median {floor:.3f} s")
    ratio_met = "met" if ratio >= RATIO_TARGET else "MISSED"
    cli_met = "met" if seconds < COLD_CLI_TARGET_S else "MISSED"
    print(f"targets: ratio from empty caches >= {RATIO_TARGET}: {ratio_met}")
    print(f"         cold CLI < {COLD_CLI_TARGET_S} s: {cli_met}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
