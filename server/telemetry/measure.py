"""Per-request metrics of the inference APIs: count, end-to-end latency, stage times, in flight.

The request being measured lives in a context variable, not in Flask's `g`: the predict fast path
(server.http.fast_predict) measures requests that never enter Flask, and a context variable costs
a fraction of a `g` lookup. Each request thread runs one request at a time; release() clears it.
"""

from __future__ import annotations

import contextvars
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from server.settings import Settings
from server.telemetry import arrival, metrics, tfserving, tracing
from server.telemetry.buffer import BUFFER
from server.telemetry.lines import LineLimit

log = logging.getLogger("forkserve.slow")

UNKNOWN_MODEL = "_unknown"  # a 404 for a name that is not served must not create a label per name
TFSERVING = False  # record TF Serving's latency histograms too: set once in a worker (FORKSERVE_TFSERVING_METRICS_PATH)


@dataclass
class Inference:
    """What one inference request has recorded so far."""

    model: str
    api: str
    request_id: str = ""
    started: float = field(default_factory=time.perf_counter)
    version: str = ""
    stages: dict[str, float] = field(default_factory=dict)
    version_on_errors: bool = False  # error answers carry X-Model-Version too (the access log's version=)
    protocol: str = "rest"  # "rest" or "grpc" (the metrics' protocol label)
    trace_id: str = ""  # W3C trace id (32 hex digits) when tracing is on (server.telemetry.tracing)
    payload: Any = None  # a sampled request's payloads.capture.Capture (None: not logged)
    trace: tracing.RequestTrace | None = None  # a sampled request's span and stage times (None: not traced)


_CURRENT: contextvars.ContextVar[Inference | None] = contextvars.ContextVar("forkserve_inference", default=None)


def begin(model: str, api: str, request_id: str = "", protocol: str = "rest", carrier: Any = None,
          method: str = "") -> None:
    """Start measuring an inference request of `api` ("predict", "classify", ...) for `model`.

    `carrier` (the WSGI environ, or the gRPC context with its `method`) holds the client's trace context.
    """
    release()  # NOTE: the variable outlives a request on this thread; a stale one must not count twice
    waited = arrival.take_thread_wait()
    inference = Inference(model, api, request_id, started=time.perf_counter() - waited, protocol=protocol)
    if waited:
        inference.stages["thread_wait"] = waited
    if tracing.ENABLED:
        tracing.begin(inference, carrier, method)
    _CURRENT.set(inference)
    BUFFER.add(metrics.INFLIGHT_REQUESTS, (model,), 1)


def current() -> Inference | None:
    """The inference request this thread is answering, if any."""
    return _CURRENT.get()


def set_model(model: str) -> None:
    """The model the request turned out to address (begin() was called before the path was checked)."""
    inference = _CURRENT.get()
    if inference is not None and inference.model != model:
        BUFFER.add(metrics.INFLIGHT_REQUESTS, (inference.model,), -1)
        BUFFER.add(metrics.INFLIGHT_REQUESTS, (model,), 1)
        inference.model = model


def set_version(version: int) -> None:
    """The version that is answering."""
    inference = _CURRENT.get()
    if inference is not None:
        inference.version = str(version)


def label_errors_with_version() -> None:
    """Give this request's error answers the X-Model-Version header its success would carry.

    NOTE: only where a version has started answering (a handler's 400 / 500 / 504); TF Serving's
    own errors, on both the Flask view and the fast path, carry no version header.
    """
    inference = _CURRENT.get()
    if inference is not None:
        inference.version_on_errors = True


def stage(name: str, seconds: float, end: float | None = None) -> None:
    """Add to the time of one stage: decode, preprocess, queue, compute, postprocess or encode (thread_wait: begin).

    `end`: when the stage ended (perf_counter or monotonic seconds), when that was not now.
    """
    inference = _CURRENT.get()
    if inference is not None:
        inference.stages[name] = inference.stages.get(name, 0.0) + seconds
        trace = inference.trace  # NOTE: read once: after a 504, record() clears it while a handler's flow still runs
        if trace is not None:
            end = time.perf_counter() if end is None else end
            trace.stages.append((name, end - seconds, end))


def note_error(error: BaseException) -> None:
    """The failure this request is answered with (its span records the type and the client's message)."""
    inference = _CURRENT.get()
    trace = inference.trace if inference is not None else None
    if trace is not None:
        tracing.note_error(trace, error)


def note_grpc_status(code: int) -> None:
    """The gRPC status this call is answered with (its span's rpc.grpc.status_code)."""
    inference = _CURRENT.get()
    trace = inference.trace if inference is not None else None
    if trace is not None:
        trace.grpc_code = code


