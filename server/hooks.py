"""gunicorn hook bodies, grouped by the process that runs them.

gunicorn.conf.py points each hook here. This module and everything it imports at module level
must never import tensorflow or keras: the master imports it, and TF state in the master
hangs the workers it forks. prometheus_client is imported inside the hooks, never before
on_starting has wiped the metrics directory (the master's own value files would go with it).
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
from typing import Any

from server import cpu_pinning
from server.config import ConfigError, ServerConfig, load_config
from server.heartbeat import Heartbeat
from server.settings import Settings
from server.state import (
    LOADED,
    ModelReport,
    WorkerState,
    read_exit_reason,
    remove_worker_state,
    workers_dir,
    write_exit_reason,
    write_worker_state,
)
from server.target import FAILED_FILE, TARGET_FILE

log = logging.getLogger("forkserve.hooks")

# --- master process -------------------------------------------------------------------------

_controller: Any = None  # the master's RolloutController (one per master process)
_start_config = ServerConfig()  # what on_starting validated; the controller starts from it


def on_starting(server: Any) -> None:
    """Master, before the listeners open: refuse to start on a bad configuration, prepare the run directory."""
    global _start_config
    settings = Settings.current()
    settings.export()
    _share_gunicorn_log(server)
    atexit.register(_clean_run_dir_after_failed_start, os.getpid())
    try:
        _start_config = load_config(settings.conf_path)
        if not settings.models_dir.is_dir():
            raise ConfigError(f"model repository {settings.models_dir} is not a directory (FORKSERVE_MODELS)")
    except ConfigError as exc:
        # NOTE: one line, not gunicorn's traceback; SystemExit leaves gunicorn's start quietly.
        server.log.error("forkserve: cannot start: %s", exc)
        if getattr(server, "pidfile", None) is not None:
            server.pidfile.unlink()
        raise SystemExit(1) from None
    for directory in (workers_dir(settings.run_dir), settings.metrics_dir):
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True, exist_ok=True)
    # NOTE: import the metric definitions now, after the wipe: workers inherit the module already
    # initialised, so a metrics directory that breaks later can never fail a worker's app import.
    from server import metrics  # noqa: F401

    server.log.info(
        "forkserve: models %s, conf %s, %d workers x %d threads, %d CPUs",
        settings.models_dir, settings.conf_path, server.cfg.workers, server.cfg.threads, settings.cpus,
    )
    server.log.info("forkserve: run directory %s", settings.run_dir)


def when_ready(server: Any) -> None:
    """Master, listeners open, before the first workers fork: publish the target, start the watcher.

    SIGHUP is rerouted to the readiness-gated rollout: gunicorn's own HUP forks new workers and
    stops the old ones at once, before the new ones have loaded TensorFlow and the models.
    """
    global _controller
    from server.fleet import Fleet
    from server.rollout import RolloutController, RolloutSettings

    settings = Settings.current()
    knobs = RolloutSettings(
        poll_interval=settings.poll_interval, boot_timeout=settings.boot_timeout,
        graceful_timeout=server.cfg.graceful_timeout, attempts=settings.rollout_attempts,
        backoff=settings.rollout_backoff,
    )
    _controller = RolloutController(
        Fleet(server), settings.models_dir, settings.conf_path, settings.run_dir, knobs, _start_config,
    )
    _controller.publish_initial_target()
    server.handle_hup = lambda: _controller.request_reload("SIGHUP")
    _controller.start()


def on_exit(server: Any) -> None:
    """Master, last thing before it exits: remove what it made in the run directory."""
    if _controller is not None:
        _controller.stop()
    _remove_run_files(Settings.current())


def child_exit(server: Any, worker: Any) -> None:
    """Master, after reaping a worker (SIGKILL included): count the exit, fold its metrics, forget it."""
    from server import metrics, metrics_files

    settings = Settings.current()
    reason = "timeout" if worker.aborted else read_exit_reason(settings.run_dir, worker.pid) or "killed"
    if _controller is not None:
        _controller.worker_exited(worker.pid, reason)  # NOTE: before its state file goes: where it was loading
    metrics.record(lambda: metrics.WORKER_EXITS.labels(reason).inc())
    try:
        metrics_files.compact_dead_process(settings.metrics_dir, worker.pid)
    except OSError as exc:  # a full disk or a removed directory degrades metrics, not serving
        server.log.warning("forkserve: could not fold metrics of worker %s: %s", worker.pid, exc)
    remove_worker_state(settings.run_dir, worker.pid)


def _share_gunicorn_log(server: Any) -> None:
    """Send forkserve's loggers to gunicorn's error log (workers inherit this after fork)."""
    forkserve_log = logging.getLogger("forkserve")
    forkserve_log.handlers = list(server.log.error_log.handlers)
    forkserve_log.setLevel(server.log.error_log.level)
    forkserve_log.propagate = False


def _remove_run_files(settings: Settings) -> None:
    """Remove what forkserve made in the run directory, and the directory itself when that empties it."""
    for directory in (workers_dir(settings.run_dir), settings.metrics_dir):
        shutil.rmtree(directory, ignore_errors=True)
    for name in (TARGET_FILE, FAILED_FILE, "gunicorn.pid"):
        (settings.run_dir / name).unlink(missing_ok=True)
    try:
        settings.run_dir.rmdir()  # only when empty: a run directory the user gave may hold more
    except OSError:
        pass


def _clean_run_dir_after_failed_start(master_pid: int) -> None:
    """atexit in the master: a start that failed before gunicorn's own exit path (port in use) leaves nothing."""
    if os.getpid() == master_pid and _controller is None:  # workers inherit this handler; on_exit covers a run
        _remove_run_files(Settings.current())


