"""`gpushare capacity`: window statistics from Prometheus, and per pool a recommendation with its evidence.

Prometheus does the joins and the aggregation to pool level: every figure is a window statistic of a PromQL
expression built from the same expressions as the recording rules (gpushare.render.monitoring.expressions), on
the rules' own series or on the raw DCGM and kube-state-metrics series, so it works on history recorded before
gpushare's rules were deployed. gpushare reads that pool-level expression at the policy's step, a day at a time (a
refused chunk is halved), and applies the statistic itself exactly as Prometheus would; it never pulls the
exporters' raw series.

How a pool is sized (targets in policies/guardrails.yaml `capacity:`, limits in its `environments:`):
- time-slicing / MPS: replicas per GPU = the most that keep the GPU's mean busy share under target_utilization
  and its p95 under max_p95_utilization (from the load per allocated replica), that fit in memory (p95 memory per
  replica, memory_headroom kept free), and that the environment allows (max_shared_replicas for the GPU's memory
  class, max_oversubscription); then GPUs = what the allocated replicas plus the waiting workloads need.
- MIG: saturated instances, or instances near their framebuffer, grow to a larger profile; an instance profile whose
  p95 busy share and memory would fit a smaller profile is split into smaller instances (not on mig-time-slicing
  pools, whose replicas per instance stay as they are); every proposed layout passes gpushare.mig.check_layout.
- whole GPUs: GPUs no workload needed at the p95 of allocation are GPUs that could be freed.
Nothing is applied: the proposal is a patch of the environment file (and new profile files) for review.

The stages, one module each: evidence (Prometheus -> PoolEvidence), recommendations (evidence -> Recommendation),
proposal (recommendations -> a reviewed patch), report (the whole run); beside them, workloads (per workload on
time-sliced and MPS pools, from the per-process exporter: who crowds a GPU, replicas per GPU by peaks; no patch)."""

from __future__ import annotations

# What the CLI, tests and benchmarks import from gpushare.ops.capacity.
from gpushare.ops.capacity.evidence import MigEvidence, PoolEvidence, _window_queries, collect_evidence
from gpushare.ops.capacity.proposal import propose, relieves
from gpushare.ops.capacity.recommendations import GIB, Recommendation, recommend
from gpushare.ops.capacity.report import SOURCES, CapacityReport, _check_options, run_capacity
from gpushare.ops.patch import Proposal

__all__ = ["GIB", "SOURCES", "CapacityReport", "MigEvidence", "PoolEvidence", "Proposal", "Recommendation",
           "_check_options", "_window_queries", "collect_evidence", "propose", "recommend", "relieves",
           "run_capacity"]
