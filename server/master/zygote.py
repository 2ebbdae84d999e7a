"""The master's side of the zygote: start it, ask it for workers, notice its faults and fork workers itself meanwhile.

Runs in the gunicorn master (no TensorFlow: the zygote process, server.spawn.zygote, imports it).
`install` replaces the arbiter's `spawn_worker` on the instance, as when_ready already replaces
`reap_workers` and `handle_hup`: gunicorn's `Application.run` builds a plain `Arbiter`, so a
subclass would need forkserve's own entry point instead of the `gunicorn -c gunicorn.conf.py`
every deployment runs. The master is a child subreaper, so a worker the zygote double-forked is
the master's child: gunicorn reaps, heartbeats, signals and times it out like one it forked.
Every method but `renew` runs in the master's main thread, the thread that forks.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import select
import signal
import socket
import threading
import time
from typing import Any, Callable

from server.spawn.boot import run_worker

log = logging.getLogger("forkserve.zygote")

PR_SET_CHILD_SUBREAPER = 36
START_TIMEOUT = 120.0  # seconds the zygote has to import everything (about 5 here; far more on a machine under load)
FORK_TIMEOUT = 10.0  # seconds the zygote has to answer a fork request (a few milliseconds here)
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0
MAX_MESSAGE = 64 * 1024

OFF, STARTING, READY, WAITING = "off", "starting", "ready", "waiting"  # WAITING: failed, restarts at retry_at


def become_subreaper() -> bool:
    """Make this process (the master) adopt orphaned descendants: the workers whose first parent exits at once."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class Zygote:
    """One zygote process at a time, its channel and its faults, from the master."""

    def __init__(self, arbiter: Any, modules: tuple[str, ...], environment: dict[str, str],
                 start_timeout: float = START_TIMEOUT, fork_timeout: float = FORK_TIMEOUT,
                 entry: Callable[..., Any] | None = None, record: Callable[[str, str], None] | None = None) -> None:
        self.arbiter = arbiter
        self.modules = modules
        self.environment = environment
        self.start_timeout = start_timeout
        self.fork_timeout = fork_timeout
        self._entry = entry  # the zygote's life in the forked process (tests give a fake one)
        self.record = record or (lambda event, detail: None)  # metrics: ("fork", "zygote"|"master"), ("fault", kind)
        self.pid = 0
        self.state = OFF
        self.starts = 0  # zygotes that became ready, ever
        self.failures = 0  # consecutive faults since the last ready zygote
        self.retry_at = 0.0
        self._channel: socket.socket | None = None
        self._started_at = 0.0
        self._changed = threading.Condition()
        self._renew_wanted = 0  # renew() calls; the main thread restarts the zygote when it lags behind
        self._renewed = 0

    # --- main thread ---

    def start(self) -> None:
        """Fork a new zygote from the master; it reports ready (or why not) over the channel."""
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        master = os.getpid()
        try:
            pid = os.fork()
        except OSError as exc:
            parent_end.close()
            child_end.close()
            self._fault("fork_failed", f"cannot fork it: {exc}")
            return
        if pid == 0:
            try:
                parent_end.close()
                entry = self._entry or _default_entry
                entry(self.arbiter, child_end, master, self.modules, self.environment)
            finally:
                os._exit(1)
        child_end.close()
        self.pid, self._channel, self._started_at = pid, parent_end, time.monotonic()
        self._set_state(STARTING)

    def tend(self) -> None:
        """Each pass of the master's loop: take a renewal, notice a ready or dead zygote, restart one after its backoff."""
        with self._changed:
            renew = self._renew_wanted != self._renewed
            self._renewed = self._renew_wanted
        if renew:
            self.stop()
            self.failures, self.retry_at = 0, 0.0
            self.start()
            return
        if self.state == STARTING:
            self._take_report(0.0)
        elif self.state == READY:
            self._check_alive()
        elif self.state == WAITING and time.monotonic() >= self.retry_at:
            self.start()

    def wait_ready(self, timeout: float, interrupted: Callable[[], bool]) -> bool:
        """While it starts: wait for its report up to `timeout` or until `interrupted()` (a signal for the master)."""
        deadline = time.monotonic() + timeout
        while self.state == STARTING and not interrupted() and time.monotonic() < deadline:
            self._take_report(min(0.1, max(0.0, deadline - time.monotonic())))
        return self.state == READY

    def fork(self, worker: Any, take: Callable[[int], None]) -> int | None:
        """Ask the zygote for `worker`; `take(pid)` registers it before it may run. None: fork it yourself."""
        if self.state != READY or self._channel is None:
            return None
        self._check_alive()
        if self.state != READY or self._channel is None:
            return None
        go_read, go_write = os.pipe()
        try:
            request = {"age": worker.age, "slot": getattr(worker, "forkserve_slot", None),
                       "cpus": sorted(worker.forkserve_cpus) if getattr(worker, "forkserve_cpus", None) else None}
            try:
                socket.send_fds(self._channel, [json.dumps(request).encode()], [worker.tmp.fileno(), go_read])
            except OSError as exc:
                self._fault("exited", f"its channel failed: {exc}")
                return None
            os.close(go_read)
            go_read = -1
            answer = self._receive(self.fork_timeout)
            if answer is None:
                if self.state == READY:  # else it closed the channel: _receive counted that fault
                    self._fault("fork_timeout", f"no answer to a fork request in {self.fork_timeout:g} s")
                return None  # NOTE: go_write closes unwritten: a worker it forked late exits before it serves
            pid = answer.get("pid")
            if not isinstance(pid, int) or pid <= 0:
                log.warning("forkserve: the zygote could not fork a worker (%s); the master forks it", answer.get("error"))
                return None
            take(pid)
            try:
                os.write(go_write, b"1")
            except OSError:
                pass  # NOTE: it died waiting (OOM, a SIGTERM to the whole group): registered, so gunicorn reaps it
            self.record("fork", "zygote")
            return pid
        finally:
            os.close(go_write)
            if go_read != -1:
                os.close(go_read)

    def reap(self) -> None:
        """Before gunicorn's waitpid(-1): collect the zygote's exit, so gunicorn never takes it for a worker."""
        if not self.pid:
            return
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = self.pid, -1
        if pid:
            self.pid = 0  # NOTE: before the fault's stop(): a reaped pid may already be another process's
            if self.state == STARTING:
                self._take_report(0.0)  # its last word (why it could not import) is still in the channel
            if self.state in (STARTING, READY):
                self._fault("exited", _describe_status(status), pid)

    def stop(self) -> None:
        """Stop the zygote now (the master is stopping, or renewing it); the workers it forked are not touched."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self.pid and self._still_ours(self.pid):
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        self.pid = 0
        self._set_state(OFF)

    @staticmethod
    def _still_ours(pid: int) -> bool:
        """Whether `pid` is still our unreaped child (alive or a zombie): waitid without reaping it."""
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # gunicorn's waitpid(-1) reaped it: the pid may be another process's by now
            return False
        return True

    def close_in_child(self) -> None:
        """In a worker the master forks itself: drop the zygote's channel."""
        if self._channel is not None:
            self._channel.close()

    # --- any thread ---

    def renew(self, timeout: float) -> bool:
        """A new zygote, with the code and files on disk now, before the next workers fork (HUP, reload, new TLS files)."""
        with self._changed:
            self._renew_wanted += 1
            wanted, starts = self._renew_wanted, self.starts
        self.arbiter.wakeup()
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                taken = self._renewed >= wanted
                if taken and (self.starts > starts or self.state == WAITING):
                    return self.starts > starts
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(min(remaining, 1.0))

    # --- inside ---

    def _take_report(self, timeout: float) -> None:
        """Read the starting zygote's report: ready, or why it cannot be; give up past START_TIMEOUT."""
        answer = self._receive(timeout, eof_is_fault=True)
        if answer is not None:
            if answer.get("ready"):
                self.failures = 0
                with self._changed:
                    self.starts += 1
                log.info("forkserve: zygote %s ready in %.1f s (%s threads, %s objects frozen): workers fork from it",
                         self.pid, answer.get("seconds", 0.0), answer.get("threads"), answer.get("objects"))
                self._set_state(READY)
            else:
                self._fault("import_failed", str(answer.get("error")))
        elif self.state == STARTING and time.monotonic() - self._started_at > self.start_timeout:
            self._fault("start_timeout", f"not ready after {self.start_timeout:g} s")

    def _check_alive(self) -> None:
        """A ready zygote says nothing unasked: a readable channel means it closed (it died)."""
        if self._channel is None:
            return
        readable, _, _ = select.select([self._channel], [], [], 0)
        if readable:
            self._receive(0.0, eof_is_fault=True)

    def _receive(self, timeout: float, eof_is_fault: bool = False) -> dict[str, Any] | None:
        """One message from the zygote within `timeout`, or None (nothing yet, or it closed: then a fault)."""
        if self._channel is None:
            return None
        readable, _, _ = select.select([self._channel], [], [], timeout)
        if not readable:
            return None
        try:
            data = self._channel.recv(MAX_MESSAGE)
        except OSError:
            data = b""
        if not data:
            if eof_is_fault or self.state != OFF:
                self._fault("exited", "it exited")
            return None
        try:
            message = json.loads(data)
        except ValueError:
            message = None
        return message if isinstance(message, dict) else {"error": "an unreadable answer"}

    def _fault(self, kind: str, what: str, pid: int = 0) -> None:
        """Log the first fault of a run of them, stop this zygote, and restart it after a backoff."""
        pid = pid or self.pid
        if kind == "exited" and pid and pid == self.pid:  # not reaped yet: how did it end?
            what = self._exit_status(pid) or what
        self.stop()
        self.failures += 1
        delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (self.failures - 1))
        self.retry_at = time.monotonic() + delay
        self.record("fault", kind)
        if self.failures == 1:
            log.warning("forkserve: the zygote (pid %s) failed: %s; the master forks workers itself meanwhile, "
                        "and restarts the zygote in %g s", pid or "-", what, delay)
        else:
            log.debug("forkserve: the zygote failed again (%d in a row): %s; next try in %g s", self.failures, what, delay)
        self._set_state(WAITING)

    def _exit_status(self, pid: int) -> str | None:
        """How the zygote that closed its channel ended, once it has (it may still be on its way out)."""
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # gunicorn's waitpid(-1) took it: never signal that pid again
                self.pid = 0
                return None
            if done:
                self.pid = 0
                return _describe_status(status)
            time.sleep(0.01)
        return None

    def _set_state(self, state: str) -> None:
        with self._changed:
            self.state = state
            self._changed.notify_all()


