"""Every Prometheus metric of forkserve, defined once at module level (multiprocess mode).

PROMETHEUS_MULTIPROC_DIR must be in the environment before this module is first imported in
any process: gunicorn.conf.py exports it (Settings.export) before it imports the hooks. Gauges
use live* modes so a dead worker stops counting once the master marks it dead (child_exit).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Callable

from prometheus_client import Counter, Gauge, Histogram

from server import compat, write_errors
from server.settings import Settings
from server.telemetry import tfserving

log = logging.getLogger("forkserve.metrics")


if not compat.reserve_metric_file_blocks():
    log.warning("metric files are sparse with this prometheus_client: a full disk can kill a worker (SIGBUS)")


def _ensure_directory() -> None:
    """Recreate a removed multiprocess directory: unlabelled metrics open their file at import."""
    settings = Settings.from_env()
    if settings.multiprocess_metrics:
        try:
            settings.metrics_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("cannot create the metrics directory %s: %s", settings.metrics_dir, exc)


_ensure_directory()
# NOTE: the master forks workers from its main thread while its rollout thread may be writing a
# metric under prometheus_client's global lock; a child forked then would inherit that lock held
# and hang at its first metric. Every write takes this lock, and so does every fork.
_writes = threading.Lock()
os.register_at_fork(before=_writes.acquire, after_in_parent=_writes.release, after_in_child=_writes.release)


def _raised_by_prometheus_client(exc: BaseException) -> bool:
    """Whether the innermost frame of the exception's traceback is prometheus_client's own code."""
    trace = exc.__traceback__
    while trace is not None and trace.tb_next is not None:
        trace = trace.tb_next
    return trace is not None and f"{os.sep}prometheus_client{os.sep}" in trace.tb_frame.f_code.co_filename


def _apply(update: Callable[[], object]) -> BaseException | None:
    """Apply one update; the error of a broken metrics directory is returned, any other propagates."""
    try:
        with _writes:
            update()
    except (OSError, TypeError, ValueError) as exc:
        if not isinstance(exc, OSError) and not _raised_by_prometheus_client(exc):
            raise
        return exc
    return None


def record(update: Callable[[], object]) -> None:
    """Apply one metric update; a broken metrics directory (removed, a file, read-only, full) costs the update only.

    NOTE: multiprocess values live in mmapped files under PROMETHEUS_MULTIPROC_DIR. A write that
    opens or grows a file fails with an OSError when the directory is gone, read-only or full
    (compat.reserve_metric_file_blocks makes "full" an error instead of a SIGBUS); after a
    worker's first write failed to reopen its files (prometheus_client reopens them all after
    fork), the values whose files it did not reopen stay closed for the worker's life, and their
    writes fail inside prometheus_client with a TypeError or ValueError. Those updates are dropped
    (the request or load they describe goes on) and counted in
    forkserve_run_dir_write_errors_total{file="metrics"} when that still can be; the OSError is
    logged once per kind (server.write_errors). Any other exception is a bug and propagates.
    """
    error = _apply(update)
    if isinstance(error, OSError):
        write_errors.report(write_errors.METRICS, error.filename or os.environ.get("PROMETHEUS_MULTIPROC_DIR", ""), error)
    elif error is not None:  # a value left closed by an OSError reported before
        count_run_dir_write_error(write_errors.METRICS)


def count_run_dir_write_error(file: str) -> None:
    """Count one failed write in the run directory; lost silently when the metric's own file cannot be written."""
    _apply(lambda: RUN_DIR_WRITE_ERRORS.labels(file).inc())

# 100 µs .. 10 s, roughly 2.5x apart: resolves a 0.3 ms MLP call and a 5 s stall alike.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

# --- model load state (worker) ---
MODEL_WORKERS_READY = Gauge(
    "forkserve_model_workers_ready", "Workers that have this model version loaded and warm.",
    ["model", "version"], multiprocess_mode="livesum",
)
MODEL_WORKERS_LOADING = Gauge(
    "forkserve_model_workers_loading", "Workers loading this model version now.",
    ["model", "version"], multiprocess_mode="livesum",
)
MODEL_LOAD_FAILURES = Counter(
    "forkserve_model_load_failures", "Model versions that failed to load or warm up.", ["model", "version"],
)
MODEL_LOAD_SECONDS = Histogram(
    "forkserve_model_load_duration_seconds", "Load plus warm-up time of one model version in one worker.",
    ["model"], buckets=LOAD_BUCKETS,
)
MODEL_RETRACES = Counter(
    "forkserve_model_retraces", "TensorFlow traces after warm-up (each is a latency spike; should stay 0).",
    ["model"],
)

