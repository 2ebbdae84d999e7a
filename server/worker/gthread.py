"""gunicorn's gthread worker, with the signal, response-writing, closing and stopping changes forkserve needs.

Runs in workers; no TensorFlow. gunicorn.conf.py names it as `worker_class`. The master only
loads the class. What it changes in gthread (each listed in server/compat.py): closes off the main
thread, bounded, reading what the client still sends (an unread body) so that the close is no
reset; connections spread over workers (server.connection_board); and on a stop, the backlog
taken and the listening sockets closed at once.
"""

from __future__ import annotations

import functools
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

from server import compat, connection_board, control
from server.telemetry import arrival

CLOSER_THREADS = 8
LINGERING_LIMIT = 64  # lingering closes at once, queued or running; beyond it a connection is closed at once
LINGER_SECONDS = 5.0  # a lingering close reads what the client still sends for at most this long ...
LINGER_MAX_BYTES = 64 * 1024 * 1024  # ... and at most this much (twice nginx's shipped client_max_body_size)
ACCEPT_AT_STOP = 1024  # connections a stopping worker takes from the backlog, at most


def close_lingering(sock: socket.socket, seconds: float = LINGER_SECONDS, max_bytes: int = LINGER_MAX_BYTES) -> str:
    """Half-close an answered connection, read and discard what the client still sends until it closes, then close.

    Returns how it went: "lingered" (the client closed or reset first) or "cut_short" (time or bytes ran out).
    NOTE: closing a socket that holds unread bytes sends a reset, and a peer that has not read its answer
    yet loses it. nginx still sending a body the worker had answered 413 without reading reported 502.
    """
    buffer = bytearray(65536)
    deadline = time.monotonic() + seconds
    drained = 0
    try:
        while drained < max_bytes:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "cut_short"
            sock.settimeout(remaining)
            received = sock.recv_into(buffer)
            if not received:
                return "lingered"
            drained += received
        return "cut_short"
    except TimeoutError:
        return "cut_short"
    except OSError:
        return "lingered"
    finally:
        try:
            sock.close()
        except OSError:
            pass


def count_close(how: str) -> None:
    """One connection close in forkserve_connection_closes_total (worker only: imports the metrics)."""
    from server.telemetry import metrics

    metrics.record(lambda: metrics.CONNECTION_CLOSES.labels(how).inc())


