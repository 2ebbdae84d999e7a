"""gunicorn's gthread worker, with the signal and response-writing changes forkserve needs (runs in workers; no TensorFlow).

gunicorn.conf.py names it as `worker_class`. The master only loads the class.
"""

from __future__ import annotations

import functools
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

from server import compat, connection_board


class ForkserveWorker(ThreadWorker):
    """ThreadWorker that leaves Ctrl-C to the master, quits once and answers in one write."""

    _quitting = False
    forkserve_slot: int | None = None  # on the connection board, given by the master (pre_fork)
    _configured_connections = 1000
    _configured_keepalived = 1000
    _closer: ThreadPoolExecutor | None = None

    def init_process(self) -> None:
        """Send each response in one write, then run gunicorn's worker (this call returns only at exit)."""
        compat.send_responses_in_one_write()
        if compat.verified("gunicorn"):
            self._closer = ThreadPoolExecutor(max_workers=4, thread_name_prefix="forkserve-closer")
        super().init_process()

    def finish_request(self, conn: Any, fs: Any) -> None:
        """Main thread, after each request: gthread's, with the graceful close of a finished connection off this thread.

        NOTE: gunicorn 27 closes a `Connection: close` connection on the main thread and lingers up
        to 2 s for the client's FIN; meanwhile the worker accepted nothing and its keep-alive
        clients' next requests waited (measured: 2002 ms). Balancing closes connections on purpose.
        """
        if self._closer is not None and "close" not in vars(conn):
            conn.close = functools.partial(self._close_off_the_loop, conn.close)
        super().finish_request(conn, fs)

    def _close_off_the_loop(self, close: Any, graceful: bool = False) -> None:
        """A graceful close runs on a closer thread; an abortive one at once."""
        if graceful and self._closer is not None:
            try:
                self._closer.submit(close, graceful=True)
                return
            except RuntimeError:  # the worker is exiting: the pool takes no more work
                pass
        close(graceful=graceful)

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
        self._leave_board()
        super().handle_quit(sig, frame)

    # --- keep-alive connections spread evenly over the workers (server.connection_board) ---
    # NOTE: gunicorn 27's gthread reads these two attributes where it decides to accept and to keep
    # a connection alive; as properties they follow the board (listed in server/compat.py).

    def _board(self) -> connection_board.ConnectionBoard | None:
        """The board, while this worker accepts and holds a slot on it."""
        board = connection_board.BOARD
        if board is None or self.forkserve_slot is None or not self.alive:
            return None
        return board

    def run(self) -> None:
        """Count in the share from the moment this worker accepts (not while it loads)."""
        board = self._board()
        if board is not None:
            board.publish(self.forkserve_slot, 0)
        super().run()

    @property
    def worker_connections(self) -> int:
        """gthread accepts while nr_conns is below this: its setting, capped at an even share."""
        board = self._board()
        if board is None:
            return self._configured_connections
        board.publish(self.forkserve_slot, self.nr_conns)  # NOTE: gthread's loop reads this once per pass
        return min(self._configured_connections, board.bound())

    @worker_connections.setter
    def worker_connections(self, value: int) -> None:
        self._configured_connections = value

    @property
    def max_keepalived(self) -> int:
        """A request thread closes its connection after the answer at this many kept alive: 0 above the share."""
        board = self._board()
        if board is not None and self.nr_conns > board.bound():
            return 0  # gthread answers with Connection: close; the client reconnects to another worker
        return self._configured_keepalived

    @max_keepalived.setter
    def max_keepalived(self, value: int) -> None:
        self._configured_keepalived = value

    def handle_exit(self, sig: int, frame: Any) -> None:
        """SIGTERM (graceful stop): out of the share at once, then gunicorn's handler."""
        self._leave_board()
        super().handle_exit(sig, frame)

    def _leave_board(self) -> None:
        board = connection_board.BOARD
        if board is not None and self.forkserve_slot is not None:
            board.release(self.forkserve_slot)
