"""The zygote process: imports what a worker imports once, then forks workers from that state on the master's request.

The master forks the zygote (server.master.zygote) and talks to it over one SOCK_SEQPACKET
socket. The zygote imports TensorFlow, Keras and forkserve's worker modules, runs no TensorFlow
op (no eager context, no thread pools: a TF runtime does not survive fork), freezes its heap
and then, for each request, double-forks: the worker's parent exits at once, so the worker is
reparented to the master (a child subreaper) and gunicorn reaps and signals it as its own.
Workers still load and warm their models after the fork.

Threads: after these imports the only threads besides the main one are OpenBLAS's
`blas_thread_server`s (numpy's and scipy's; none when OMP_NUM_THREADS is 1), idle in
pthread_cond_wait; OpenBLAS's own pthread_atfork handler stops them before a fork
(docs/design.md#the-zygote has the evidence). The zygote refuses to serve unless it is down to
its one thread after a first fork, so every worker is forked from a single-threaded process.
"""

from __future__ import annotations

import ctypes
import fcntl
import gc
import importlib
import json
import os
import random
import select
import signal
import socket
import stat
import sys
import threading
import time
from typing import Any, NoReturn

from server.spawn.boot import run_worker

# What every worker imports before it serves, heaviest first; the rest comes with server.http.app.
PRELOAD = ("numpy", "tensorflow", "keras", "server.http.app", "server.models.runtime", "server.models.registry")
GRPC_PRELOAD = ("grpc", "server.rpc.listener")
MAX_MESSAGE = 64 * 1024
GO_TIMEOUT = 30.0  # seconds a forked worker waits for the master to take it; past that it exits unseen
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
NAME = b"fs-zygote"  # its /proc/PID/comm, what ps and top show (the command line stays gunicorn's)


def serve(arbiter: Any, channel: socket.socket, master_pid: int, modules: tuple[str, ...], environment: dict[str, str]) -> NoReturn:
    """The zygote's life, in the process the master just forked; never returns."""
    global _WORKER_NAME
    try:
        _WORKER_NAME = _read_name()
        _become_zygote(arbiter, master_pid)
        # NOTE: before the imports (OpenMP, oneDNN and OpenBLAS read them once, at load); gunicorn's --env wins, as it
        # did when each worker set these in post_fork and init_process applied --env after them
        os.environ.update({k: v for k, v in environment.items() if k not in (arbiter.cfg.env or {})})
        started = time.monotonic()
        try:
            for name in modules:
                importlib.import_module(name)
        except BaseException as exc:  # NOTE: SystemExit from a module too: the master falls back, never stops
            _send(channel, {"error": f"cannot import {name}: {type(exc).__name__}: {exc}"})
            os._exit(1)
        if threading.active_count() != 1:
            names = sorted(t.name for t in threading.enumerate() if t is not threading.current_thread())
            _send(channel, {"error": f"a Python thread is alive after the imports ({', '.join(names)}): forking is unsafe"})
            os._exit(1)
        gc.collect()
        gc.freeze()  # NOTE: each worker's collections then skip the shared heap and leave its pages shared
        threads = _threads_at_fork()
        if threads != 1:
            _send(channel, {"error": f"{threads} threads are alive at fork (OpenBLAS's stop at fork; these did not): forking is unsafe"})
            os._exit(1)
        _send(channel, {"ready": True, "seconds": round(time.monotonic() - started, 3), "threads": threads,
                        "objects": gc.get_freeze_count()})
        _serve_forks(arbiter, channel)
    finally:
        os._exit(0)


def _threads_at_fork() -> int:
    """The threads left once every pthread_atfork handler ran: fork once, then count (the zygote itself runs no op).

    OpenBLAS's handler stops its thread servers before a fork and they start again only at the next
    BLAS call, which the zygote never makes: from here on every fork is from this one thread.
    """
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return len(os.listdir("/proc/self/task"))


def _become_zygote(arbiter: Any, master_pid: int) -> None:
    """Leave the master's signal handling and workers behind; die with the master."""
    util = _gunicorn_util()
    util._setproctitle("zygote [%s]" % arbiter.proc_name)
    _prctl(PR_SET_NAME, ctypes.c_char_p(NAME))
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # NOTE: and the closed channel ends it too
    if os.getppid() != master_pid:
        os._exit(0)
    for sig in (*arbiter.SIGNALS, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_IGN)  # NOTE: Ctrl-C reaches the whole group; the master stops the zygote itself
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the zygote waits for each intermediate child itself
    for worker in list(arbiter.WORKERS.values()):
        worker.tmp.close()  # the master's heartbeat files of workers alive now: no new worker may hold them
    arbiter.WORKERS = {}
    _close_files_being_read()


