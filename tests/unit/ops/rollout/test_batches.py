"""Rollout batches (gpushare.ops.rollout.batches): cut like Ansible's `serial`, and bad batch sizes refused."""

from __future__ import annotations

import pytest

from gpushare.core.errors import GpushareError
from gpushare.ops.rollout.batches import parse_batches, plan_batches

# ---------------------------------------------------------------- batches


@pytest.mark.parametrize(("spec", "count", "sizes"), [
    ("1,50%,100%", 6, [1, 3, 2]),
    ("1,50%,100%", 1, [1]),
    ("1,50%,100%", 3, [1, 1, 1]),
    ("2", 5, [2, 2, 1]),
    ("1,25%", 10, [1, 2, 2, 2, 2, 1]),
    ("100%", 4, [4]),
    ("10%", 4, [1, 1, 1, 1]),
])
def test_batches_are_cut_like_ansible_serial(spec: str, count: int, sizes: list[int]) -> None:
    hosts = [f"h{i}" for i in range(count)]
    batches = plan_batches(hosts, parse_batches(spec))
    assert [len(b) for b in batches] == sizes
    assert [h for b in batches for h in b] == hosts


@pytest.mark.parametrize("spec", ["0", "abc", "150%", "", "1,,2", "-1", "0%"])
def test_bad_batch_sizes_are_refused(spec: str) -> None:
    with pytest.raises(GpushareError) as err:
        parse_batches(spec)
    assert err.value.exit_code == 2
    assert err.value.problems[0].path == "--batches" and "1,50%,100%" in (err.value.problems[0].fix or "")
