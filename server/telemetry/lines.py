"""Log lines limited per second, for what can happen on every request (runs in workers; no TensorFlow)."""

from __future__ import annotations

import threading
import time


class LineLimit:
    """At most `per_second` log lines a second; the rest are counted and reported with the next line let through.

    NOTE: under overload every request is slow; one synchronous line each would add to the overload.
    """

    def __init__(self, per_second: int) -> None:
        self.per_second = per_second
        self._lock = threading.Lock()
        self._second = 0
        self._lines = 0
        self._suppressed = 0

    def admit(self) -> int | None:
        """None: do not log; else log, after reporting this many suppressed lines (0: none)."""
        second = int(time.monotonic())
        with self._lock:
            if second != self._second:
                self._second, self._lines = second, 0
            if self._lines >= self.per_second:
                self._suppressed += 1
                return None
            self._lines += 1
            suppressed, self._suppressed = self._suppressed, 0
            return suppressed
