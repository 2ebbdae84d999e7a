"""How long the request a request thread is taking up waited for that thread (gthread's pool queue).

Set in ForkserveWorker.handle (request thread, before gunicorn parses the request) and taken by
server.telemetry.measure.begin on the same thread: the wait counts as the request's `thread_wait`
stage and in its end-to-end time. No imports beyond the standard library: the master loads the
worker class, and with it this module.
"""

from __future__ import annotations

import contextvars

_THREAD_WAIT: contextvars.ContextVar[float] = contextvars.ContextVar("forkserve_thread_wait", default=0.0)


def set_thread_wait(seconds: float) -> None:
    """Request thread, taking up a connection: how long it waited in the pool's queue."""
    _THREAD_WAIT.set(seconds)


def take_thread_wait() -> float:
    """The wait of the request this thread handles, once (0.0 after the first call)."""
    seconds = _THREAD_WAIT.get()
    if seconds:
        _THREAD_WAIT.set(0.0)
    return seconds
