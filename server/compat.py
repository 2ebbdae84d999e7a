"""Every use of a pinned library's private API, in one place, each with the public way beside it.

| use | private API | public fallback |
|---|---|---|
| `flat_call_or_none` | TF: `ConcreteFunction._inference_function`, `execute.quick_execute` | `ConcreteFunction.__call__` |
| `observe_many` | prometheus_client: a histogram child's `_upper_bounds`, `_buckets`, `_sum` | `observe()` per value |
| `is_histogram` | prometheus_client: `metric._type` | `isinstance(metric, Histogram)` |
| `reserve_metric_file_blocks` | prometheus_client: `MmapedDict.__init__`, `_init_value`, `_f`, `_capacity`, `_used`, `mmap_dict._INITIAL_MMAP_SIZE` | none: sparse files (SIGBUS on a full disk) |
| `send_responses_in_one_write` | gunicorn: `http.wsgi.Response`, replaced for `wsgi.create` | headers and body in two writes |
| `ForkserveWorker.worker_connections`, `.max_keepalived` (server/worker/gthread.py) | gunicorn: gthread's loop reads `worker_connections` once per pass, `handle_request` reads `max_keepalived` per request | none: unbalanced connections (tests/e2e/test_connection_balance.py fails) |
| `install`, `run_worker` (server/master/zygote.py, server/spawn/boot.py) | gunicorn: the arbiter's `spawn_worker` (replaced on the instance; its child half copied), `manage_workers`, `stop`, `reap_workers`, `worker_age`, `WORKERS`, `LISTENERS`, `SIG_QUEUE`, `_stats`; a worker's `tmp` file descriptor | no zygote: the master forks every worker and each imports TensorFlow (3-5 s and ~275 MB private memory per worker) |
| `_never_halt_once_a_worker_booted` (server/master/hooks.py) | gunicorn: the arbiter's `reap_workers` (called by its SIGCHLD handler) and its `WORKER_BOOT_ERROR` / `APP_LOAD_ERROR` constants | none: a worker's `os._exit(3)` halts the master |
| `ForkserveWorker.finish_request` (server/worker/gthread.py) | gunicorn: gthread's `finish_request` closes a finished connection with `conn.close(graceful=True)` on the main thread; `conn.sock` | the close lingers on the main thread (up to 2 s per slow client) and drains 64 KiB at most (an unread larger body: a reset, nginx's 502) |
| `ForkserveWorker.enqueue_req`, `.handle` (server/worker/gthread.py) | gunicorn: gthread's main thread passes each readable connection to `enqueue_req(conn)`, a request thread runs `handle(conn)` | no `thread_wait` stage (tests/e2e/test_slow_requests.py fails); a changed signature fails every request |
| `OneWriteResponse.process_headers` (server/compat.py) | gunicorn: `http.wsgi.Response.process_headers`, `force_close` | an app's `Connection: close` is dropped: a client's next request after a load or unload call can reach the retiring worker (tests/e2e/test_repository_control.py fails) |
| `ForkserveWorker.set_accept_enabled` (server/worker/gthread.py) | gunicorn: gthread's `run` calls it with False once `alive` is False; `accept`, `nr_conns`, `sockets` | the listening sockets stay open until the last request is done (a full stop resets what queued meanwhile) |

A private path is taken only when the installed version is the one it was verified against
(VERIFIED, equal to the pins in requirements.txt: a unit test checks) and, for the TensorFlow
call, only when it answers bit-identically to the public call at warm-up. No TensorFlow at import:
the master imports this module.
"""

from __future__ import annotations

import bisect
import collections
import importlib.metadata
import itertools
import logging
import os
from functools import cache
from typing import Any

log = logging.getLogger("forkserve.compat")

VERIFIED = {"tensorflow-cpu": "2.21.0", "prometheus-client": "0.26.0", "gunicorn": "27.0.1"}


@cache
def verified(distribution: str) -> bool:
    """True when the installed `distribution` is the version the private path was checked against."""
    try:
        installed = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        installed = ""
    if installed != VERIFIED[distribution]:
        log.warning("%s %s is installed, forkserve was verified with %s: using its public API only (slower)",
                    distribution, installed or "(none)", VERIFIED[distribution])
        return False
    return True


# --- TensorFlow (workers only) -----------------------------------------------------------------


