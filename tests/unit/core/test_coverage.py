"""gpushare.core.coverage: durations and gaps in a window's data read as people write them (and the figures
`promote` prints beside them)."""

from __future__ import annotations


def test_durations_and_counts_read_as_people_write_them() -> None:
    from gpushare.core.coverage import coverage_gaps, duration_text, gaps_text
    from gpushare.ops.promote import _days, _num

    assert [duration_text(s) for s in (45, 2400, 5400, 7200, 172800)] == ["45 s", "40 min", "1.5 h", "2 h", "2 d"]
    assert _days(1800) == "30 min" and _days(7 * 86400) == "7.0 d"
    assert _num({"value": [0, "1.00024"]}) == "1" and _num({"value": [0, "2.97"]}) == "3"
    gaps = coverage_gaps([0, 3600, 7200, 5 * 3600], 0, 6 * 3600, 3600)
    assert [g.text() for g in gaps] == ["no data 1970-01-01 02:00 UTC to 1970-01-01 04:00 UTC (2 h)",
                                        "no data 1970-01-01 05:00 UTC to 1970-01-01 06:00 UTC (1 h)"]
    assert gaps[0].as_dict() == {"from": "1970-01-01T02:00:00Z", "to": "1970-01-01T04:00:00Z", "seconds": 7200}
    assert gaps_text(gaps, shown=1) == "no data 1970-01-01 02:00 UTC to 1970-01-01 04:00 UTC (2 h) and 1 more gaps"
    assert coverage_gaps([0, 3600], 0, 3600, 3600) == []
