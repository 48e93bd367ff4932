"""First-fit decreasing places the replicas of one type in bulk (`solve.pack_kinds`): the same packing as placing
them one at a time, in work that grows with the units, not the replicas; and a demand beyond what one run plans is
refused before any solving."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.planner.demand import MAX_TOTAL_REPLICAS, Demand
from gpushare.planner.pack import plan_demand
from gpushare.planner.solve import rounding as solve

H100, L4 = "NVIDIA H100 80GB HBM3", "NVIDIA L4"


def one_at_a_time(data: Any, wanted: dict[int, dict[int, int]]) -> list[solve.Fill]:
    """First-fit decreasing as gpushare did it before: every replica to the first open unit it fits."""
    fills: list[solve.Fill] = []
    for u, counts in wanted.items():
        unit = data.units[u]
        if unit.sharing == "exclusive":
            fills += [solve.Fill(u, ((i, 1),)) for i, c in counts.items() for _ in range(c)]
            continue
        units: list[list[Any]] = []
        open_: list[list[Any]] = []
        sliced = unit.sharing == "time-slicing"
        least_m = min(float(data.memory[i]) for i in counts)
        least_c = min(float(data.compute[i]) for i in counts)
        order = sorted(counts, key=lambda i: -max(data.memory[i] / unit.memory_gib, data.compute[i] / unit.sum_compute))
        for i in order:
            m, c = float(data.memory[i]), float(data.compute[i])
            for _ in range(counts[i]):
                target = next((e for e in open_ if e[3] < unit.replicas and (not sliced or (
                    e[1] + m <= unit.memory_gib + solve.EPS and e[2] + c <= unit.sum_compute + solve.EPS))), None)
                if target is None:
                    target = [{}, 0.0, 0.0, 0]
                    units.append(target)
                    open_.append(target)
                target[0][i] = target[0].get(i, 0) + 1
                target[1] += m
                target[2] += c
                target[3] += 1
                if target[3] >= unit.replicas or (sliced and (target[1] + least_m > unit.memory_gib + solve.EPS
                                                              or target[2] + least_c > unit.sum_compute + solve.EPS)):
                    open_.remove(target)
        fills += [solve.Fill(u, tuple(sorted(e[0].items()))) for e in units]
    return fills


def demand(replicas: int, **top: Any) -> Demand:
    shapes = [(18, 0.25, "online"), (9, 0.1, "online"), (36, 0.4, "online"), (8, 0.12, "batch"),
              (20, 0.3, "batch"), (6, 0.05, "dev"), (3, 0.03, "dev"), (11, 0.07, "batch")]
    return Demand.model_validate({
        "gpus": [{"model": H100}, {"model": L4, "cost": 0.2}], "max_shared_replicas": 8,
        "workloads": [{"name": f"w{k}", "tenant": "t", "kind": kind, "memory_gib": m, "compute": c,
                       "replicas": replicas} for k, (m, c, kind) in enumerate(shapes)], **top})


@pytest.mark.parametrize("replicas", [1, 7, 250])
def test_bulk_first_fit_packs_as_one_replica_at_a_time(monkeypatch: pytest.MonkeyPatch, replicas: int) -> None:
    seen: list[tuple[Any, dict[int, dict[int, int]]]] = []
    real = solve.pack_kinds

    def recording(data: Any, wanted: dict[int, dict[int, int]]) -> list[solve.Fill]:
        seen.append((data, wanted))
        return real(data, wanted)

    monkeypatch.setattr(solve, "pack_kinds", recording)
    plan_demand(demand(replicas), time_limit=10.0)
    assert seen
    for data, wanted in seen:
        assert real(data, wanted) == one_at_a_time(data, wanted)
        # and with counts the solve never asked for: every kind given all of every type
        everything = {u: {i: replicas * 3 + 1 for i in range(data.n)} for u in wanted}
        assert real(data, everything) == one_at_a_time(data, everything)


def test_a_demand_beyond_one_run_is_refused_before_solving() -> None:
    per = MAX_TOTAL_REPLICAS // 8 + 1
    with pytest.raises(Exception) as err:
        demand(per)
    assert f"{8 * per:,} replicas in all, above the {MAX_TOTAL_REPLICAS:,}" in str(err.value)
    demand(MAX_TOTAL_REPLICAS // 8)  # the neighbour at the bound is planned


def test_the_cli_refuses_it_with_the_file(tmp_path: Any) -> None:
    import yaml
    from typer.testing import CliRunner

    from gpushare.cli import app

    doc = demand(1).model_dump(mode="json", exclude_none=True)
    for w in doc["workloads"]:
        w["replicas"] = 100_000
    path = tmp_path / "demand.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(app, ["pack", "--demand", str(path), "--time-limit", "5"])
    assert result.exit_code == 1, result.output
    assert str(path) in result.output and "800,000 replicas in all" in result.output
    assert "split the demand" in result.output
