"""server.rpc.listener's stop: never blocks the signal handler that calls it, even when a second stop comes inside the first."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

from server.rpc.listener import GrpcListener
from server.settings import Settings


class Registry:
    """What a listener that serves no shard reads of the registry."""

    models: dict[str, Any] = {}

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        return True, {}


def test_a_second_stop_inside_the_first_returns_at_once_and_the_stop_completes() -> None:
    """A signal handler's stop() that lands while the first stop() runs (here: inside its NOT_SERVING step).

    NOTE: the listener before grpc.aio took a non-reentrant lock in stop(); a second signal inside it waited
    for itself until the master's SIGKILL.
    """
    settings = replace(Settings.from_env(), grpc_bind="127.0.0.1:1", grpc_max_connection_age=0.0)
    listener = GrpcListener(Registry(), settings, None)  # type: ignore[arg-type]
    listener._thread.start()  # the loop, without binding any shard
    nested: list[tuple[threading.Event, float]] = []
    shutting_down = listener.health.enter_graceful_shutdown

    def second_signal_inside() -> None:
        started = time.monotonic()
        nested.append((listener.stop(5.0), time.monotonic() - started))
        shutting_down()

    listener.health.enter_graceful_shutdown = second_signal_inside  # type: ignore[method-assign]
    first = listener.stop(5.0)
    assert first.wait(5), "the stop never completed"
    [(event, seconds)] = nested
    assert event is first and seconds < 0.1
    assert listener.health.stopping
    assert listener.stop(5.0) is first and first.is_set()  # a later signal: the same, finished stop
    listener.loop.call_soon_threadsafe(listener.loop.stop)


def test_stop_before_start_is_finished_at_once() -> None:
    settings = replace(Settings.from_env(), grpc_bind="127.0.0.1:1")
    listener = GrpcListener(Registry(), settings, None)  # type: ignore[arg-type]
    assert listener.stop(5.0).is_set()
