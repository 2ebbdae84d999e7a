"""A one-shot reply slot between a request thread and an executor thread.

Lighter than concurrent.futures.Future on the hot path (measured: Future.set_result's
Condition.notify_all was a tenth of a worker's GIL time): two plain locks, no condition, no
callbacks. The same method names as Future, for the part of its API forkserve uses.
"""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as ReplyTimeout
from typing import Any

__all__ = ["Reply", "ReplyTimeout"]


class Reply:
    """Set once by the executor, read once by the request thread that submitted the job."""

    __slots__ = ("_claim", "_done", "_value", "_error", "_cancelled")

    def __init__(self) -> None:
        self._claim = threading.Lock()  # taken by whoever acts first: the executor (run) or cancel
        self._done = threading.Lock()
        self._done.acquire()  # released once the value or the error is there
        self._value: Any = None
        self._error: BaseException | None = None
        self._cancelled = False

    def set_running_or_notify_cancel(self) -> bool:
        """Executor: claim the job; False when the requester cancelled it first."""
        return self._claim.acquire(blocking=False)

    def cancel(self) -> bool:
        """Requester: give up on a job that has not started; False when it already runs."""
        if not self._claim.acquire(blocking=False):
            return False
        self._cancelled = True
        self._done.release()
        return True

    def cancelled(self) -> bool:
        """True when the requester cancelled the job before it ran."""
        return self._cancelled

    def done(self) -> bool:
        """True once a value, an error or a cancellation is there."""
        return not self._done.locked()

    def set_result(self, value: Any) -> None:
        """Executor: hand over the value."""
        self._value = value
        self._done.release()

    def set_exception(self, error: BaseException) -> None:
        """Executor: hand over the failure."""
        self._error = error
        self._done.release()

    def result(self, timeout: float | None = None) -> Any:
        """Requester: wait for the value (ReplyTimeout after `timeout` seconds)."""
        if not self._done.acquire(timeout=-1 if timeout is None else timeout):
            raise ReplyTimeout()
        self._done.release()  # later calls return at once
        if self._cancelled:
            raise CancelledError()
        if self._error is not None:
            raise self._error
        return self._value
