"""gunicorn hooks that run in the master (the arbiter), and what they start there.

gunicorn.conf.py points each master hook here. This module and everything it imports must never
import tensorflow or keras: TF state in the master hangs the workers it forks. prometheus_client
is imported inside the hooks, never before on_starting has wiped the metrics directory (the
master's own value files would go with it). "This is called pre-fork so it shouldn't do anything
to the current process" holds for pre_fork as it does in gunicorn.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
from pathlib import Path
from typing import Any, NoReturn

from server import compat, connection_board, control, tls, write_errors
from server import run_dir as run_directory
from server.config import ConfigError, ServerConfig, load_config
from server.master import cpus, grpc_port
from server.settings import Settings
from server.state import read_exit_reason, read_worker_states, remove_worker_state, workers_dir
from server.target import FAILED_FILE, TARGET_FILE

log = logging.getLogger("forkserve.master")
NEVER_AN_EXIT_STATUS = -1  # what the arbiter's boot-error constants become once a worker has booted

_controller: Any = None  # the master's RolloutController (one per master process)
_start_config = ServerConfig()  # what on_starting validated; the controller starts from it
_model_server: Any = None  # TF Serving's model configuration (server.master.model_server_config), when given
_zygote: Any = None  # server.master.zygote.Zygote, when FORKSERVE_ZYGOTE is on
_grpc_port_lock: socket.socket | None = None  # grpc_port.claim; never closed by hand: the exit releases it, after on_exit


def on_starting(server: Any) -> None:
    """Master, before the listeners open: refuse to start on a bad configuration, prepare the run directory."""
    global _start_config, _grpc_port_lock, _model_server
    settings = Settings.current()
    _share_gunicorn_log(server)
    try:
        settings.export()  # gunicorn.conf.py did it already: a check that the run directory is still usable
    except run_directory.RunDirError as exc:
        _refuse_to_start(server, exc)
    atexit.register(_clean_run_dir_after_failed_start, os.getpid())
    try:
        _start_config = load_config(settings.conf_path)
        if settings.models_dir is not None and not settings.models_dir.is_dir():
            raise ConfigError(f"model repository {settings.models_dir} is not a directory (FORKSERVE_MODELS)")
        _model_server = _model_server_config(settings)
        if _model_server is not None:
            _model_server.compose(_start_config)  # NOTE: models.toml and TF Serving's files must fit together
        for directory in (workers_dir(settings.run_dir), settings.metrics_dir):
            run_directory.reset_directory(directory)  # a planted symlink is removed, never followed
        # NOTE: import the metric definitions now, after the wipe: workers inherit the module already
        # initialised, so a metrics directory that breaks later can never fail a worker's app import.
        from server.telemetry import metrics  # noqa: F401
    except ConfigError as exc:
        _refuse_to_start(server, exc)
    except OSError as exc:
        _refuse_to_start(server, f"run directory {settings.run_dir}: {exc}")
    try:
        material = tls.current(settings)  # NOTE: before the listeners open: gunicorn only checks that certfile exists
    except tls.TlsError as exc:
        _refuse_to_start(server, exc)
    if material is not None:
        server.log.info("forkserve: TLS on both ports: %s", material.describe(settings))
    if settings.grpc_bind:
        try:
            _grpc_port_lock = grpc_port.claim(settings.grpc_bind)
        except grpc_port.PortTaken as exc:
            _refuse_to_start(server, exc)
    if settings.grpc_bind and (migrate := grpc_port.migrate_warning()):
        server.log.warning("forkserve: %s", migrate)
    if settings.balance_connections and compat.verified("gunicorn"):  # relies on gthread's internals (compat)
        connection_board.create(slots=max(connection_board.SLOTS, 2 * server.cfg.workers + 2))  # room for TTIN and rollouts
    server.log.info(
        "forkserve: models %s, conf %s, %d workers x %d threads, %d CPUs",
        _models_description(settings), settings.conf_path, server.cfg.workers, server.cfg.threads, settings.cpus,
    )
    server.log.info("forkserve: run directory %s", settings.run_dir)


def _models_description(settings: Settings) -> str:
    """Where the served models come from, for the start's log line."""
    if settings.tfserving_model_config is not None:
        return f"from TF Serving's model config {settings.tfserving_model_config}"
    if settings.tfserving_model is not None:
        return f"{settings.tfserving_model[0]} from {settings.tfserving_model[1]}"
    return str(settings.models_dir)


