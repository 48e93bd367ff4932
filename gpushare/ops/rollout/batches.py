"""Batch sizes: the one place they are defined (`gpushare rollout --batches`; playbooks/rollout.yml has none)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpushare.core.errors import GpushareError, Problem

if TYPE_CHECKING:
    from gpushare.core.resolve import ResolvedFleet

# A canary host, then half the hosts, then the rest.
DEFAULT_BATCHES = "1,50%,100%"


def _batch_size(part: str, text: str) -> int | float:
    bad = Problem(f"--batches {text!r}: {part!r} is not a host count or a percentage", path="--batches",
                  fix=f"give batch sizes like {DEFAULT_BATCHES}: positive host counts or percentages up to 100%")
    try:
        size: int | float = float(part[:-1]) / 100 if part.endswith("%") else int(part)
    except ValueError:
        raise GpushareError(bad, exit_code=2) from None
    if not (0 < size <= 1 if isinstance(size, float) else size >= 1):
        raise GpushareError(bad, exit_code=2)
    return size


def parse_batches(text: str) -> list[int | float]:
    """`1,50%,100%` -> [1, 0.5, 1.0]: host counts, or shares of all hosts (as Ansible's `serial`)."""
    return [_batch_size(part.strip(), text) for part in text.split(",")]


def plan_batches(hosts: list[str], sizes: list[int | float]) -> list[list[str]]:
    """Hosts in batches the way Ansible's `serial` cuts them: a share is of all hosts (rounded down, at least one),
    and the last size repeats until every host has a batch."""
    out: list[list[str]] = []
    start = 0
    while start < len(hosts):
        size = sizes[min(len(out), len(sizes) - 1)]
        count = size if isinstance(size, int) else max(1, int(len(hosts) * size))
        out.append(hosts[start:start + count])
        start += count
    return out


def ansible_hosts(fleet: ResolvedFleet) -> list[str]:
    """Bare-metal hosts in environment order (pools, then hosts): the first is the canary."""
    return [n.name for n in fleet.nodes if n.managed_by == "ansible"]