def record(status: int) -> None:
    """Count the request being measured with its status code, observe its times, log it if slow."""
    inference = _CURRENT.get()
    if inference is not None:
        model = inference.model
        protocol = inference.protocol
        BUFFER.add(metrics.REQUESTS, (model, inference.version, inference.api, str(status), protocol), 1)
        total = time.perf_counter() - inference.started
        BUFFER.add(metrics.REQUEST_SECONDS, (model, inference.api, protocol), total)
        # NOTE: a copy (one C call, under the GIL): a handler's flow that outlived its request's 504 may still add stages
        stages = dict(inference.stages)
        for name, stage_seconds in stages.items():
            BUFFER.add(metrics.STAGE_SECONDS, (model, name, protocol), stage_seconds)
        if inference.version:
            _record_statistics(model, inference.version, status, total, stages)
        if TFSERVING:
            _record_tfserving(inference, status, total, stages)
        _log_if_slow(inference, status, stages)
        trace = inference.trace
        if trace is not None:
            inference.trace = None  # NOTE: ended once, even if record() is called again
            tracing.end(inference, trace, status)


def _record_statistics(model: str, version: str, status: int, total: float, stages: dict[str, float]) -> None:
    """Triton's statistics of the version that answered: the whole request's time, a success's time per kind."""
    labels = (model, version)
    BUFFER.latest(metrics.LAST_INFERENCE, labels, time.time())
    if status != 200:
        BUFFER.add(metrics.STATS_SECONDS, labels + ("fail",), total)
        return
    get = stages.get
    BUFFER.add_vector(metrics.STATS_SECONDS, labels, STATISTICS_KINDS, (
        total,
        get("thread_wait", 0.0) + get("queue", 0.0),
        get("decode", 0.0) + get("preprocess", 0.0),
        get("compute", 0.0),
        get("postprocess", 0.0) + get("encode", 0.0),
    ))


def _record_tfserving(inference: Inference, status: int, total: float, stages: dict[str, float]) -> None:
    """TF Serving's histograms: any request's wait in the batching queue; a successful TF Serving API request's latencies."""
    # NOTE: TF Serving times every task its batching queue hands to a batch, whatever follows: a request that
    # reached the model ("compute"), not one that gave up waiting
    if "compute" in stages:
        BUFFER.add(metrics.TFSERVING_QUEUING_LATENCY, (tfserving.BATCH_THREAD_POOL,), stages.get("queue", 0.0) * 1e6)
    labels = tfserving.REQUEST_LATENCY_LABELS.get((inference.api, inference.protocol))
    if labels is None or status != 200:  # TF Serving's own are of successes only
        return
    BUFFER.add(metrics.TFSERVING_REQUEST_LATENCY, (inference.model,) + labels, total * 1e6)
    if "compute" in stages:  # NOTE: TF Serving times its session's Run, which waits in the batching queue too
        runtime = tfserving.RUNTIME_LATENCY_LABELS[inference.api]
        BUFFER.add(metrics.TFSERVING_RUNTIME_LATENCY, (inference.model,) + runtime, (stages.get("queue", 0.0) + stages["compute"]) * 1e6)


# Triton's kinds of a successful request's time, from forkserve's stages (what is not in a stage is in none):
# the whole request, queue (thread_wait, queue), compute_input (decode, preprocess), compute_infer (compute),
# compute_output (postprocess, encode)
STATISTICS_KINDS = ("success", "queue", "compute_input", "compute_infer", "compute_output")


def release(_: BaseException | None = None) -> None:
    """The request is no longer in flight, whatever happened (server.dataplane.envelope.release)."""
    inference = _CURRENT.get()
    if inference is not None:
        _CURRENT.set(None)
        BUFFER.add(metrics.INFLIGHT_REQUESTS, (inference.model,), -1)


def _log_if_slow(inference: Inference, status: int, stages: dict[str, float]) -> None:
    """One line with the stage times of a request slower than FORKSERVE_SLOW_REQUEST_MS: where its time went."""
    threshold = Settings.current().slow_request_ms
    total = time.perf_counter() - inference.started
    if not threshold or total * 1000 < threshold:
        return
    suppressed = SLOW_LOG_LIMIT.admit()
    if suppressed is None:
        return
    if suppressed:
        log.warning("%d more slow requests were not logged (at most %d lines a second)", suppressed, SLOW_LOG_LIMIT.per_second)
    times = " ".join(f"{name}={seconds * 1000:.2f}" for name, seconds in stages.items())
    other = total - sum(stages.values())
    log.warning("slow request %s: %s %s version=%s status=%d total_ms=%.2f %s other=%.2f protocol=%s", inference.request_id,
                inference.model, inference.api, inference.version, status, total * 1000, times, other * 1000, inference.protocol)


SLOW_LOG_LIMIT = LineLimit(per_second=20)

