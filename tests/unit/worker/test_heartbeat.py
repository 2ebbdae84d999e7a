"""The load heartbeat: notifies while a worker loads, stops at the boot deadline."""

from __future__ import annotations

import time

from server.worker.heartbeat import Heartbeat


def test_notifies_while_loading_and_stops_when_done() -> None:
    beats: list[float] = []
    with Heartbeat(lambda: beats.append(time.monotonic()), interval_s=0.01, limit_s=10):
        time.sleep(0.2)
    count = len(beats)
    assert count >= 5  # one at the start, then about every 10 ms
    time.sleep(0.05)
    assert len(beats) == count


def test_stops_notifying_at_the_deadline_so_gunicorn_stops_a_stuck_load() -> None:
    beats: list[float] = []
    started = time.monotonic()
    with Heartbeat(lambda: beats.append(time.monotonic()), interval_s=0.01, limit_s=0.1):
        time.sleep(0.4)
    assert beats and max(beats) - started < 0.2