def _model_server_config(settings: Settings) -> Any:
    """TF Serving's model configuration, read and checked (ConfigError stops the start), or None."""
    if not settings.tfserving:
        return None
    from server.master.model_server_config import ModelServerConfigSource

    source = ModelServerConfigSource(settings.tfserving_model_config, settings.tfserving_model,
                                     settings.tfserving_model_config_poll, settings.tfserving_defaults,
                                     settings.tfserving_labels_for_unavailable)
    source.initial()
    return source


def _refuse_to_start(server: Any, why: object) -> NoReturn:
    """One line, not gunicorn's traceback; SystemExit leaves gunicorn's start quietly."""
    server.log.error("forkserve: cannot start: %s", why)
    if getattr(server, "pidfile", None) is not None:
        server.pidfile.unlink()
    raise SystemExit(1) from None


def when_ready(server: Any) -> None:
    """Master, listeners open, before the first workers fork: publish the target, start the watcher.

    SIGHUP is rerouted to the readiness-gated rollout: gunicorn's own HUP forks new workers and
    stops the old ones at once, before the new ones have loaded TensorFlow and the models.
    """
    global _controller
    from server.master.fleet import Fleet
    from server.master.rollout import RolloutController, RolloutSettings

    settings = Settings.current()
    knobs = RolloutSettings(
        poll_interval=settings.poll_interval, boot_timeout=settings.boot_timeout,
        graceful_timeout=server.cfg.graceful_timeout, attempts=settings.rollout_attempts,
        backoff=settings.rollout_backoff, new_versions=settings.new_versions,
    )
    _never_halt_once_a_worker_booted(server, settings.run_dir)
    zygote = _start_zygote(server, settings)  # NOTE: before the rollout thread starts: the master forks it single-threaded
    _controller = RolloutController(
        Fleet(server), settings.models_dir, settings.conf_path, settings.run_dir, knobs, _start_config, settings,
        model_control=settings.model_control, load_models=settings.load_models, model_server=_model_server,
        renew_zygote=(lambda: zygote.renew(zygote.start_timeout)) if zygote is not None else None,
    )
    _controller.publish_initial_target()
    server.handle_hup = lambda: _controller.request_reload("SIGHUP")
    _controller.start()


def _start_zygote(server: Any, settings: Settings) -> Any:
    """Master: the zygote that forks workers (server.master.zygote), started now; None when off or impossible here."""
    global _zygote
    if not settings.zygote or not compat.verified("gunicorn"):  # NOTE: it replaces the arbiter's spawn_worker (compat)
        return None
    from server.master import zygote
    from server.spawn import zygote as template

    if not zygote.become_subreaper():
        server.log.warning("forkserve: no zygote: this kernel cannot make the master a child subreaper; "
                           "the master forks every worker itself")
        return None
    modules = template.PRELOAD + (template.GRPC_PRELOAD if settings.grpc_bind else ()) + settings.zygote_preload
    environment = settings.worker_environment(settings.intra_op_for(server.cfg.workers))
    _zygote = zygote.Zygote(server, modules, environment, record=_record_zygote)
    zygote.install(server, _zygote)
    _zygote.start()
    return _zygote


def _record_zygote(event: str, detail: str) -> None:
    """A worker forked (by "zygote" or "master") or a zygote fault, in the master's metrics."""
    from server.telemetry import metrics

    family = metrics.WORKER_FORKS if event == "fork" else metrics.ZYGOTE_FAULTS
    metrics.record(lambda: family.labels(detail).inc())


def _never_halt_once_a_worker_booted(server: Any, run_dir: Path) -> None:
    """Master: once a worker has loaded, no worker's exit status halts the whole server.

    NOTE: gunicorn's reap_workers halts the master when a worker exits with 3 (boot error) or 4
    (app load error): right while no worker can start at all, an outage of every model when user
    code in a booted worker calls os._exit(3), which no hook can catch. Before each reap (SIGCHLD,
    main thread) this looks for a worker that reported loaded (the dying one's state file is
    still there) and then shadows the arbiter's two constants with a status no process exits
    with, for good; a worker's own later boot error (spawn_worker's sys.exit of the same
    attribute) then exits 255 and is respawned like any crash.
    """
    reap = server.reap_workers

    def reap_workers() -> None:
        if server.WORKER_BOOT_ERROR != NEVER_AN_EXIT_STATUS and any(s.loaded for s in read_worker_states(run_dir).values()):
            server.WORKER_BOOT_ERROR = server.APP_LOAD_ERROR = NEVER_AN_EXIT_STATUS
        reap()

    server.reap_workers = reap_workers


