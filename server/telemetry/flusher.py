"""A daemon thread per process that calls a flush function at a fixed interval (workers' buffered writes)."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger("forkserve.flusher")


class Flusher:
    """Calls `flush` every `interval_s` from a thread started on first use in each process, and at exit.

    The exit call catches what request threads added after the worker_exit hook flushed (gthread
    stops waiting for them after graceful_timeout); it runs once Python has joined its threads.
    """

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
        atexit.register(self._flush_safely)

    def _run(self) -> None:
        """Thread body: a failing flush is logged and retried next interval, never ends the thread."""
        while True:
            time.sleep(self.interval_s)
            self._flush_safely()

    def _flush_safely(self) -> None:
        """One flush; an error is logged, not raised."""
        try:
            self._flush()
        except Exception:  # NOTE: a dead flusher would let the buffer grow for the worker's life
            log.exception("%s: flush failed", self.name)
