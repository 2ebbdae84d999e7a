"""Worker hooks that can be checked without a worker: the exit code a worker leaves with."""

from __future__ import annotations

from server.worker.hooks import exit_code


def test_the_exit_code_in_flight_is_kept() -> None:
    assert exit_code(SystemExit(0)) == 0 and exit_code(SystemExit(None)) == 0
    assert exit_code(SystemExit(3)) == 3  # gunicorn's boot error: the master must still see it
    assert exit_code(SystemExit("message")) == 1
    assert exit_code(RuntimeError("boom")) == 1 and exit_code(None) == 0