def on_exit(server: Any) -> None:
    """Master, last thing before it exits: remove what it made in the run directory."""
    if _controller is not None:
        _controller.stop()
    if _zygote is not None:
        _zygote.stop()
    _remove_run_files(Settings.current())


def child_exit(server: Any, worker: Any) -> None:
    """Master, after reaping a worker (SIGKILL included): count the exit, fold its metrics, forget it."""
    from server.telemetry import files, metrics

    settings = Settings.current()
    reason = "timeout" if worker.aborted else read_exit_reason(settings.run_dir, worker.pid) or "killed"
    if _controller is not None:
        _controller.worker_exited(worker.pid, reason, worker.age)  # NOTE: before its state file goes: where it was loading
    metrics.record(lambda: metrics.WORKER_EXITS.labels(reason).inc())
    try:
        files.compact_dead_process(settings.metrics_dir, worker.pid)
    except OSError as exc:  # a full, read-only or removed directory degrades metrics, never the master
        write_errors.report(write_errors.METRICS_ARCHIVE, settings.metrics_dir, exc)
    remove_worker_state(settings.run_dir, worker.pid)  # reports what it cannot remove, never raises
    if connection_board.BOARD is not None and getattr(worker, "forkserve_slot", None) is not None:
        connection_board.BOARD.release(worker.forkserve_slot)  # a SIGKILLed worker could not
        if connection_board.GRPC_BOARD is not None:
            connection_board.GRPC_BOARD.release(worker.forkserve_slot)


def _share_gunicorn_log(server: Any) -> None:
    """Send forkserve's loggers to gunicorn's error log (workers inherit this after fork)."""
    forkserve_log = logging.getLogger("forkserve")
    forkserve_log.handlers = list(server.log.error_log.handlers)
    forkserve_log.setLevel(server.log.error_log.level)
    forkserve_log.propagate = False


def _remove_run_files(settings: Settings) -> None:
    """Remove what forkserve made in the run directory, and the directory itself when that empties it.

    Best effort (a read-only directory keeps what it has), and never through a symlink.
    """
    for directory in (workers_dir(settings.run_dir), settings.metrics_dir, settings.run_dir / control.REQUESTS.parent):
        run_directory.remove_tree(directory)
    for name in (TARGET_FILE, FAILED_FILE, control.INDEX, "gunicorn.pid"):
        run_directory.remove_file(settings.run_dir / name)
    try:
        settings.run_dir.rmdir()  # only when empty: a run directory the user gave may hold more
    except OSError:
        pass


def _clean_run_dir_after_failed_start(master_pid: int) -> None:
    """atexit in the master: a start that failed before gunicorn's own exit path (port in use) leaves nothing."""
    if os.getpid() == master_pid and _controller is None:  # workers inherit this handler; on_exit covers a run
        _remove_run_files(Settings.current())


def pre_fork(server: Any, worker: Any) -> None:
    """Master, before each fork: a slot on the connection board, and the CPU slot the fewest other workers keep.

    A rollout adds a worker before it retires an old one, so with the fleet full the oldest
    workers (retiring ones sort first) do not count: the new worker takes the slot they free.
    """
    if _controller is not None:
        _controller.fleet.mark_newborn(worker)
    if _zygote is None:  # NOTE: with the zygote, its spawn_worker counts who forked (server.master.zygote)
        _record_zygote("fork", "master")
    if connection_board.BOARD is not None:
        worker.forkserve_slot = connection_board.BOARD.free_slot(
            {w.forkserve_slot for w in server.WORKERS.values() if getattr(w, "forkserve_slot", None) is not None})
        if worker.forkserve_slot is None:
            server.log.warning("forkserve: no free slot on the connection board; this worker's connections are not balanced")
    workers = server.cfg.workers  # the configured count; a rollout raises only server.num_workers
    if not Settings.current().pins_for(workers):
        return
    slots = cpus.cpu_slots(cpus.allowed_cpus(), workers)
    staying = sorted(server.WORKERS.values(), key=lambda other: other.age)
    if len(staying) >= workers:
        staying = staying[len(staying) - (workers - 1) :]
    worker.forkserve_cpus = cpus.choose_slot(slots, [getattr(w, "forkserve_cpus", None) for w in staying])
