"""gunicorn hooks that run in a worker, after fork: thread pools, CPUs, loading the models, exit.

gunicorn.conf.py (in the master) imports this module to name the hooks, so it must not import
tensorflow or keras at module level either; the first TensorFlow import of a worker happens in
post_worker_init, through the model registry (server.models.runtime).
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from typing import Any

from server.settings import Settings
from server.state import (
    LOADED,
    ModelReport,
    WorkerState,
    publish_worker_state,
    write_exit_reason,
    write_worker_state,
)
from server.worker.heartbeat import Heartbeat

log = logging.getLogger("forkserve.worker")


def post_fork(server: Any, worker: Any) -> None:
    """Worker, right after fork and before TensorFlow is imported (or its zygote's imports): heartbeat, thread pools, CPUs."""
    # NOTE: gunicorn 27 creates the heartbeat file with a wall-clock mtime and compares it with
    # the monotonic clock, so before a worker's first notify its timeout can never fire. Notify now:
    # the timeout then holds during boot too, and the load heartbeat (post_worker_init) keeps it.
    worker.notify()
    settings = Settings.current()
    intra = worker.forkserve_intra_op = settings.intra_op_for(worker.cfg.workers)
    cpus = getattr(worker, "forkserve_cpus", None)
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)  # before any thread starts: threads created later inherit it
            worker.log.info("forkserve worker %s pinned to CPUs %s", os.getpid(), sorted(cpus))
        except OSError as exc:  # a mask the kernel refuses (CPU went offline): run unpinned
            worker.log.warning("forkserve worker %s not pinned: %s", os.getpid(), exc)
    os.environ.update(settings.worker_environment(intra))
    # The first metric write after fork reopens every value file; a removed directory would leave
    # this worker's metrics half reopened, so recreate it first (best effort).
    try:
        settings.metrics_dir.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass


def post_worker_init(worker: Any) -> None:
    """Worker, after the app is built and before it accepts: load and warm every model, heartbeat on.

    Never raises: an exception here exits the worker with gunicorn's boot-error code, and the
    master then halts the whole server. A model that fails is recorded as failed instead.
    """
    settings = Settings.current()
    registry = getattr(worker.wsgi, "extensions", {}).get("forkserve")
    if registry is None:
        worker.log.error("forkserve: the WSGI app is not forkserve's create_app(); no models loaded")
        return
    pid = os.getpid()

    def loading(model: str, version: int) -> None:  # best effort: a full run directory costs the progress report only
        write_worker_state(settings.run_dir, WorkerState(pid, registry.generation, loading=(model, version)))

    interval = min(5.0, max(0.2, worker.cfg.timeout / 4)) if worker.cfg.timeout else 5.0
    try:
        with Heartbeat(worker.notify, interval, settings.boot_timeout):
            intra = getattr(worker, "forkserve_intra_op", None) or settings.intra_op_for(worker.cfg.workers)
            registry.load_all(intra, settings.inter_op_threads, loading, stopping=lambda: not worker.alive)
    except Exception:  # NOTE: a bug here must not halt the server; the worker reports not ready
        worker.log.exception("forkserve: loading models failed")
    start_tracing(worker)
    start_payload_log(worker, registry, settings)
    from server.telemetry import measure

    measure.TFSERVING = bool(settings.tfserving_metrics_path)  # before the first request: REST accepts, gRPC listens after this
    # NOTE: after tracing (the OTel SDK's imports, ~12,000 objects, frozen too) and before gRPC
    # listens: the collection before the freeze takes up to ~0.2 s and must not stall its calls.
    if settings.gc_freeze:
        worker.log.info("forkserve worker %s froze %d loaded objects out of the garbage collector's reach",
                        pid, freeze_the_loaded_heap())
    start_grpc(worker, registry, settings)
    from server.telemetry import metrics

    ready, report = registry.readiness()
    metrics.record(metrics.WORKER_BOOTS.inc)
    metrics.record(lambda: metrics.WORKERS_ALIVE.set(1))
    worker.log.info("forkserve worker %s %s: %s", pid, "ready" if ready else "NOT ready", report)
    models = {
        name: ModelReport(list(entry["serving"]), {int(v): why for v, why in entry.get("failed", {}).items()})
        for name, entry in report.items()
    }
    # NOTE: never raises (R5): a run directory that refuses the file leaves this worker serving,
    # unseen by the master until a retry gets the file written (server.state).
    publish_worker_state(settings.run_dir, WorkerState(pid, registry.generation, LOADED, None, ready, models))


