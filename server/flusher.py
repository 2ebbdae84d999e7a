"""A daemon thread per process that calls a flush function at a fixed interval (workers' buffered writes)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable


class Flusher:
    """Calls `flush` every `interval_s` from a thread started on first use in each process."""

    def __init__(self, name: str, flush: Callable[[], None], interval_s: float) -> None:
        self.name = name
        self.interval_s = interval_s
        self._flush = flush
        self._lock = threading.Lock()
        self._pid = 0  # the process whose thread runs; threads do not survive fork

    def ensure_started(self) -> None:
        """Start this process's thread unless it runs already (cheap when it does)."""
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid == os.getpid():
                return
            self._pid = os.getpid()
        threading.Thread(target=self._run, name=self.name, daemon=True).start()

    def _run(self) -> None:
        """Thread body."""
        while True:
            time.sleep(self.interval_s)
            self._flush()