class FlatCall:
    """A concrete function called with flat tensors, below ConcreteFunction.__call__'s argument binding.

    The binding and casting in __call__ cost more than a small model's kernels (measured:
    bench/results/code-notes.md#flat-call). Inputs must already match the signature:
    the request codecs check shapes and dtypes, __call__'s checks are skipped.
    """

    def __init__(self, concrete: Any) -> None:
        import tensorflow as tf
        from tensorflow.python.eager import context, execute

        atomic = concrete._inference_function
        self._name = atomic.name.decode()
        self._output_count = len(atomic.function_type.flat_outputs)
        self._captures = list(concrete.captured_inputs)
        self._context = context.context()
        self._attrs = tuple(itertools.chain(*self._context.function_call_options.as_attrs().items()))
        self._execute = execute.quick_execute
        outputs = concrete.structured_outputs
        if not isinstance(outputs, dict):
            raise TypeError(f"outputs are a {type(outputs).__name__}, not a dict")
        self._output_names = tf.nest.flatten({name: name for name in outputs})  # the flat outputs' order

    def __call__(self, *tensors: Any) -> dict[str, Any]:
        flat = self._execute(self._name, self._output_count, [*tensors, *self._captures], self._attrs, self._context)
        return dict(zip(self._output_names, flat))


def probe_arrays(shapes: list[tuple[int | None, ...]], dtypes: list[str], batch: int = 3) -> list[Any]:
    """Random inputs of every input's dtype with `batch` rows (free dimensions as 2), to compare two calls."""
    import numpy as np

    rng = np.random.default_rng(0)
    arrays = []
    for shape, dtype in zip(shapes, dtypes):
        full = (batch, *[d or 2 for d in shape[1:]])
        if dtype == "string":
            arrays.append(np.full(full, b"", dtype=object))
            continue
        kind = np.dtype(dtype).kind
        if kind == "f":
            arrays.append(rng.standard_normal(full).astype(dtype))
        elif kind in "iu":
            arrays.append(rng.integers(0, 2, full).astype(dtype))  # 0 and 1: valid indices for any embedding
        elif kind == "b":
            arrays.append(rng.random(full) > 0.5)
        else:
            raise TypeError(f"no probe values for dtype {dtype}")
    return arrays


def flat_call_or_none(concrete: Any, shapes: list[tuple[int | None, ...]], dtypes: list[str]) -> FlatCall | None:
    """A FlatCall when TF is the verified version and it answers exactly as the public call on probe inputs."""
    if not verified("tensorflow-cpu"):
        return None
    import numpy as np
    import tensorflow as tf

    try:
        flat = FlatCall(concrete)
        tensors = [tf.constant(a) for a in probe_arrays(shapes, dtypes)]
        expected = {k: v.numpy() for k, v in concrete(*tensors).items()}
        got = {k: v.numpy() for k, v in flat(*tensors).items()}
    except Exception as exc:  # a model this probe cannot feed, or a moved private API: the public call
        log.warning("flat function call unavailable, using ConcreteFunction.__call__: %s", exc)
        return None
    if expected.keys() != got.keys() or not all(np.array_equal(expected[k], got[k], equal_nan=True) for k in expected):
        log.warning("flat function call disagrees with ConcreteFunction.__call__; using the latter")
        return None
    return flat


# --- prometheus_client -------------------------------------------------------------------------


def is_histogram(metric: Any) -> bool:
    """Whether a metric (or a labelled child) is a histogram."""
    if verified("prometheus-client"):
        return metric._type == "histogram"
    from prometheus_client import Histogram

    return isinstance(metric, Histogram)


def observe_many(child: Any, values: list[float]) -> None:
    """Histogram child: one write per touched bucket and one for the sum, as observe() would do them."""
    if not verified("prometheus-client"):
        for value in values:
            child.observe(value)
        return
    bounds, buckets, total = child._upper_bounds, child._buckets, child._sum
    total.inc(sum(values))
    for index, count in collections.Counter(bisect.bisect_left(bounds, v) for v in values).items():
        buckets[index].inc(count)


