"""Numerical tolerances that several stages of the solve, and the planner around it, share (each stage's own limits
live with it)."""

from __future__ import annotations

# LP values within this of a whole number (zero included) count as that number: HiGHS's solutions carry round-off.
INTEGRALITY = 1e-9
# A lower bound read off a floating-point LP is lowered by this share of itself (at least this much) before it counts.
BOUND_MARGIN = 1e-6
COST_SLACK = 1e-9  # objectives are float sums of costs: one beats (or meets) another only beyond this
