"""HiGHS as every stage runs it: a silent, deterministic instance per model, and the wall-clock guard."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

# Work limits instead of time limits, so that the same input gives the same plan on every run (HiGHS has no
# work limit of its own: one thread, a fixed seed, and node and leaf limits are counted the same every time).
SEED = 20  # HiGHS random_seed


_QUIET = False


def highs(nodes: int | None = None) -> Any:
    """A silent, deterministic HiGHS instance (one thread, a fixed seed, a node and leaf limit for MIPs). The first
    construction prints a banner on the C-level stdout, which would spoil `--json` output, so that one happens with
    file descriptor 1 pointed at /dev/null."""
    global _QUIET
    import highspy

    if not _QUIET:
        sys.stdout.flush()
        saved = os.dup(1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 1)
            h = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            os.close(devnull)
        _QUIET = True
    else:
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)  # parallel HiGHS is not reproducible run to run
    h.setOptionValue("random_seed", SEED)
    if nodes is not None:
        h.setOptionValue("mip_max_nodes", int(nodes))
        h.setOptionValue("mip_max_leaves", int(nodes))
    return h


class Clock:
    """A wall-clock guard only: phases end by work limits, so a run that never reaches the guard is reproducible;
    one that does is cut by time and says so (`cut`)."""

    def __init__(self, limit: float) -> None:
        self.start = time.monotonic()
        self.limit = limit
        self.cut = False

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def expired(self) -> bool:
        if self.elapsed() >= self.limit:
            self.cut = True
        return self.cut

    def run(self, h: Any) -> None:
        """Run HiGHS under what is left of the guard, noting whether the guard cut it."""
        h.setOptionValue("time_limit", float(max(0.05, self.limit - self.elapsed())))
        import highspy

        h.run()
        if h.getModelStatus() == highspy.HighsModelStatus.kTimeLimit:
            self.cut = True
