"""gunicorn's gthread worker, with the signal and response-writing changes forkserve needs (runs in workers; no TensorFlow).

gunicorn.conf.py names it as `worker_class`. The master only loads the class.
"""

from __future__ import annotations

import signal
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

from server import compat


class ForkserveWorker(ThreadWorker):
    """ThreadWorker that leaves Ctrl-C to the master, quits once and answers in one write."""

    _quitting = False

    def init_process(self) -> None:
        """Send each response in one write, then run gunicorn's worker (this call returns only at exit)."""
        compat.send_responses_in_one_write()
        super().init_process()

    def init_signals(self) -> None:
        """gunicorn's handlers, except SIGINT, which this worker ignores.

        NOTE: Ctrl-C in a terminal sends SIGINT to every process of the foreground group; the
        master answers it by sending each worker SIGQUIT. A worker that also handled the SIGINT
        ran gthread's quit handler twice, and the second call deadlocked inside the first one's
        ThreadPoolExecutor.shutdown (seen: a 30 s hang, then SIGKILL, in 3 of 8 Ctrl-Cs).
        """
        super().init_signals()
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    def handle_quit(self, sig: int, frame: Any) -> None:
        """SIGQUIT: quit now, once (a second signal during the first quit is ignored)."""
        if self._quitting:
            return
        self._quitting = True
        super().handle_quit(sig, frame)
