"""Concrete GPUs from an integer plan, and the local search that empties lightly used ones."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpushare.planner.model import EPS
from gpushare.planner.solve.data import Data
from gpushare.planner.solve.engine import Clock
from gpushare.planner.solve.rounding import IntSolution

EMPTY_TRIES = 200  # failed attempts in a row that end a pass of the local search


@dataclass
class Slot:
    """One concrete unit of one GPU and the item types placed on it."""

    kind: int
    items: list[int] = field(default_factory=list)
    memory: float = 0.0
    compute: float = 0.0


@dataclass
class Gpu:
    config: int
    slots: list[Slot]


def realise(data: Data, solution: IntSolution) -> list[Gpu]:
    """GPUs with their units, fills put on units of their kind, surplus replicas taken off."""
    gpus: list[Gpu] = []
    free: dict[int, list[Slot]] = {}
    for g, count in sorted(solution.configs.items()):
        config = data.configs[g]
        for _ in range(count):
            slots = [Slot(u) for u, c in config.units for _ in range(c)]
            gpus.append(Gpu(g, slots))
            for slot in slots:
                free.setdefault(slot.kind, []).append(slot)
    for f, count in sorted(solution.fills.items(), key=lambda kv: -sum(n for _, n in kv[0].counts)):
        for _ in range(count):
            slot = free[f.unit].pop(0)
            for i, n in f.counts:
                slot.items.extend([i] * n)
                slot.memory += data.memory[i] * n
                slot.compute += data.compute[i] * n
    # More copies than replicas: take the surplus off the emptiest GPUs first.
    surplus = {i: -int(d) for i, d in enumerate(data.demand)}
    for gpu in gpus:
        for slot in gpu.slots:
            for i in slot.items:
                surplus[i] += 1
    for gpu in sorted(gpus, key=lambda g: sum(len(s.items) for s in g.slots)):
        for slot in gpu.slots:
            for i in list(slot.items):
                if surplus[i] > 0:
                    slot.items.remove(i)
                    slot.memory -= data.memory[i]
                    slot.compute -= data.compute[i]
                    surplus[i] -= 1
    return gpus


def _over_margin(data: Data, gpus: list[Gpu]) -> float:
    """rho * hardware units - advertised over the fleet; must stay >= 0."""
    if data.rho is None:
        return math.inf
    return sum(data.rho * data.configs[g.config].hardware_units - data.configs[g.config].advertised for g in gpus)


def _fits(data: Data, slot: Slot, i: int) -> bool:
    unit = data.units[slot.kind]
    if not data.adm[i, slot.kind] or len(slot.items) >= unit.replicas:
        return False
    if unit.sharing == "time-slicing":
        return bool(slot.memory + data.memory[i] <= unit.memory_gib + EPS
                    and slot.compute + data.compute[i] <= unit.sum_compute + EPS)
    return True


def _place(data: Data, slot: Slot, i: int) -> None:
    slot.items.append(i)
    slot.memory += data.memory[i]
    slot.compute += data.compute[i]


def _unplace(data: Data, slot: Slot, i: int) -> None:
    slot.items.remove(i)
    slot.memory -= data.memory[i]
    slot.compute -= data.compute[i]


def empty_gpus(data: Data, gpus: list[Gpu], clock: Clock) -> list[Gpu]:
    """Local search: move every replica of a lightly used GPU onto free room elsewhere (best fit), and drop that
    GPU. Lightest GPUs first; a pass ends after EMPTY_TRIES failures in a row, the search when a pass empties none."""
    margin = _over_margin(data, gpus)

    def term(gpu: Gpu) -> float:
        config = data.configs[gpu.config]
        return (data.rho or 0.0) * config.hardware_units - config.advertised

    def drop_ok(gpu: Gpu) -> bool:
        return data.rho is None or margin - term(gpu) >= -EPS

    keep = []
    for gpu in gpus:  # GPUs that ended up empty
        if not any(s.items for s in gpu.slots) and drop_ok(gpu):
            margin -= term(gpu) if data.rho is not None else 0.0
            continue
        keep.append(gpu)
    gpus = keep
    smallest = float(data.memory.min()) if data.n else 0.0
    improved = True
    while improved and not clock.expired():
        improved = False
        room: dict[int, list[tuple[int, Slot]]] = {}
        for k, gpu in enumerate(gpus):
            for slot in gpu.slots:
                unit = data.units[slot.kind]
                if len(slot.items) < unit.replicas and slot.memory + smallest <= unit.memory_gib + EPS:
                    room.setdefault(slot.kind, []).append((k, slot))
        load = [sum(len(s.items) / data.units[s.kind].replicas for s in g.slots) / len(g.slots) for g in gpus]
        removed: set[int] = set()
        failures = 0
        for k in sorted(range(len(gpus)), key=lambda k: (load[k], -data.configs[gpus[k].config].cost)):
            if failures >= EMPTY_TRIES or clock.expired():
                break
            gpu = gpus[k]
            if not drop_ok(gpu):
                continue
            moves: list[tuple[Slot, int]] = []
            # Replicas with the fewest places to go first, then the largest.
            items = sorted((i for s in gpu.slots for i in s.items),
                           key=lambda i: (len(data.item_kinds[i]), -data.memory[i]))
            ok = True
            for i in items:
                target = None
                best_left = math.inf
                for u in data.item_kinds[i]:
                    for other, slot in room.get(int(u), ()):
                        if other == k or other in removed or not _fits(data, slot, i):
                            continue
                        unit = data.units[slot.kind]
                        left = (unit.memory_gib - slot.memory - data.memory[i]) / unit.memory_gib + \
                            (unit.replicas - len(slot.items) - 1) / unit.replicas
                        if left < best_left:
                            best_left, target = left, slot
                if target is None:
                    ok = False
                    break
                _place(data, target, i)
                moves.append((target, i))
            if not ok:
                for slot, i in reversed(moves):
                    _unplace(data, slot, i)
                failures += 1
                continue
            failures = 0
            margin -= term(gpu) if data.rho is not None else 0.0
            removed.add(k)
            improved = True
        gpus = [g for k, g in enumerate(gpus) if k not in removed]
    return gpus