def pre_fork(server: Any, worker: Any) -> None:
    """Master, before each fork: give the new worker the CPU slot the fewest other workers keep.

    A rollout adds a worker before it retires an old one, so with the fleet full the oldest
    workers (retiring ones sort first) do not count: the new worker takes the slot they free.
    """
    if _controller is not None:
        _controller.fleet.mark_newborn(worker)
    workers = server.cfg.workers  # the configured count; a rollout raises only server.num_workers
    if not Settings.current().pins_for(workers):
        return
    slots = cpu_pinning.cpu_slots(cpu_pinning.allowed_cpus(), workers)
    staying = sorted(server.WORKERS.values(), key=lambda other: other.age)
    if len(staying) >= workers:
        staying = staying[len(staying) - (workers - 1) :]
    worker.forkserve_cpus = cpu_pinning.choose_slot(slots, [getattr(w, "forkserve_cpus", None) for w in staying])


# --- worker process ---------------------------------------------------------------------------


def post_fork(server: Any, worker: Any) -> None:
    """Worker, right after fork and before TensorFlow is imported: heartbeat, thread pools, CPUs.

    OpenMP / oneDNN read these variables once, when TensorFlow loads, so they must be set here.
    """
    # NOTE: gunicorn 27 creates the heartbeat file with a wall-clock mtime and compares it with
    # the monotonic clock, so before a worker's first notify its timeout can never fire. Notify now:
    # the timeout then holds during boot too, and the load heartbeat (post_worker_init) keeps it.
    worker.notify()
    settings = Settings.current()
    intra = worker.forkserve_intra_op = settings.intra_op_for(worker.cfg.workers)
    cpus = getattr(worker, "forkserve_cpus", None)
    if cpus:
        try:
            cpu_pinning.pin_current_process(cpus)
            worker.log.info("forkserve worker %s pinned to CPUs %s", os.getpid(), sorted(cpus))
        except OSError as exc:  # a mask the kernel refuses (CPU went offline): run unpinned
            worker.log.warning("forkserve worker %s not pinned: %s", os.getpid(), exc)
    os.environ["OMP_NUM_THREADS"] = str(intra)
    os.environ["TF_NUM_INTRAOP_THREADS"] = str(intra)
    os.environ["TF_NUM_INTEROP_THREADS"] = str(settings.inter_op_threads)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
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

    def loading(model: str, version: int) -> None:
        write_worker_state(settings.run_dir, WorkerState(pid, registry.generation, loading=(model, version)))

    interval = min(5.0, max(0.2, worker.cfg.timeout / 4)) if worker.cfg.timeout else 5.0
    try:
        with Heartbeat(worker.notify, interval, settings.boot_timeout):
            intra = getattr(worker, "forkserve_intra_op", None) or settings.intra_op_for(worker.cfg.workers)
            registry.load_all(intra, settings.inter_op_threads, loading, stopping=lambda: not worker.alive)
    except Exception:  # NOTE: a bug here must not halt the server; the worker reports not ready
        worker.log.exception("forkserve: loading models failed")
    from server import metrics

    ready, report = registry.readiness()
    metrics.record(metrics.WORKER_BOOTS.inc)
    metrics.record(lambda: metrics.WORKERS_ALIVE.set(1))
    worker.log.info("forkserve worker %s %s: %s", pid, "ready" if ready else "NOT ready", report)
    models = {
        name: ModelReport(list(entry["serving"]), {int(v): why for v, why in entry.get("failed", {}).items()})
        for name, entry in report.items()
    }
    write_worker_state(settings.run_dir, WorkerState(pid, registry.generation, LOADED, None, ready, models))


def worker_exit(server: Any, worker: Any) -> None:
    """Worker, on its way out (not after SIGKILL): write buffered metrics, tell the master this exit was orderly."""
    from server.metric_buffer import BUFFER

    BUFFER.flush()
    flush_access = getattr(worker.log, "flush_access", None)  # server.access_log.AccessLogger
    if flush_access is not None:
        flush_access()
    write_exit_reason(Settings.current().run_dir, os.getpid(), "graceful")

