"""Properties of the exact MIG check, against an independent brute-force checker that reads the raw data file.

(a) instances put at allowed, non-overlapping starts always validate, as a multiset and pinned;
(b) on random layouts (some instances pinned, sometimes at starts no profile allows) the check agrees with the
    brute force on valid / invalid;
(c) every witness is itself a valid placement of exactly the layout's instances.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.core.catalog import load_catalog
from gpushare.core.mig import Instance, MigCheck, check_layout
from tests.conftest import ROOT

RAW: dict[str, Any] = yaml.safe_load(
    (ROOT / "gpushare" / "data" / "mig_profiles.yaml").read_text()
)
MEDIA = ("nvdec", "nvenc", "jpeg", "ofa")
GPUS = sorted(RAW)


def raw_profiles(gpu: str) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in RAW[gpu]["profiles"]}


def raw_engine_totals(gpu: str) -> dict[str, int]:
    """Per media engine, the most any full-GPU profile has (the file states no GPU totals)."""
    raw = RAW[gpu]
    totals: dict[str, int] = {}
    for p in raw["profiles"]:
        if (
            p["compute_slices"] == raw["compute_slices_total"]
            and p["memory_slices"] == raw["placement_units_total"]
        ):
            for engine, n in (p.get("engines") or {}).items():
                if engine in MEDIA:
                    totals[engine] = max(totals.get(engine, 0), n)
    return totals


def brute_force_ok(gpu: str, layout: list[tuple[str, int | None]]) -> bool:
    """Valid iff the totals hold and some assignment of allowed starts to free instances avoids overlap."""
    raw = RAW[gpu]
    profiles = raw_profiles(gpu)
    units = raw["placement_units_total"]
    if any(name not in profiles for name, _ in layout):
        return False
    counts = Counter(name for name, _ in layout)
    if any(n > profiles[name]["max_count"] for name, n in counts.items()):
        return False
    if sum(profiles[name]["compute_slices"] * n for name, n in counts.items()) > raw["compute_slices_total"]:
        return False
    for engine, total in raw_engine_totals(gpu).items():
        if (
            sum((profiles[name].get("engines") or {}).get(engine, 0) * n for name, n in counts.items())
            > total
        ):
            return False

    def span(name: str, start: int) -> set[int]:
        return set(range(start, start + profiles[name]["memory_slices"]))

    pinned: set[int] = set()
    for name, start in layout:
        if start is None:
            continue
        if start not in profiles[name]["placements"] or start + profiles[name]["memory_slices"] > units:
            return False
        if pinned & span(name, start):
            return False
        pinned |= span(name, start)
    free = Counter(name for name, start in layout if start is None)
    # Every assignment of starts, taking equal instances as a combination of distinct starts.
    choices = [list(itertools.combinations(profiles[name]["placements"], n)) for name, n in free.items()]
    for assignment in itertools.product(*choices):
        used = set(pinned)
        fits = True
        for name, chosen in zip(free, assignment, strict=True):
            for start in chosen:
                slices = span(name, start)
                if max(slices) >= units or used & slices:
                    fits = False
                    break
                used |= slices
            if not fits:
                break
        if fits:
            return True
    return False


def assert_witness(gpu: str, layout: list[tuple[str, int | None]], result: MigCheck) -> None:
    profiles = raw_profiles(gpu)
    used: set[int] = set()
    for placement in result.placements:
        profile = profiles[placement.profile]
        assert placement.start in profile["placements"]
        assert placement.size == profile["memory_slices"]
        slices = set(range(placement.start, placement.start + placement.size))
        assert max(slices) < RAW[gpu]["placement_units_total"]
        assert not used & slices
        used |= slices
    assert Counter(p.profile for p in result.placements) == Counter(name for name, _ in layout)
    placed = {(p.profile, p.start) for p in result.placements}
    assert {(name, start) for name, start in layout if start is not None} <= placed
    assert [p.start for p in result.placements] == sorted(p.start for p in result.placements)


def check(gpu: str, layout: list[tuple[str, int | None]]) -> MigCheck:
    return check_layout(load_catalog().models[gpu], tuple(Instance(name, start) for name, start in layout))


@st.composite
def placed_layouts(draw: st.DrawFn) -> tuple[str, list[tuple[str, int]]]:
    """Greedily add random profiles at random free allowed starts, within max counts and media engines."""
    gpu = draw(st.sampled_from(GPUS))
    raw = RAW[gpu]
    profiles = raw_profiles(gpu)
    totals = raw_engine_totals(gpu)
    units = raw["placement_units_total"]
    used: set[int] = set()
    placed: list[tuple[str, int]] = []
    engines: Counter[str] = Counter()
    for _ in range(draw(st.integers(0, 8))):
        candidates = []
        for name, p in profiles.items():
            if sum(1 for n, _ in placed if n == name) >= p["max_count"]:
                continue
            need = {e: n for e, n in (p.get("engines") or {}).items() if e in totals}
            if any(engines[e] + n > totals[e] for e, n in need.items()):
                continue
            for start in p["placements"]:
                slices = set(range(start, start + p["memory_slices"]))
                if max(slices) < units and not used & slices:
                    candidates.append((name, start))
        if not candidates:
            break
        name, start = draw(st.sampled_from(candidates))
        placed.append((name, start))
        used |= set(range(start, start + profiles[name]["memory_slices"]))
        engines.update({e: n for e, n in (profiles[name].get("engines") or {}).items() if e in totals})
    return gpu, draw(st.permutations(placed))


@st.composite
def random_layouts(draw: st.DrawFn) -> tuple[str, list[tuple[str, int | None]]]:
    gpu = draw(st.sampled_from(GPUS))
    names = list(raw_profiles(gpu))
    units = RAW[gpu]["placement_units_total"]
    instance = st.tuples(
        st.sampled_from(names),
        st.one_of(st.none(), st.none(), st.none(), st.integers(0, units - 1)),
    )
    return gpu, draw(st.lists(instance, min_size=0, max_size=8))


@settings(max_examples=300, deadline=None)
@given(placed_layouts())
def test_placed_instances_always_validate(case: tuple[str, list[tuple[str, int]]]) -> None:
    gpu, placed = case
    as_multiset = check(gpu, [(name, None) for name, _ in placed])
    assert as_multiset.ok, as_multiset.errors
    assert_witness(gpu, [(name, None) for name, _ in placed], as_multiset)
    pinned = check(gpu, list(placed))
    assert pinned.ok, pinned.errors
    assert sorted((p.profile, p.start) for p in pinned.placements) == sorted(placed)


@settings(max_examples=400, deadline=None)
@given(random_layouts())
def test_check_agrees_with_brute_force(case: tuple[str, list[tuple[str, int | None]]]) -> None:
    gpu, layout = case
    result = check(gpu, layout)
    assert result.ok == brute_force_ok(gpu, layout), (result.errors, layout)
    if result.ok:
        assert_witness(gpu, layout, result)
    else:
        assert result.errors and result.placements == []


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(GPUS).flatmap(
        lambda gpu: st.tuples(st.just(gpu), st.lists(st.sampled_from(list(raw_profiles(gpu))), max_size=7))
    )
)
def test_every_witness_is_a_valid_placement(case: tuple[str, list[str]]) -> None:
    gpu, names = case
    layout: list[tuple[str, int | None]] = [(name, None) for name in names]
    result = check(gpu, layout)
    assert result.ok == brute_force_ok(gpu, layout)
    if result.ok:
        assert_witness(gpu, layout, result)
        # Pinning every instance where the witness put it must validate too.
        assert check(gpu, [(p.profile, p.start) for p in result.placements]).ok