def start_tracing(worker: Any) -> None:
    """Worker, before serving: OpenTelemetry traces when an OTLP endpoint is set (server.telemetry.tracing)."""
    from server.telemetry import tracing

    try:
        if tracing.start():
            worker.log.info("forkserve worker %s exports traces to %s", os.getpid(),
                            os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    except Exception:  # NOTE: never raises (see post_worker_init): this worker serves untraced
        worker.log.exception("forkserve worker %s: tracing could not start; requests are not traced", os.getpid())


def start_grpc(worker: Any, registry: Any, settings: Settings) -> None:
    """Worker, models warm: this worker's gRPC server on FORKSERVE_GRPC_BIND (server.rpc), unless it is "".

    NOTE: a worker that cannot listen reports not ready with the reason (/readyz, its state file)
    rather than serving REST alone: a rollout never retires a worker for it, and the log says why.
    """
    if not settings.grpc_bind or not worker.alive:  # told to stop while loading: nothing to listen for
        return
    try:
        from server.rpc.listener import GrpcListener

        listener = GrpcListener(registry, settings, getattr(worker.log, "access_line", None),
                                slot=getattr(worker, "forkserve_slot", None))
        listener.start()
    except Exception as exc:  # NOTE: never raises (see post_worker_init)
        registry.listener_problem = f"gRPC: {exc}"
        worker.log.error("forkserve worker %s NOT ready: %s", os.getpid(), registry.listener_problem)
        return
    worker.forkserve_grpc = listener
    worker.log.info("forkserve worker %s serving gRPC on %s", os.getpid(), settings.grpc_bind)


def start_payload_log(worker: Any, registry: Any, settings: Settings) -> None:
    """The payload log's writer thread (FORKSERVE_PAYLOAD_LOG), after fork; a failure leaves payloads unlogged, the worker serving."""
    try:
        from server.telemetry.payloads import writer

        sampled = [name for name, model in registry.models.items() if model.config.payload_log_sample]
        if writer.start(settings, sampled) is not None:
            worker.log.info("forkserve worker %s logs sampled payloads to %s", os.getpid(), settings.payload_log)
    except Exception:
        worker.log.exception("forkserve: the payload log could not start; payloads are not logged")


def freeze_the_loaded_heap() -> int:
    """Move every object alive after loading out of the garbage collector's reach (gc.freeze).

    NOTE: the heap after loading is TensorFlow's and Keras's object graph, millions of objects
    that never die. Each full collection walked all of them: stalls of a large part of a second,
    the whole of the p99 at one connection (bench/results/code-notes.md#gc-freeze). Frozen, a full collection walks only what
    requests allocated since.
    """
    import gc

    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def worker_exit(server: Any, worker: Any) -> None:
    """Worker, on its way out (not after SIGKILL): write what is buffered, tell the master why, then leave at once.

    NOTE: gunicorn calls this in spawn_worker's `finally`, with the SystemExit that ends the worker
    in flight. The worker then leaves with that exit code through os._exit, as forked
    multiprocessing children do: the interpreter's own finalization (TensorFlow's teardown, joining
    idle threads, atexit handlers inherited from the master) took seconds, and once, on a loaded
    machine, longer than graceful_timeout, so the master SIGKILLed a worker that had finished.
    """
    if getattr(worker, "pid", None) != os.getpid():
        # NOTE: gunicorn's master calls this hook too, for a worker it found already gone (kill_worker
        # on ESRCH, inside its `except OSError`): leaving "at once" there ended the master (os._exit(1)).
        return
    from server.telemetry.buffer import BUFFER

    error = sys.exc_info()[1]
    booted = getattr(worker, "wsgi", None) is not None  # the app loaded: loading models is past gunicorn's boot
    code = exit_code(error, booted=booted)
    reason = exit_reason(error, stopping=not worker.alive)
    if reason != "graceful":
        worker.log.error("forkserve worker %s leaves with exit code %d (%s): %s", os.getpid(), code, reason,
                         _what_ended(error))
    BUFFER.flush()
    from server.telemetry.payloads import capture

    if capture.ON:
        from server.telemetry.payloads import writer

        writer.stop()  # bounded: DRAIN_S, then the record being written is aborted; the rest counted and logged once
    from server.telemetry import tracing

    tracing.stop()  # bounded: an endpoint that hangs costs EXIT_FLUSH_S at most
    flush_access = getattr(worker.log, "flush_access", None)  # server.telemetry.access_log.AccessLogger
    if flush_access is not None:
        flush_access()
    write_exit_reason(Settings.current().run_dir, os.getpid(), reason)
    logging.shutdown()  # flush every log handler: os._exit skips it
    os._exit(code)


# gunicorn's WORKER_BOOT_ERROR and APP_LOAD_ERROR: a worker exiting with either halts the master.
BOOT_ERROR_CODES = (3, 4)


def exit_code(error: BaseException | None, booted: bool = False) -> int:
    """The status a worker ending with `error` leaves with.

    Before its app loaded, gunicorn's boot-error codes keep their meaning (the server's own code
    cannot start: the master halts). After, never: whatever raised SystemExit(3) then (a
    handler, a full run directory) must cost one worker, which the master replaces.
    """
    if isinstance(error, SystemExit):
        code = 0 if error.code is None else error.code if isinstance(error.code, int) else 1
    else:
        code = 0 if error is None else 1
    return 1 if booted and code & 0xFF in BOOT_ERROR_CODES else code  # NOTE: the status is the low byte: 259 is 3


def exit_reason(error: BaseException | None, stopping: bool) -> str:
    """What the master records (and rollouts read): "graceful" only for an orderly stop.

    `stopping`: the worker was told to stop (TERM, QUIT, max_requests: gunicorn cleared `alive`).
    "exit(N)" is a SystemExit that no stop explains (code N as raised, before exit_code's
    mapping); "error" is an exception that ended the worker (gunicorn turns one into
    SystemExit(-1), or SystemExit(3) before boot, while handling it). A rollout counts every
    reason but "graceful" against the version the worker was loading.
    """
    code = exit_code(error)
    if code == 0 and stopping:  # NOTE: whatever was being handled when the stop's sys.exit(0) came
        return "graceful"
    if error is None or (isinstance(error, SystemExit) and error.__context__ is None):
        return f"exit({code})"
    return "error"


def _what_ended(error: BaseException | None) -> str:
    """The exception that ended the worker and where it was raised, for the log."""
    cause = error.__context__ if error is not None and error.__context__ is not None else error
    if cause is None:
        return "no exception"
    frames = traceback.extract_tb(cause.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(cause).__name__}: {cause}{where}"
