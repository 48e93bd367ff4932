"""gpushare.ops.diagnose: why DCGM series join no node, read from the series' labels (dcgm-exporter's hostname
label, or Hostname before 4.6.0-4.8.3)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gpushare.core.resolve import resolve
from tests.conftest import PROFILES
from tests.unit.ops.capacity.helpers import ENV


class _SeriesOnly:
    """A Prometheus that answers /api/v1/series from fixed label sets (enough for diagnose_join's selectors)."""

    url = "http://127.0.0.1:9"

    def __init__(self, *series: dict[str, str]) -> None:
        self._series = series

    def series(self, name: str, selector: str, start: float, end: float) -> list[dict[str, Any]]:
        import re

        metric, body = re.fullmatch(r"(\w*)\{?(.*?)\}?", selector).groups()  # type: ignore[union-attr]
        matchers = re.findall(r'(\w+)\s*(=~|!=|=)\s*"([^"]*)"', body)
        if metric:
            matchers.append(("__name__", "=", metric))

        def holds(labels: dict[str, str], label: str, op: str, value: str) -> bool:
            have = labels.get(label, "")
            return {"=": have == value, "!=": have != value, "=~": re.fullmatch(value, have) is not None}[op]

        return [{"metric": s} for s in self._series if all(holds(s, *m) for m in matchers)]


@pytest.mark.parametrize(("dcgm", "says"), [
    ({"hostname": "under-1.lab.example.net"}, "hostname values (e.g. under-1.lab.example.net) match no node"),
    ({"Hostname": "under-1.lab.example.net"}, "hostname values (e.g. under-1.lab.example.net) match no node"),
    ({}, "DCGM series have no hostname label (Hostname before dcgm-exporter 4.6.0-4.8.3)"),
], ids=["hostname", "Hostname-older-exporter", "neither"])
def test_join_diagnosis_reads_either_spelling_of_the_node_label(dcgm: dict[str, str], says: str) -> None:
    from gpushare.ops.diagnose import diagnose_join

    prom = _SeriesOnly(
        {"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": "GPU-under-1-0", "gpu": "0", **dcgm},
        {"__name__": "kube_node_labels", "node": "under-1", "label_gpushare_io_pool": "ts-underused"})
    problem = diagnose_join(prom, resolve(ENV, PROFILES), "1h", time.time())  # type: ignore[arg-type]
    assert says in str(problem)
