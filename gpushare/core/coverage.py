"""Coverage of a window by a series read every `step`: the stretches with no sample (gaps, with their dates and
lengths), and durations printed in the unit that reads best. Shared by capacity's node evidence and promotion's
health gates, so both name a gap the same way."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

STEP_SLACK = 1e-6  # seconds: float steps may land the last evaluation time this little past `end`


def duration_text(seconds: float) -> str:
    """Seconds, minutes, hours or days, whichever reads best ("40 min", "2 d"; never "0.0 d")."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            value = seconds / size
            return f"{value:.0f} {unit}" if abs(value - round(value)) < 0.05 else f"{value:.1f} {unit}"
    return f"{seconds:.0f} s"


def utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


@dataclass(frozen=True)
class Gap:
    """[start, end] without a sample. A missing step means no sample in the step before it, so a gap begins one
    step before its first missing step."""

    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def text(self) -> str:
        return f"no data {utc(self.start)} to {utc(self.end)} ({duration_text(self.seconds)})"

    def as_dict(self) -> dict[str, Any]:
        iso = "%Y-%m-%dT%H:%M:%SZ"
        return {"from": time.strftime(iso, time.gmtime(self.start)), "to": time.strftime(iso, time.gmtime(self.end)),
                "seconds": round(self.seconds)}


def coverage_gaps(present: list[float], start: float, end: float, step: int) -> list[Gap]:
    """The stretches of [start, end] (evaluated every `step`) with no sample at `present`'s times."""
    seen = {round(t) for t in present}
    gaps: list[Gap] = []
    run_start: float | None = None
    t = start
    while t <= end + STEP_SLACK:
        if round(t) not in seen and run_start is None:
            run_start = t
        elif round(t) in seen and run_start is not None:
            gaps.append(Gap(run_start - step, t - step))
            run_start = None
        t += step
    if run_start is not None:
        gaps.append(Gap(run_start - step, end))
    return gaps


def gaps_text(gaps: list[Gap], shown: int = 5) -> str:
    """The first `shown` gaps, and how many more."""
    more = f" and {len(gaps) - shown} more gaps" if len(gaps) > shown else ""
    return "; ".join(g.text() for g in gaps[:shown]) + more