class ForkserveWorker(ThreadWorker):
    """ThreadWorker that leaves Ctrl-C to the master, quits once, answers in one write and closes off its loop."""

    _quitting = False
    forkserve_slot: int | None = None  # on the connection board, given by the master (pre_fork)
    _configured_connections = 1000
    _configured_keepalived = 1000
    _closer: ThreadPoolExecutor | None = None
    _lingering = 0  # lingering closes queued or running
    _lingering_changed: threading.Condition | None = None
    _listening = True
    forkserve_grpc: Any = None  # this worker's server.rpc.listener.GrpcListener, once its models are warm

    def init_process(self) -> None:
        """Send each response in one write, then run gunicorn's worker (this call returns only at exit)."""
        compat.send_responses_in_one_write()
        if compat.verified("gunicorn"):
            self._closer = ThreadPoolExecutor(max_workers=CLOSER_THREADS, thread_name_prefix="forkserve-closer")
            self._lingering_changed = threading.Condition()
        super().init_process()

    def enqueue_req(self, conn: Any) -> None:
        """Main thread: gthread's, stamped with the moment the request waits for a request thread."""
        conn.forkserve_enqueued = time.perf_counter()
        super().enqueue_req(conn)

    def handle(self, conn: Any) -> Any:
        """Request thread: gthread's, after noting how long the connection waited for this thread (server.telemetry.arrival)."""
        enqueued = getattr(conn, "forkserve_enqueued", None)
        arrival.set_thread_wait(time.perf_counter() - enqueued if enqueued is not None else 0.0)
        return super().handle(conn)

    def finish_request(self, conn: Any, fs: Any) -> None:
        """Main thread, after each request: gthread's, with the graceful close of a finished connection off this thread.

        NOTE: gunicorn 27 closes a `Connection: close` connection on the main thread and lingers up
        to 2 s for the client's FIN; meanwhile the worker accepted nothing and its keep-alive
        clients' next requests waited (measured: bench/results/code-notes.md#graceful-close). Balancing closes connections on purpose.
        """
        if self._closer is not None and "close" not in vars(conn):
            conn.close = functools.partial(self._close_off_the_loop, conn, conn.close)
        super().finish_request(conn, fs)

    def _close_off_the_loop(self, conn: Any, close: Any, graceful: bool = False) -> None:
        """Main thread: a graceful close sends its FIN now and lingers on a closer thread; past the limit, closes at once."""
        changed = self._lingering_changed
        if not graceful or self._closer is None or changed is None:
            close(graceful=graceful)
            return
        with changed:
            full = self._lingering >= LINGERING_LIMIT  # NOTE: each holds a descriptor, and a thread while it runs
            if not full:
                self._lingering += 1
        if full:
            close(graceful=False)
            count_close("at_once")
            return
        try:
            conn.sock.setblocking(True)
            conn.sock.shutdown(socket.SHUT_WR)  # the client sees the end of the answers at once, even while queued
            self._closer.submit(self._linger, conn.sock)
        except (OSError, RuntimeError):  # the client reset it already, or the pool is shut down (exiting)
            self._lingered()
            close(graceful=False)

    def _linger(self, sock: socket.socket) -> None:
        """Closer thread: one lingering close, counted."""
        try:
            how = close_lingering(sock)
        finally:
            self._lingered()
        count_close(how)

    def _lingered(self) -> None:
        assert self._lingering_changed is not None
        with self._lingering_changed:
            self._lingering -= 1
            self._lingering_changed.notify_all()

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
        self._stop_grpc(grace=0)
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
        """Count in the share from the moment this worker accepts (not while it loads); at the end, finish the closes."""
        board = self._board()
        if board is not None:
            board.publish(self.forkserve_slot, 0)
        super().run()
        if self.forkserve_grpc is not None:  # gthread has waited for its own requests; now the RPCs still running
            self._stop_grpc(grace=self.cfg.graceful_timeout).wait(self.cfg.graceful_timeout)
        if self._lingering_changed is not None:  # NOTE: the worker leaves by os._exit (worker_exit), resetting what still lingers
            with self._lingering_changed:
                self._lingering_changed.wait_for(lambda: self._lingering == 0, timeout=LINGER_SECONDS)

    def set_accept_enabled(self, enabled: bool) -> None:
        """gthread's; once the worker stops for good, it also takes its backlog and closes its listening sockets."""
        super().set_accept_enabled(enabled)
        if not enabled and not self.alive and self._listening and compat.verified("gunicorn"):
            self._listening = False
            self._stop_listening()
        if not enabled and not self.alive:
            control.STOPPED_ACCEPTING.set()  # a load or unload call held here may answer now

    def _stop_listening(self) -> None:
        """Main thread, stopping: accept what already waits in the backlog (answered, then closed), then close the listeners.

        NOTE: gthread kept its listening sockets open until its last request was done. When the
        whole server stops (the master closed its copies first), the kernel kept completing new
        connections into a backlog nobody accepted, and reset each of them, request sent, when the
        last worker exited: clients that reconnected after a `Connection: close` got resets instead
        of a refused connection, which they can retry. A retiring worker closes only its copy of
        the socket: the others keep accepting from it.
        """
        for listener in self.sockets:
            listener.setblocking(False)
            for _ in range(ACCEPT_AT_STOP):
                before = self.nr_conns
                self.accept(listener)  # gthread's: counts the connection and hands it to a request thread
                if self.nr_conns == before:  # EAGAIN: the backlog is empty
                    break
            listener.close()

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
        """A request thread closes its connection after the answer at this many kept alive: 0 above the bound.

        NOTE: 0 closes every connection answered while this worker holds more than the bound, not
        only as many as the excess: the extra reconnects leave the workers nearer an even split
        (measured in docs/performance.md).
        """
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
        self._stop_grpc(grace=self.cfg.graceful_timeout)
        super().handle_exit(sig, frame)

    def _stop_grpc(self, grace: float) -> Any:
        """Stop the gRPC listener: new connections go to the other workers, this one's get GOAWAY (server.rpc.listener)."""
        if self.forkserve_grpc is None:
            done = threading.Event()
            done.set()
            return done
        return self.forkserve_grpc.stop(grace)

    def _leave_board(self) -> None:
        board = connection_board.BOARD
        if board is not None and self.forkserve_slot is not None:
            board.release(self.forkserve_slot)
