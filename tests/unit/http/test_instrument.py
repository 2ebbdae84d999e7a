"""The slow-request log's line limit: a burst of slow requests cannot flood the log."""

from __future__ import annotations

import pytest

from server.http import instrument
from server.telemetry.lines import LineLimit


def test_lines_beyond_the_limit_are_counted_and_reported_with_the_next_line(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.2]
    monkeypatch.setattr(instrument.time, "monotonic", lambda: now[0])
    limit = LineLimit(per_second=3)
    assert [limit.admit() for _ in range(5)] == [0, 0, 0, None, None]
    now[0] = 101.0
    assert limit.admit() == 2  # the next second's first line says how many were dropped
    assert limit.admit() == 0