def _close_files_being_read() -> None:
    """Close the regular files open read-only at the fork: what the master's rollout thread was reading then.

    NOTE: a model file the scanner was digesting, say; held here (and by every worker forked from here) it
    would keep a deleted version's disk space for the zygote's life. Logs, the metric files and heartbeat
    files are open for writing, and sockets are not regular files: they stay.
    """
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
                os.close(fd)
        except OSError:
            continue  # the directory's own descriptor, already closed by the listing


def _prctl(option: int, value: Any) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _gunicorn_util() -> Any:
    from gunicorn import util

    return util


def _serve_forks(arbiter: Any, channel: socket.socket) -> None:
    """Answer fork requests until the master closes the channel."""
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(channel, MAX_MESSAGE, 2)
        except OSError:
            return
        if not data:
            return  # the master closed its end (it stopped us, or it died)
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            _send(channel, {"error": f"a fork request needs 2 descriptors, got {len(fds)}"})
            continue
        try:
            pid = _fork_worker(arbiter, channel, json.loads(data), fds[0], fds[1])
            _send(channel, {"pid": pid})
        except OSError as exc:  # EAGAIN, ENOMEM: the master forks this worker itself
            _send(channel, {"error": f"fork failed: {exc}"})
        finally:
            for fd in fds:
                _close(fd)


def _fork_worker(arbiter: Any, channel: socket.socket, request: dict[str, Any], heartbeat_fd: int, go_fd: int) -> int:
    """Double-fork one worker; returns its pid, once its first parent is gone and the master is its parent."""
    read_end, write_end = os.pipe()
    try:
        middle = os.fork()
        if middle == 0:
            try:
                os.close(read_end)
                worker_pid = os.fork()
                if worker_pid == 0:
                    os.close(write_end)
                    channel.close()
                    _become_worker(arbiter, request, heartbeat_fd, go_fd)
                os.write(write_end, worker_pid.to_bytes(8, "little"))
            finally:
                os._exit(0)
        os.close(write_end)
        write_end = -1
        answer = _read_exactly(read_end, 8)
        os.waitpid(middle, 0)  # NOTE: after this the worker's parent is the master (the kernel reparented it)
    finally:
        os.close(read_end)
        if write_end != -1:
            os.close(write_end)
    if len(answer) != 8:
        raise OSError("the intermediate process died before it forked the worker")
    return int.from_bytes(answer, "little")


def _become_worker(arbiter: Any, request: dict[str, Any], heartbeat_fd: int, go_fd: int) -> NoReturn:
    """The new worker: wait until the master has taken it, then boot as gunicorn's spawn_worker would."""
    ready, _, _ = select.select([go_fd], [], [], GO_TIMEOUT)
    go = os.read(go_fd, 1) if ready else b""
    os.close(go_fd)
    if go != b"1":
        os._exit(0)  # the master gave up on this fork: never serve unseen by it
    _prctl(PR_SET_NAME, ctypes.c_char_p(_WORKER_NAME))
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()  # NOTE: else every worker draws the zygote's sequence (gunicorn reseeds `random` itself)
    try:
        random.seed()  # NOTE: before Worker.__init__ draws max_requests' jitter: else every worker draws the zygote's
        worker = arbiter.worker_class(request["age"], arbiter.pid, arbiter.LISTENERS, arbiter.app,
                                      arbiter.timeout / 2.0, arbiter.cfg, arbiter.log)
        os.dup2(heartbeat_fd, worker.tmp.fileno())  # NOTE: the file the master watches (murder_workers), not the one made here
        os.close(heartbeat_fd)
        worker.forkserve_slot = request.get("slot")
        cpus = request.get("cpus")
        worker.forkserve_cpus = frozenset(cpus) if cpus is not None else None
        arbiter.log.reopen_files()  # after a USR1 the master writes to new files; this worker must too
    except Exception:  # a full temporary directory: this worker exits as one that crashed, and is replaced
        arbiter.log.exception("forkserve: worker %s could not be made from the zygote", os.getpid())
        os._exit(1)
    run_worker(arbiter, worker)


_WORKER_NAME = b"python3"  # the master's /proc/PID/comm, which workers keep


def _read_name() -> bytes:
    try:
        with open("/proc/self/comm", "rb") as comm:
            return comm.read().strip()
    except OSError:
        return b"python3"


def _read_exactly(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _send(channel: socket.socket, message: dict[str, Any]) -> None:
    try:
        channel.send(json.dumps(message).encode())
    except OSError:
        os._exit(1)  # the master is gone


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