# --- requests (worker, request threads) ---
REQUESTS = Counter(
    "forkserve_requests", "Inference API requests by outcome (code: the HTTP status, for gRPC the one REST would answer).",
    ["model", "version", "api", "code", "protocol"],
)
REQUEST_SECONDS = Histogram(
    "forkserve_request_duration_seconds", "Inference request time inside the worker, end to end.",
    ["model", "api", "protocol"], buckets=LATENCY_BUCKETS,
)
STAGE_SECONDS = Histogram(
    "forkserve_request_stage_duration_seconds", "Time per request stage: thread_wait (for a request thread), decode, preprocess, queue, compute, postprocess, encode.",
    ["model", "stage", "protocol"], buckets=LATENCY_BUCKETS,
)

# --- TF Serving's latency histograms (worker, request threads; FORKSERVE_TFSERVING_METRICS_PATH set only) ---
# NOTE: recorded with TF Serving's own bounds, in microseconds, and written only under TF Serving's names
# (server.telemetry.tfserving): histogram buckets cannot be re-bucketed from forkserve's own.
TFSERVING_REQUEST_LATENCY = Histogram(
    tfserving.HISTOGRAMS[tfserving.REQUEST_LATENCY], "Successful TF Serving API requests' time, in microseconds.",
    ["model_name", "API", "entrypoint"], buckets=tfserving.LATENCY_BOUNDS_US,
)
TFSERVING_RUNTIME_LATENCY = Histogram(
    tfserving.HISTOGRAMS[tfserving.RUNTIME_LATENCY], "Successful TF Serving API requests' queue plus compute time, in microseconds.",
    ["model_name", "API", "runtime"], buckets=tfserving.LATENCY_BOUNDS_US,
)
TFSERVING_QUEUING_LATENCY = Histogram(
    tfserving.HISTOGRAMS[tfserving.QUEUING_LATENCY], "Requests' wait in a model's queue, in microseconds.",
    ["thread_pool_name"], buckets=tfserving.QUEUING_BOUNDS_US,
)

# --- executor (worker, executor threads) ---
BATCH_ROWS = Histogram(
    "forkserve_batch_size_rows", "Rows per TensorFlow call, before padding.", ["model"], buckets=BATCH_BUCKETS,
)
QUEUE_ROWS = Gauge(
    "forkserve_queue_rows", "Rows waiting in a model's queue.", ["model"], multiprocess_mode="livesum",
)
INFLIGHT_REQUESTS = Gauge(
    "forkserve_inflight_requests", "Inference requests being handled now.", ["model"], multiprocess_mode="livesum",
)
REJECTED_REQUESTS = Counter(
    "forkserve_rejected_requests", "Requests refused without running: queue full or deadline passed.",
    ["model", "reason"],
)

# --- Triton's statistics extension (worker), per model version (server.telemetry.statistics reads them) ---
STATS_SECONDS = Counter(
    "forkserve_inference_stats_seconds",
    "Time per model version, as Triton's statistics count it: success and fail (whole requests, counted by "
    "forkserve_requests_total), and successful requests' queue, compute_input, compute_infer and compute_output.",
    ["model", "version", "kind"],
)
BATCH_EXECUTIONS = Counter(
    "forkserve_batch_executions", "Model executions per version and batch size (rows, before padding).",
    ["model", "version", "batch_size"],
)
BATCH_SECONDS = Counter(
    "forkserve_batch_stats_seconds",
    "Executor time per version and batch size: compute_input (assembling the batch), compute_infer (the model), "
    "compute_output (splitting its answers).",
    ["model", "version", "batch_size", "kind"],
)
LAST_INFERENCE = Gauge(
    "forkserve_last_inference_timestamp_seconds", "When a model version last answered an inference request (Unix time).",
    ["model", "version"], multiprocess_mode="max",
)

GRPC_REFUSED_CALLS = Counter(
    "forkserve_grpc_refused_calls",
    "gRPC calls ended before their method ran, by reason: busy (FORKSERVE_GRPC_MAX_CALLS calls at work), receiving "
    "(1024 calls waiting for their message), receive_timeout (no message within FORKSERVE_CLIENT_TIMEOUT), "
    "invalid_message (not the method's protobuf message).",
    ["reason"],
)
GRPC_REFUSAL_REASONS = ("busy", "receiving", "receive_timeout", "invalid_message")

