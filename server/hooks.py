"""gunicorn hook bodies, grouped by the process that runs them.

gunicorn.conf.py points each hook here. This module and everything it imports at module level
must never import tensorflow or keras: the master imports it, and TF state in the master
hangs the workers it forks. prometheus_client is imported inside the hooks, never before
on_starting has wiped the metrics directory (the master's own value files would go with it).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Any

from server import cpu_pinning
from server.config import load_config
from server.settings import Settings
from server.state import (
    read_exit_reason,
    remove_worker_state,
    workers_dir,
    write_exit_reason,
    write_worker_state,
)
from server.target import FAILED_FILE, TARGET_FILE

log = logging.getLogger("forkserve.hooks")

# --- master process -------------------------------------------------------------------------


def on_starting(server: Any) -> None:
    """Master, before the listeners open: refuse to start on a malformed conf/models.toml."""
    settings = Settings.from_env()
    settings.export()
    _share_gunicorn_log(server)
    load_config(settings.conf_path)  # raises ConfigError: a config mistake must stop the start
    for directory in (workers_dir(settings.run_dir), settings.metrics_dir):
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True, exist_ok=True)
    # NOTE: import the metric definitions now, after the wipe: workers inherit the module already
    # initialised, so a metrics directory that breaks later can never fail a worker's app import.
    from server import metrics  # noqa: F401
    if not settings.models_dir.is_dir():
        server.log.warning("model repository %s does not exist; serving no models", settings.models_dir)
    server.log.info(
        "forkserve: models %s, conf %s, %d workers x %d threads, %d CPUs",
        settings.models_dir, settings.conf_path, server.cfg.workers, server.cfg.threads, settings.cpus,
    )
    server.log.info("forkserve: run directory %s", settings.run_dir)


_controller: Any = None  # the master's RolloutController (one per master process)


def when_ready(server: Any) -> None:
    """Master, listeners open, before the first workers fork: publish the target, start the watcher.

    SIGHUP is rerouted to the readiness-gated rollout: gunicorn's own HUP forks new workers and
    stops the old ones at once, before the new ones have loaded TensorFlow and the models.
    """
    global _controller
    from server.rollout import RolloutController, RolloutSettings

    settings = Settings.from_env()
    knobs = RolloutSettings(poll_interval=settings.poll_interval, boot_timeout=settings.boot_timeout)
    _controller = RolloutController(server, settings.models_dir, settings.conf_path, settings.run_dir, knobs)
    _controller.publish_initial_target()
    server.handle_hup = lambda: _controller.request_reload("SIGHUP")
    _controller.start()


def on_exit(server: Any) -> None:
    """Master, last thing before it exits: remove what it made in the run directory."""
    if _controller is not None:
        _controller.stop()
    settings = Settings.from_env()
    for directory in (workers_dir(settings.run_dir), settings.metrics_dir):
        shutil.rmtree(directory, ignore_errors=True)
    for name in (TARGET_FILE, FAILED_FILE, "gunicorn.pid"):
        (settings.run_dir / name).unlink(missing_ok=True)
    try:
        settings.run_dir.rmdir()  # only when empty: a run directory the user gave may hold more
    except OSError:
        pass


def child_exit(server: Any, worker: Any) -> None:
    """Master, after reaping a worker (SIGKILL included): count the exit, fold its metrics, forget it."""
    from server import metrics, metrics_files

    settings = Settings.from_env()
    reason = "timeout" if worker.aborted else read_exit_reason(settings.run_dir, worker.pid) or "killed"
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


# --- worker process ---------------------------------------------------------------------------


def pre_fork(server: Any, worker: Any) -> None:
    """Master, before each fork: give the new worker the CPU slot the fewest other workers keep.

    A rollout adds a worker before gunicorn retires the oldest (TTOU), so with the fleet full
    the oldest workers do not count: the new worker takes the slot the retiring one frees.
    """
    workers = server.cfg.workers  # the configured count; TTIN raises only server.num_workers
    if not Settings.from_env().pins_for(workers):
        return
    slots = cpu_pinning.cpu_slots(cpu_pinning.allowed_cpus(), workers)
    staying = sorted(server.WORKERS.values(), key=lambda other: other.age)
    if len(staying) >= workers:
        staying = staying[len(staying) - (workers - 1) :]
    worker.forkserve_cpus = cpu_pinning.choose_slot(slots, [getattr(w, "forkserve_cpus", None) for w in staying])


def post_fork(server: Any, worker: Any) -> None:
    """Worker, right after fork and before TensorFlow is imported: size the native thread pools, pin the CPUs.

    OpenMP / oneDNN read these variables once, when TensorFlow loads, so they must be set here.
    """
    settings = Settings.from_env()
    # NOTE: before pinning: afterwards this process sees only its slot's CPUs.
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
    """Worker, after the app is built and before it accepts: load and warm every model.

    Never raises: an exception here exits the worker with gunicorn's boot-error code, and the
    master then halts the whole server. A model that fails is recorded as failed instead.
    """
    settings = Settings.from_env()
    registry = getattr(worker.wsgi, "extensions", {}).get("forkserve")
    if registry is None:
        worker.log.error("forkserve: the WSGI app is not forkserve's create_app(); no models loaded")
        return
    try:
        intra = getattr(worker, "forkserve_intra_op", None) or settings.intra_op_for(worker.cfg.workers)
        registry.load_all(intra, settings.inter_op_threads)
    except Exception:  # NOTE: a bug here must not halt the server; the worker reports not ready
        worker.log.exception("forkserve: loading models failed")
    from server import metrics

    ready, report = registry.readiness()
    metrics.record(metrics.WORKER_BOOTS.inc)
    metrics.record(lambda: metrics.WORKERS_ALIVE.set(1))
    worker.log.info("forkserve worker %s %s: %s", os.getpid(), "ready" if ready else "NOT ready", report)
    write_worker_state(
        settings.run_dir,
        os.getpid(),
        {
            "pid": os.getpid(),
            "loaded": True,
            "ready": ready,
            "generation": registry.generation,
            "serving": {name: entry["serving"] for name, entry in report.items()},
            "models": report,
            "booted_at": time.time(),
        },
    )


def worker_exit(server: Any, worker: Any) -> None:
    """Worker, on its way out (not after SIGKILL): write buffered metrics, tell the master this exit was orderly."""
    from server.metric_buffer import BUFFER

    BUFFER.flush()
    flush_access = getattr(worker.log, "flush_access", None)  # server.access_log.AccessLogger
    if flush_access is not None:
        flush_access()
    write_exit_reason(Settings.from_env().run_dir, os.getpid(), "graceful")
