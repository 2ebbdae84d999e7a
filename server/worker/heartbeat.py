"""A worker's heartbeat while it loads its models (runs in workers; no TensorFlow).

gunicorn's arbiter kills a worker that has not notified it for `timeout` seconds; gthread's
loop notifies only once the worker serves. Loading TensorFlow and the models takes longer than
that for real models, so a thread notifies for the whole load, up to FORKSERVE_BOOT_TIMEOUT;
after that it stops, and gunicorn's timeout stops a worker stuck in a load (a hung file system,
a FIFO) instead of leaving it hung for ever.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger("forkserve.heartbeat")


class Heartbeat:
    """Calls `notify` every `interval_s` until stopped or until `limit_s` has passed."""

    def __init__(self, notify: Callable[[], None], interval_s: float, limit_s: float) -> None:
        self._notify = notify
        self._interval_s = interval_s
        self._deadline = time.monotonic() + limit_s
        self._limit_s = limit_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="forkserve-boot-heartbeat", daemon=True)

    def __enter__(self) -> "Heartbeat":
        self._notify()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stopped.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            if time.monotonic() > self._deadline:
                log.error("forkserve: loading took longer than FORKSERVE_BOOT_TIMEOUT (%.0fs); no more heartbeats, "
                          "gunicorn's timeout will stop this worker", self._limit_s)
                return
            self._notify()