def _default_entry(*args: Any) -> None:
    from server.spawn import zygote

    zygote.serve(*args)


def _describe_status(status: int) -> str:
    if status < 0:
        return "it exited"
    if os.WIFSIGNALED(status):
        return f"it was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"it exited with status {os.WEXITSTATUS(status)}"


def install(arbiter: Any, zygote: Zygote) -> None:
    """Route the arbiter's worker forks through `zygote`, falling back to the master's own fork."""
    manage_workers = arbiter.manage_workers

    def spawn_worker() -> int:
        """gunicorn's spawn_worker, with the fork asked of the zygote when it is ready."""
        arbiter.worker_age += 1
        worker = arbiter.worker_class(arbiter.worker_age, arbiter.pid, arbiter.LISTENERS, arbiter.app,
                                      arbiter.timeout / 2.0, arbiter.cfg, arbiter.log)
        arbiter.cfg.pre_fork(arbiter, worker)
        if zygote.state == STARTING and not arbiter.WORKERS:  # nothing serves yet: a template is worth the wait
            zygote.wait_ready(zygote.start_timeout, interrupted=lambda: not arbiter.SIG_QUEUE.empty())

        def take(pid: int) -> None:
            worker.pid = pid
            arbiter.WORKERS[pid] = worker

        pid = zygote.fork(worker, take)
        if pid is None:
            pid = os.fork()
            if pid == 0:
                for sibling in arbiter.WORKERS.values():
                    sibling.tmp.close()  # as gunicorn: no worker holds another's heartbeat file
                zygote.close_in_child()
                run_worker(arbiter, worker)
            take(pid)
            zygote.record("fork", "master")
        stats = getattr(arbiter, "_stats", None)
        if isinstance(stats, dict) and "workers_spawned" in stats:
            stats["workers_spawned"] += 1
        return pid

    def manage() -> None:
        zygote.tend()
        manage_workers()

    stop = arbiter.stop

    def stop_zygote_first(graceful: bool = True) -> None:
        # NOTE: the zygote holds the listening sockets it hands to workers: while it lives they stay open after
        # gunicorn closed the master's and the workers closed theirs, and each connection queued meanwhile is reset.
        zygote.stop()
        stop(graceful)

    reap = arbiter.reap_workers

    def reap_workers() -> None:
        zygote.reap()  # NOTE: before gunicorn's waitpid(-1), which would take the zygote for an unknown child
        reap()

    arbiter.spawn_worker = spawn_worker
    arbiter.manage_workers = manage
    arbiter.stop = stop_zygote_first
    arbiter.reap_workers = reap_workers
