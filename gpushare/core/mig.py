"""The exact MIG layout check: does a set of GPU instances fit one GPU model, and where?

A layout is a multiset of profiles (what mig-parted is given), optionally pinned to starts (`profile@start`,
for checking and explaining only). It is valid iff every profile exists on the model, counts, compute slices
and media engines stay within the model's totals, the driver branch is new enough, and the instances can be
given allowed starts whose memory-slice ranges do not overlap. Geometry comes only from the catalog.

`check_layout` is called in tight loops (resolution of whole fleets, CI), so each model's placeable multisets
are enumerated once and every verdict is memoised; a repeated check is a dict lookup.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from operator import attrgetter
from typing import Any

from gpushare.core.catalog import GpuModel, MigProfile, load_catalog, unknown_profile_message
from gpushare.core.errors import GpushareError, Problem
from gpushare.core.words import counted


@dataclass(frozen=True, slots=True)
class Instance:
    """One GPU instance of a layout; `start` None lets the checker choose the placement."""

    profile: str
    start: int | None = None

    def __str__(self) -> str:
        return self.profile if self.start is None else f"{self.profile}@{self.start}"


Layout = tuple[Instance, ...]


@dataclass(frozen=True, slots=True)
class Placement:
    """An instance at a start, taking memory slices [start, start + size)."""

    profile: str
    start: int
    size: int

    @property
    def slices(self) -> str:
        end = self.start + self.size - 1
        return str(self.start) if end == self.start else f"{self.start}-{end}"

    def __str__(self) -> str:
        return f"{self.profile}@{self.start}"


@dataclass(slots=True)
class MigCheck:
    ok: bool
    gpu: str
    errors: list[str]
    warnings: list[str]
    placements: list[Placement]

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "gpu": self.gpu,
            "errors": list(self.errors),
            "warnings": list(self.warnings),
            "placements": [{"profile": p.profile, "start": p.start} for p in self.placements],
        }


LAYOUT_FORMS = (
    "PROFILE=COUNT (1g.10gb=2), PROFILE@START (3g.40gb@4) or PROFILE (one instance), comma-separated"
)

_ITEM = re.compile(r"^(?P<profile>[A-Za-z0-9][A-Za-z0-9.+\-]*)(?:=(?P<count>[^=@]*)|@(?P<start>[^=@]*))?$")


def _bad_item(item: str, reason: str) -> GpushareError:
    return GpushareError(
        Problem(f"bad layout item {item!r}: {reason}", fix=f"write {LAYOUT_FORMS}"), exit_code=2
    )


def parse_layout(text: str) -> Layout:
    """Parse "1g.10gb=2,3g.40gb@4,2g.20gb"; an empty string is the empty layout (MIG on, no instances)."""
    if not text.strip():
        return ()
    instances: list[Instance] = []
    counted: dict[str, str] = {}  # profile -> the item that gave its count
    for raw in text.split(","):
        item = re.sub(r"\s+", "", raw)
        if not item:
            raise _bad_item(raw, "empty item (two commas, or a comma at an end)")
        match = _ITEM.match(item)
        if match is None:
            raise _bad_item(item, "not a profile name with an optional =COUNT or @START")
        profile, count, start = match.group("profile", "count", "start")
        if start is not None:
            if not re.fullmatch(r"-?[0-9]+", start):
                raise _bad_item(item, f"start {start!r} is not a whole number")
            if int(start) < 0:
                raise _bad_item(item, f"start {start} is negative; starts count memory slices from 0")
            instances.append(Instance(profile, int(start)))
            continue
        number = 1
        if count is not None:
            if not re.fullmatch(r"-?[0-9]+", count):
                raise _bad_item(item, f"count {count[:20]!r} is not a whole number")
            if len(count.lstrip("-")) > 4:
                raise _bad_item(item, f"count {count[:20]} is more than any GPU holds ({max_instances_per_gpu()})")
            number = int(count)
            if number < 1:
                raise _bad_item(item, f"count {number} is below 1; leave the profile out instead")
        if profile in counted:
            raise _bad_item(item, f"{profile} appears twice ({counted[profile]} and {item}); counts do not add up "
                            "silently")
        counted[profile] = item
        _check_count(profile, number)
        instances.extend([Instance(profile)] * number)
    return tuple(instances)


@cache
def max_instances_per_gpu() -> int:
    """The most GPU instances any catalogued GPU can hold: a bound on counts before any list is built."""
    return max((p.max_count for m in load_catalog().models.values() for p in m.profiles.values()), default=0)


def _check_count(profile: str, count: int) -> None:
    """Counts a little above the most any GPU holds reach check_layout, which names the model's own limit;
    far above it they stop here, before a list of that many instances is built."""
    limit = max_instances_per_gpu()
    if count > 8 * limit:
        raise GpushareError(Problem(f"MIG profile {profile}: count {count} is more than any GPU holds ({limit})",
                                    fix="give the instances of one GPU"), exit_code=2)


def layout_from_counts(counts: Mapping[str, int]) -> Layout:
    """The multiset form, as mig-parted configs and environment files write it; a count of 0 adds nothing."""
    instances: list[Instance] = []
    for profile, count in counts.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise GpushareError(
                Problem(
                    f"MIG profile {profile}: count {count!r} is not a whole number >= 0", fix="use e.g. 2"
                ),
                2,
            )
        _check_count(profile, count)
        instances.extend([Instance(profile)] * count)
    return tuple(instances)


def layout_counts(layout: Layout) -> dict[str, int]:
    counts: dict[str, int] = {}
    for instance in layout:
        counts[instance.profile] = counts.get(instance.profile, 0) + 1
    return counts


def format_layout(layout: Layout) -> str:
    """The inverse of parse_layout: counts for free instances, @start for pinned ones."""
    free = layout_counts(tuple(i for i in layout if i.start is None))
    parts = [f"{p}={n}" for p, n in free.items()]
    parts += [str(i) for i in layout if i.start is not None]
    return ",".join(parts)


# A verdict is what a MigCheck holds, in immutable form so that cached results cannot be altered by callers.
_Verdict = tuple[bool, str, tuple[str, ...], tuple[str, ...], tuple[Placement, ...]]

_PROFILE = attrgetter("profile")
_START = attrgetter("start")
_PROFILE_AND_START = attrgetter("profile", "start")
_CACHE_LIMIT = 200_000


class _Geometry:
    """Per-model precomputation: every placeable multiset with a witness, and the memoised verdicts."""

    def __init__(self, model: GpuModel) -> None:
        self.model = model
        self.profiles: tuple[MigProfile, ...] = tuple(model.profiles.values())
        self.index = {p.name: i for i, p in enumerate(self.profiles)}
        self.verdicts: dict[tuple[Any, ...], _Verdict] = {}
        self.has_driver_rules = bool(model.combination_rules) or any(
            p.min_driver_branch is not None for p in self.profiles
        )
        # Per profile, only the media engines the model has a total for.
        self.engine_use = {
            p.name: tuple((e, n) for e, n in p.engines if e in model.engine_totals and n)
            for p in self.profiles
        }
        self.base_warnings: tuple[str, ...] = ()
        if model.mig_capable and not model.placements_exact:
            self.base_warnings = (
                f"placements of {model.name} are inferred from a sibling GPU (placement_confidence: "
                f"{model.placement_confidence}); confirm them with `nvidia-smi mig -lgipp` on the real GPU",
            )
        self._witnesses: dict[tuple[int, ...], tuple[Placement, ...]] | None = None

    @property
    def witnesses(self) -> dict[tuple[int, ...], tuple[Placement, ...]]:
        if self._witnesses is None:
            self._witnesses = self._enumerate()
        return self._witnesses

    def _enumerate(self) -> dict[tuple[int, ...], tuple[Placement, ...]]:
        # Walk the slices left to right: at each, an allowed instance starts there or the slice stays free.
        # That reaches every set of non-overlapping placements exactly once; 8 slices give a few thousand.
        units = self.model.placement_units_total
        starting_at: list[list[tuple[int, MigProfile]]] = [[] for _ in range(units)]
        for i, profile in enumerate(self.profiles):
            for start in profile.placements:
                if start + profile.memory_slices <= units:
                    starting_at[start].append((i, profile))
        counts = [0] * len(self.profiles)
        chosen: list[Placement] = []
        found: dict[tuple[int, ...], tuple[Placement, ...]] = {}

        def walk(slice_: int) -> None:
            if slice_ >= units:
                found.setdefault(tuple(counts), tuple(chosen))
                return
            for i, profile in starting_at[slice_]:
                counts[i] += 1
                chosen.append(Placement(profile.name, slice_, profile.memory_slices))
                walk(slice_ + profile.memory_slices)
                chosen.pop()
                counts[i] -= 1
            walk(slice_ + 1)

        walk(0)
        return found


_GEOMETRIES: dict[int, _Geometry] = {}


def _geometry(model: GpuModel) -> _Geometry:
    # Keyed by identity (the entry keeps the model alive, so the id cannot be reused): catalog models are
    # singletons, and a hand-built model with the same name must not share their cache.
    geometry = _GEOMETRIES.get(id(model))
    if geometry is None or geometry.model is not model:
        geometry = _GEOMETRIES[id(model)] = _Geometry(model)
    return geometry


def check_layout(model: GpuModel, layout: Layout, driver_branch: int | None = None) -> MigCheck:
    """The exact check; a valid layout comes back with a witness placement (sorted by start)."""
    geometry = _GEOMETRIES.get(id(model))
    if geometry is None or geometry.model is not model:
        geometry = _geometry(model)
    # Order does not matter: one verdict per (multiset of instances, driver branch). Free layouts, the common
    # case, are keyed by their sorted profile names alone, which is the cheapest key to build.
    starts = list(map(_START, layout))
    if starts.count(None) == len(starts):
        names = list(map(_PROFILE, layout))
        names.sort()
        key: tuple[Any, ...] = (driver_branch, tuple(names))
    else:
        key = (driver_branch, tuple(sorted(map(_PROFILE_AND_START, layout), key=_none_first)))
    verdict = geometry.verdicts.get(key)
    if verdict is None:
        if len(geometry.verdicts) >= _CACHE_LIMIT:
            geometry.verdicts.clear()
        verdict = geometry.verdicts[key] = _verdict(geometry, _canonical(geometry, layout), driver_branch)
    return MigCheck(verdict[0], verdict[1], list(verdict[2]), list(verdict[3]), list(verdict[4]))


def clear_check_cache() -> None:
    """Forget every memoised verdict and placement table (for benchmarks and tests)."""
    _GEOMETRIES.clear()


def _none_first(item: tuple[str, int | None]) -> tuple[str, int]:
    return item[0], -1 if item[1] is None else item[1]


def _canonical(geometry: _Geometry, layout: Layout) -> Layout:
    # Messages follow catalog order (smallest profile first), so a verdict never depends on the input order.
    index = geometry.index
    last = len(index)
    return tuple(
        sorted(
            layout, key=lambda i: (index.get(i.profile, last), i.profile, -1 if i.start is None else i.start)
        )
    )


def _describe_counts(counts: Mapping[str, int]) -> str:
    return ", ".join(name if n == 1 else f"{name} x{n}" for name, n in counts.items())


def _either(values: Iterable[int]) -> str:
    items = [str(v) for v in values]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def _starts_text(profiles: Iterable[MigProfile]) -> str:
    parts = []
    for p in profiles:
        where = (
            f"only starts at {p.placements[0]}"
            if len(p.placements) == 1
            else f"starts at {_either(p.placements)}"
        )
        parts.append(f"{p.name} ({counted(p.memory_slices, 'slice')}) {where}")
    return "; ".join(parts)


def _ranges(mask: int, units: int) -> str:
    spans: list[str] = []
    start = None
    for slice_ in range(units + 1):
        free = slice_ < units and not mask >> slice_ & 1
        if free and start is None:
            start = slice_
        elif not free and start is not None:
            spans.append(str(start) if start == slice_ - 1 else f"{start}-{slice_ - 1}")
            start = None
    return ", ".join(spans) or "none"


def _verdict(geometry: _Geometry, layout: Layout, driver_branch: int | None) -> _Verdict:
    model = geometry.model
    gpu = model.name
    errors: list[str] = []
    warnings = list(geometry.base_warnings)

    def result(witness: Iterable[Placement] = ()) -> _Verdict:
        ok = not errors
        placements = tuple(sorted(witness, key=attrgetter("start"))) if ok else ()
        return ok, gpu, tuple(errors), tuple(warnings), placements

    counts = layout_counts(layout)
    if not model.mig_capable:
        what = f"the layout {format_layout(layout)}" if layout else "an empty MIG layout"
        errors.append(
            f"{gpu} does not support MIG, so {what} cannot apply to it "
            "(share it with time-slicing or MPS, or give it out whole)"
        )
        return result()
    unknown = [name for name in counts if name not in geometry.index]
    if unknown:
        errors.extend(unknown_profile_message(model, name) for name in unknown)
        return result()
    profiles = {name: model.profiles[name] for name in counts}

    if geometry.has_driver_rules:
        _check_driver(model, profiles, driver_branch, errors, warnings)
    driver_errors = len(errors)

    over = False
    compute = 0
    for name, count in counts.items():
        profile = profiles[name]
        compute += profile.compute_slices * count
        if count > profile.max_count:
            over = True
            errors.append(
                f"{name}: {counted(count, 'instance')} requested, but {gpu} allows at most "
                f"{profile.max_count} of this profile"
            )
    if compute > model.compute_slices_total:
        parts = ", ".join(f"{name} {profiles[name].compute_slices * n}" for name, n in counts.items())
        errors.append(
            f"the layout needs {compute} compute slices ({parts}) but {gpu} has {model.compute_slices_total}"
        )

    if len(errors) == driver_errors and model.engine_totals:
        # Media engines grow with compute slices; only report them when they are the reason on their own.
        _check_engines(geometry, counts, errors, warnings)

    if over:
        # Counts beyond a profile's maximum cannot be created; a placement analysis would only repeat that.
        return result()
    return result(_place(geometry, layout, counts, profiles, errors))


def _check_driver(
    model: GpuModel,
    profiles: Mapping[str, MigProfile],
    driver_branch: int | None,
    errors: list[str],
    warnings: list[str],
) -> None:
    needs = [(name, p.min_driver_branch) for name, p in profiles.items() if p.min_driver_branch is not None]
    needs += [
        (" together with ".join(sorted(rule.profiles, reverse=True)), rule.min_driver_branch)
        for rule in model.combination_rules
        if rule.profiles <= profiles.keys()
    ]
    for what, branch in needs:
        if driver_branch is None:
            warnings.append(
                f"{what} needs driver R{branch} or newer on {model.name} (no driver branch given)"
            )
        elif driver_branch < branch:
            errors.append(
                f"{what} needs driver R{branch} or newer on {model.name}; the host runs R{driver_branch}"
            )


def _check_engines(
    geometry: _Geometry, counts: Mapping[str, int], errors: list[str], warnings: list[str]
) -> None:
    model = geometry.model
    used: dict[str, int] = {}
    for name, count in counts.items():
        for engine, n in geometry.engine_use[name]:
            used[engine] = used.get(engine, 0) + n * count
    short = []
    for engine, total in model.engine_totals.items():
        if used.get(engine, 0) > total:
            parts = ", ".join(
                f"{name} {n * count}"
                for name, count in counts.items()
                for e, n in geometry.engine_use[name]
                if e == engine
            )
            short.append(f"{engine} {used[engine]} of {total} ({parts})")
    if not short:
        return
    errors.append(f"the layout needs more media engines than {model.name} has: {'; '.join(short)}")
    if model.engine_totals_inferred:
        full = [
            p.name
            for p in geometry.profiles
            if p.compute_slices == model.compute_slices_total
            and p.memory_slices == model.placement_units_total
        ]
        warnings.append(
            f"the media-engine totals of {model.name} are inferred from its full-GPU profile "
            f"{' and '.join(full)}; the catalog states no GPU totals"
        )


def _place(
    geometry: _Geometry,
    layout: Layout,
    counts: Mapping[str, int],
    profiles: Mapping[str, MigProfile],
    errors: list[str],
) -> tuple[Placement, ...]:
    model = geometry.model
    gpu = model.name
    units = model.placement_units_total
    pinned = [i for i in layout if i.start is not None]
    if not pinned:
        vector = [0] * len(geometry.index)
        for name, n in counts.items():
            vector[geometry.index[name]] = n
        witness = geometry.witnesses.get(tuple(vector))
        if witness is None:
            errors.append(_no_placement(model, counts, profiles))
        return witness or ()

    fixed: list[Placement] = []
    bad = False
    for instance in pinned:
        profile = profiles[instance.profile]
        assert instance.start is not None
        if instance.start not in profile.placements or instance.start + profile.memory_slices > units:
            bad = True
            errors.append(
                f"{instance}: start {instance.start} is not an allowed placement on {gpu} "
                f"(allowed: {', '.join(map(str, profile.placements))})"
            )
            continue
        placed = Placement(profile.name, instance.start, profile.memory_slices)
        for other in fixed:
            low = max(placed.start, other.start)
            high = min(placed.start + placed.size, other.start + other.size) - 1
            if low <= high:
                bad = True
                span = str(low) if low == high else f"{low}-{high}"
                errors.append(f"{placed} overlaps {other} (memory slices {span}) on {gpu}")
        fixed.append(placed)
    if bad:
        return ()

    mask = 0
    for placed in fixed:
        mask |= ((1 << placed.size) - 1) << placed.start
    free = sorted(
        (profiles[i.profile] for i in layout if i.start is None), key=lambda p: (-p.memory_slices, p.name)
    )
    found = _search(free, mask, units)
    if found is None:
        free_counts = layout_counts(tuple(i for i in layout if i.start is None))
        need = sum(p.memory_slices for p in free)
        left = units - bin(mask).count("1")
        pinned_text = ", ".join(map(str, fixed))
        if need > left:
            reason = f"they need {need} memory slices and {left} are left ({_ranges(mask, units)})"
        else:
            reason = (
                f"the free memory slices are {_ranges(mask, units)}, and "
                f"{_starts_text(profiles[name] for name in free_counts)}"
            )
        errors.append(
            f"no placement exists on {gpu} for {_describe_counts(free_counts)} around {pinned_text}: {reason}"
        )
        return ()
    return tuple(fixed) + found


def _search(free: list[MigProfile], mask: int, units: int) -> tuple[Placement, ...] | None:
    """Backtracking over allowed starts with a bitmask of used slices (largest instances first)."""
    chosen: list[Placement] = []

    def go(k: int, used: int, floor: int) -> bool:
        if k == len(free):
            return True
        profile = free[k]
        bits = (1 << profile.memory_slices) - 1
        for start in profile.placements:
            # Equal profiles take increasing starts, so the same arrangement is not tried in every order.
            if start < floor or start + profile.memory_slices > units or used & (bits << start):
                continue
            chosen.append(Placement(profile.name, start, profile.memory_slices))
            same_next = k + 1 < len(free) and free[k + 1] is profile
            if go(k + 1, used | (bits << start), start + 1 if same_next else 0):
                return True
            chosen.pop()
        return False

    return tuple(chosen) if go(0, mask, 0) else None


def _no_placement(model: GpuModel, counts: Mapping[str, int], profiles: Mapping[str, MigProfile]) -> str:
    units = model.placement_units_total
    need = sum(profiles[name].memory_slices * n for name, n in counts.items())
    what = _describe_counts(counts)
    if need > units:
        parts = ", ".join(f"{name} {profiles[name].memory_slices * n}" for name, n in counts.items())
        return (
            f"no placement exists on {model.name} for {what}: needs {need} of {units} memory slices ({parts})"
        )
    return (
        f"no placement exists on {model.name} for {what}: it needs {need} of {units} memory slices, but "
        f"{_starts_text(profiles.values())}, and no choice of those starts keeps the instances apart"
    )