def reserve_metric_file_blocks() -> bool:
    """Make prometheus_client allocate its mmapped files' blocks before it maps them (posix_fallocate); False if not possible.

    NOTE: it creates and grows its files with truncate, which leaves them sparse, and maps them at
    once: on a full tmpfs the first touch of a page (its own read of the header, at creation) is a
    SIGBUS that kills the process, the master included (it creates the archives, server.telemetry.files).
    With the blocks reserved before the map, a full disk is an OSError at file creation or growth,
    which metrics.record turns into a lost update. A file this leaves empty is removed: scrapes
    cannot parse an empty file.
    """
    from prometheus_client import mmap_dict

    MmapedDict = mmap_dict.MmapedDict
    if getattr(MmapedDict, "_forkserve_reserved", False):
        return True
    if not verified("prometheus-client"):
        return False
    initial_size = mmap_dict._INITIAL_MMAP_SIZE
    original_init, original_init_value = MmapedDict.__init__, MmapedDict._init_value

    def init(self: Any, filename: str, read_mode: bool = False) -> None:
        if not read_mode:
            _reserve_blocks(filename, initial_size)
        original_init(self, filename, read_mode)

    def init_value(self: Any, key: str) -> None:
        encoded = len(key.encode("utf-8"))
        needed = self._used + 4 + encoded + (8 - (encoded + 4) % 8) + 16
        capacity = self._capacity
        while needed > capacity:
            capacity *= 2
        if capacity != self._capacity:
            os.posix_fallocate(self._f.fileno(), 0, capacity)
        original_init_value(self, key)

    MmapedDict.__init__, MmapedDict._init_value = init, init_value
    MmapedDict._forkserve_reserved = True
    return True


def _reserve_blocks(filename: str, initial: int) -> None:
    """Create `filename` if needed and allocate every block of it, at least `initial` bytes; remove it if it stays empty."""
    fd = os.open(filename, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        size = os.fstat(fd).st_size
        try:
            os.posix_fallocate(fd, 0, max(size, initial))
        except OSError:
            if size == 0:
                os.unlink(filename)
            raise
    finally:
        os.close(fd)


# --- gunicorn (workers only) -------------------------------------------------------------------


class _HeaderHoldingSocket:
    """A connection socket that holds the response head until the first body bytes are sent."""

    __slots__ = ("_sock", "held", "holding")

    def __init__(self, sock: Any) -> None:
        self._sock, self.held, self.holding = sock, b"", False

    def sendall(self, data: bytes) -> None:
        if self.holding:
            self.held += data
            return
        if self.held:
            data, self.held = self.held + data, b""
        self._sock.sendall(data)

    def flush(self) -> None:
        if self.held:
            self.sendall(b"")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _one_write_response_class() -> type:
    from gunicorn.http import wsgi

    from server import control

    class OneWriteResponse(wsgi.Response):
        """gunicorn's Response, sending the status line and headers in the same write as the body."""

        def __init__(self, req: Any, sock: Any, cfg: Any, *args: Any) -> None:
            super().__init__(req, _HeaderHoldingSocket(sock), cfg, *args)

        def send_headers(self) -> None:
            self.sock.holding = True
            try:
                super().send_headers()
            finally:
                self.sock.holding = False

        def can_sendfile(self) -> bool:
            return False  # os.sendfile would overtake the held head

        def process_headers(self, headers: list[tuple[str, str]]) -> None:
            """gunicorn's; in a stopping worker, an app's `Connection: close` closes the connection (gunicorn drops it).

            NOTE: looked for only once the worker stopped accepting (server.control.STOPPED_ACCEPTING): a
            repository call's answer is the one that asks, and the scan would cost every response 1 µs.
            """
            super().process_headers(headers)
            if control.STOPPED_ACCEPTING.is_set() and any(
                    name.lower() == "connection" and value.strip().lower() == "close" for name, value in headers):
                self.force_close()

        def close(self) -> None:
            super().close()
            self.sock.flush()

    return OneWriteResponse


def send_responses_in_one_write() -> bool:
    """Make gunicorn send each response's head and body in one write; False if not possible.

    NOTE: gunicorn writes the head, then the body. A worker killed between the two (OOM, SIGKILL)
    leaves nginx holding a head it has already passed on: the client gets a truncated answer
    instead of nginx's retry on the other instance, which needs a connection that closed before
    any byte of the answer (proxy_next_upstream error). Runs in a worker, after fork.
    """
    from gunicorn.http import wsgi

    if getattr(wsgi.Response, "_forkserve_one_write", False):
        return True
    if not verified("gunicorn"):
        return False
    wsgi.Response = _one_write_response_class()
    wsgi.Response._forkserve_one_write = True
    return True
