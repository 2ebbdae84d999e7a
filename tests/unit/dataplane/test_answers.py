"""A failed request's answer: unexpected errors' tracebacks are rate-limited on every transport."""

from __future__ import annotations

import logging

import pytest

from server.dataplane import answers
from server.dataplane.answers import log_unexpected
from server.telemetry import lines
from server.telemetry.lines import LineLimit


def test_unexpected_error_tracebacks_are_rate_limited_and_the_rest_counted(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]
    monkeypatch.setattr(lines.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(answers, "TRACEBACK_LOG_LIMIT", LineLimit(per_second=1))
    logger = logging.getLogger("forkserve.test")

    def fail(request_id: str) -> None:
        try:
            raise ValueError("a bug")
        except ValueError:
            log_unexpected(logger, request_id)

    with caplog.at_level(logging.WARNING):
        for number in range(50):
            fail(f"r{number}")
        now[0] += 1.0
        fail("r50")
    tracebacks = [record for record in caplog.records if record.exc_info]
    assert [record.getMessage() for record in tracebacks] == ["request r0: unexpected error", "request r50: unexpected error"]
    assert "49 more unexpected errors were not logged" in caplog.text