TRACE_SPANS_DROPPED = Counter(
    "forkserve_trace_spans_dropped",
    "Trace spans that never reached the collector: queue_full (the batch processor's queue, OTEL_BSP_MAX_QUEUE_SIZE) "
    "or export_failed (endpoint down, refusing or timing out).",
    ["reason"],
)

# --- connections (worker, main and closer threads) ---
CONNECTION_CLOSES = Counter(
    "forkserve_connection_closes",
    "Connections closed after an answer with Connection: close or an unread body, by how: lingered (the client "
    "closed first), cut_short (it still sent after 5 s or 64 MiB) or at_once (64 closes were lingering already).",
    ["how"],
)

# --- workers (master and worker) ---
WORKERS_ALIVE = Gauge(
    "forkserve_workers_alive", "Worker processes that finished booting and are alive.", multiprocess_mode="livesum",
)
PAYLOAD_LOG_DROPPED = Counter(
    "forkserve_payload_log_dropped", "Sampled payload records not logged, by reason: queue_full, write_failed, "
    "redact_failed (written without inputs), encode_failed, shutdown (queued when the worker stopped).", ["reason"],
)
WORKER_BOOTS = Counter("forkserve_worker_boots", "Workers that finished booting (models loaded or failed).")
WORKER_EXITS = Counter(
    "forkserve_worker_exits", "Worker exits seen by the master, by reason.", ["reason"],
)
WORKER_FORKS = Counter(
    "forkserve_worker_forks", "Workers forked, by which process: zygote (from the template that imported "
    "TensorFlow) or master (the zygote is off, starting again after a fault, or could not fork).", ["by"],
)
ZYGOTE_FAULTS = Counter(
    "forkserve_zygote_faults", "Zygote faults, by kind: exited, import_failed, start_timeout, fork_timeout, "
    "fork_failed. The master forks workers itself until a new zygote is ready.", ["kind"],
)

# --- rollouts and the repository (master) ---
ROLLOUTS = Counter(
    "forkserve_rollouts", "Rolling restarts by result: succeeded, failed (versions marked failed) or gave_up.",
    ["result"],
)
ROLLOUT_RETRIES = Counter(
    "forkserve_rollout_retries", "Rollout tries whose new worker died or was not ready in time, tried again.",
)
ROLLOUT_FAILED_VERSIONS = Counter(
    "forkserve_rollout_failed_versions", "Model versions marked failed (never served): by a rollout or repeated deaths.",
    ["model", "version"],
)
ROLLOUT_IN_PROGRESS = Gauge(
    "forkserve_rollout_in_progress", "1 while a rolling restart runs.", multiprocess_mode="livemax",
)
MODEL_VERSION_CHANGES = Counter(
    "forkserve_model_version_changes", "Files of a settled version that changed on disk (versions are immutable).",
    ["model", "version"],
)
RUN_DIR_WRITE_ERRORS = Counter(
    "forkserve_run_dir_write_errors",
    "Writes in the run directory that failed (disk full, read-only, not permitted), by file "
    "(server.write_errors).",
    ["file"],
)
for _file in write_errors.FILES:  # every series in each process's file from the start: a full disk cannot refuse them later
    RUN_DIR_WRITE_ERRORS.labels(_file)
write_errors.count_with(count_run_dir_write_error)
VERSION_FAILED = Gauge(
    "forkserve_version_failed", "1 while the master marks a model version failed (never served; the reason is in its status).",
    ["model", "version"], multiprocess_mode="livemax",
)
MODEL_UNSERVABLE = Gauge(
    "forkserve_model_unservable", "1 while nothing of a model in the repository can be served (the reason is in /readyz).",
    ["model"], multiprocess_mode="livemax",
)
CONFIG_LAST_RELOAD_SUCCESSFUL = Gauge(
    "forkserve_config_last_reload_successful",
    "1 when conf/models.toml as last read is valid, 0 while the master keeps the last good configuration.",
    multiprocess_mode="livemax",
)
TLS_LAST_RELOAD_SUCCESSFUL = Gauge(
    "forkserve_tls_last_reload_successful",
    "1 when the FORKSERVE_TLS_* files as last read are valid, 0 while the workers keep the last good certificate (TLS on only).",
    multiprocess_mode="livemax",
)
