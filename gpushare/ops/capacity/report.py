"""The whole `gpushare capacity` run: options, evidence, recommendations, the patch written, and the report."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare.core.errors import GpushareError, Problem
from gpushare.core.files import check_output_file, write_file
from gpushare.core.guardrails import load_guardrails
from gpushare.core.resolve import ResolvedFleet, resolve_env
from gpushare.ops.capacity.evidence import PoolEvidence, collect_evidence, find_node_gaps
from gpushare.ops.capacity.proposal import propose
from gpushare.ops.capacity.recommendations import Recommendation, recommend
from gpushare.ops.capacity.workloads import PoolWorkloads, collect_workloads, pool_workloads
from gpushare.ops.diagnose import diagnose_join
from gpushare.ops.patch import Proposal
from gpushare.ops.prometheus import QUERY_SECONDS, Prometheus, check_window

SOURCES = ("auto", "recorded", "raw")


@dataclass
class CapacityReport:
    """One capacity run: the evidence from Prometheus, the recommendations, and the proposed patch (written)."""

    fleet: ResolvedFleet
    window: str
    end: float
    source: str  # recorded (gpushare's recording rules) or raw (exporter series)
    evidence: dict[str, PoolEvidence]
    recommendations: list[Recommendation]
    proposal: Proposal
    patch_path: Path
    query_seconds: float
    queries: int
    workloads: dict[str, PoolWorkloads] = field(default_factory=dict)  # shared pools: the per-workload section

    @property
    def gpus_freed(self) -> int:
        return sum(r.gpus_freed for r in self.recommendations if r.pool in self.proposal.applied)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": True, "environment": self.fleet.environment, "window": self.window, "end": self.end,
            "source": "recording rules" if self.source == "recorded" else "raw exporter series",
            "pools": [{**r.as_dict(), "evidence_figures": self.evidence[r.pool].as_dict(),
                       "in_patch": r.pool in self.proposal.applied, "withheld": self.proposal.withheld.get(r.pool),
                       **({"per_workload": self.workloads[r.pool].as_dict()} if r.pool in self.workloads else {})}
                      for r in self.recommendations],
            "gpus_freed": self.gpus_freed,
            "patch": str(self.patch_path) if self.proposal.patch else None,
            "prometheus_query_seconds": round(self.query_seconds, 3),
            "queries": self.queries,
        }


def _check_options(source: str, window: str) -> None:
    if source not in SOURCES:
        raise GpushareError(Problem(f"--source {source!r}", fix="use auto, recorded or raw"), exit_code=2)
    if not re.fullmatch(r"[1-9][0-9]*[smhdw]", window):
        raise GpushareError(Problem(f"--window {window!r} is not a Prometheus duration",
                                    fix="use e.g. 7d, 36h or 90m"), exit_code=2)
    check_window(window)


def run_capacity(env: str, prometheus: str, window: str = "7d", end: float | None = None, source: str = "auto",
                 patch: Path | None = None, chart: Path | None = None,
                 progress: Callable[[str], None] = lambda what: None,
                 timeout: float = QUERY_SECONDS) -> CapacityReport:
    """Query Prometheus, size every pool, and write the proposed change as a patch for review (never applied).
    `chart` is only checked as an output path here; `progress` hears what is being done; `timeout` bounds each
    query (--timeout)."""
    _check_options(source, window)
    prom = Prometheus(prometheus, timeout=timeout)
    fleet = resolve_env(env)
    patch_path = patch or Path("build") / "capacity" / f"{fleet.environment}.patch"
    check_output_file(patch_path, [fleet.source], option="--patch")
    if chart is not None:
        check_output_file(chart, [fleet.source], option="--chart")
    guardrails = load_guardrails()
    at = end if end is not None else time.time()
    progress("querying Prometheus")
    evidence, used = collect_evidence(prom, fleet, guardrails, window, at,
                                      lambda name: progress(f"Prometheus: {name}"), source)
    if not any(e.utilization_mean is not None for e in evidence.values()):
        raise GpushareError(diagnose_join(prom, fleet, window, at))
    find_node_gaps(prom, fleet, guardrails, evidence, window, at, used)
    found = collect_workloads(prom, fleet, guardrails, window, at, used,
                              lambda name: progress(f"Prometheus: {name}"))
    progress("sizing pools")
    recs = recommend(fleet, guardrails, evidence, window)
    workloads = pool_workloads(fleet, guardrails, found)
    progress("checking the proposed change (resolve, MIG check, guardrails)")
    proposal = propose(fleet, guardrails, recs)
    if proposal.patch:
        write_file(patch_path, proposal.patch)
    return CapacityReport(fleet, window, at, used, evidence, recs, proposal, patch_path,
                          sum(t.seconds for t in prom.timings), len(prom.timings), workloads)
