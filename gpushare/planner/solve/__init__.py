"""Solving the packing with HiGHS: two LP lower bounds, integer plans from rounding them (and a MIP over the
generated columns on small inputs), and a local search that empties GPUs.

The configuration LP has two levels, which together are exactly the LP over whole-GPU patterns:
    min  sum_g cost_g x_g
    s.t. sum_f a_if y_f >= d_i                          for every item type i          (dual pi_i)
         sum_g n_gu x_g - sum_{f on u} y_f >= 0         for every unit kind u          (dual theta_u)
         sum_{g of model t} x_g <= N_t                  for every model with a count   (dual mu_t)
         sum_g (rho units_g - advertised_g) x_g >= 0    with --env                     (dual sigma)
x_g counts GPUs made into configuration g (all enumerated; every MIG layout passed the exact check) and y_f counts
units of kind u filled with the multiset f of replicas. Fill columns are priced: for an exclusive unit the best
replica, for MPS the best `replicas` ones, for time-slicing a three-row knapsack (memory, compute, replica slots),
greedily while generating; for the bound by enumeration or a HiGHS MIP (its dual bound), to PRICING_GAP.

Bounds valid whether or not generation converged, from the duals of any round that was priced exactly (V_u: an
upper bound on the best fill of kind u):
- Farley: raise theta_u to max(theta_u, V_u) (every fill is then dual feasible) and scale all duals down until
  every configuration is dual feasible again; the dual objective sum_i d_i pi_i - sum_t N_t mu_t, scaled, bounds.
- Lagrangian: sum_i d_i pi_i - sum_t N_t mu_t - sum_u U_u max(0, V_u - theta_u) - sum_g K_t max(0, -rc_g),
  K_t bounding the GPUs of model t in an optimal plan (from the plan found), U_u = K_t x most units u per GPU.
At convergence both are the LP optimum. A third, the compact LP (compact_bound), needs no generation at all.

The stages, one module each, each over the ones after it: run (the whole solve), local_search (concrete GPUs,
emptying lightly used ones), rounding (integer plans), bound (the compact LP) and pricing (fill columns against the
duals), master (the master LP and its row layout), data (the problem as arrays) and engine (HiGHS's settings and the
wall-clock guard), tuning (tolerances several stages share).
"""

from __future__ import annotations

# What the planner (pack, fleet), tests and benchmarks import from gpushare.planner.solve.
from gpushare.planner.solve.bound import Compact, compact_bound, size_entries, size_rows, unit_slots
from gpushare.planner.solve.data import Data, Fill
from gpushare.planner.solve.engine import Clock, highs
from gpushare.planner.solve.local_search import Gpu, Slot, empty_gpus, realise
from gpushare.planner.solve.master import Master, add_columns
from gpushare.planner.solve.pricing import Pricer, enumerate_fills
from gpushare.planner.solve.rounding import IntSolution, compact_plan, gpu_share, pack_kinds
from gpushare.planner.solve.run import (
    ENUMERATION_LIMIT,
    ENUMERATION_TYPES,
    Infeasible,
    Progress,
    SolveResult,
    solve,
)
from gpushare.planner.solve.tuning import BOUND_MARGIN, COST_SLACK

__all__ = ["BOUND_MARGIN", "COST_SLACK", "ENUMERATION_LIMIT", "ENUMERATION_TYPES", "Clock", "Compact", "Data", "Fill",
           "Gpu", "Infeasible", "IntSolution", "Master", "Pricer", "Progress", "Slot", "SolveResult", "add_columns",
           "compact_bound", "compact_plan", "empty_gpus", "enumerate_fills", "gpu_share", "highs", "pack_kinds",
           "realise", "size_entries", "size_rows", "solve", "unit_slots"]
