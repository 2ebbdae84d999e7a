"""OpenTelemetry traces: one SERVER span per inference request, its stages as children, one span per batch.

Worker-only and off by default: start() runs in post_worker_init (after fork, before serving) when an
OTLP endpoint is set (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT) and
OTEL_SDK_DISABLED is not true; opentelemetry is imported there, never in the master. While ENABLED
is False the request path checks it (or `Inference.trace is None`) and does nothing else.

Stage spans are made retroactively when the request ends, from the (name, start, end) that
server.telemetry.measure.stage() kept for a sampled request: the request path of an unsampled one
pays for a trace id only.
"""

from __future__ import annotations

import logging
import os
import random
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from server.telemetry import metrics
from server.telemetry.lines import LineLimit

log = logging.getLogger("forkserve.tracing")

ENABLED = False  # set once by start(), in a worker
DEFAULT_SERVICE_NAME = "forkserve"
EXIT_FLUSH_S = 1.5  # a stopping worker gives its exporter this long (an endpoint that hangs must not hold it)
EXPORT_FAILURE_REPORT_S = 60.0  # a collector that is down is reported once a minute per worker, not every retry
DROP_REASONS = ("queue_full", "export_failed")
TFSERVING_VERBS = {"tfserving_predict": "predict", "tfserving_classify": "classify", "tfserving_regress": "regress"}
ROUTES = frozenset(  # every http.route (and span name, after the method) a request can get; anything else gets none
    [f"/v1/models/{{model}}{middle}:{verb}" for verb in TFSERVING_VERBS.values()
     for middle in ("", "/versions/{version}", "/labels/{label}")]
    + ["/v2/models/{model}/infer", "/v2/models/{model}/versions/{version}/infer"])
# NOTE: the paths the Flask views (server.http.tfserving PATH_RE, server.http.v2) and the fast path accept
TFSERVING_PATH = re.compile(r"/v1/models/[^/:]+(?:(/versions/)[^/:]+|(/labels/)[^/:]+)?:([A-Za-z]+)/?")
V2_INFER_PATH = re.compile(r"/v2/models/[^/]+(/versions/[^/]+)?/infer")

_tracer: Any = None
_propagator: Any = None
_processor: Any = None
_context_with_span: Any = None
_error_status: Any = None
_link: Any = None
_server_kind: Any = None
_root_bound: int | None = None  # parent-based ratio sampler: a root trace id is sampled when its low 64 bits are below
_preset = threading.local()  # the trace id begin() drew for a root it decided to sample (_PresetIds hands it to the SDK)
LOW_64 = (1 << 64) - 1
TRACEPARENT = re.compile(r"^[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:(-.*)|[ \t]*)$")  # the SDK's
ERROR_LIMIT = LineLimit(per_second=1)


@dataclass(eq=False)
class RequestTrace:
    """The recording span of one sampled request and what its children will be made of."""

    span: Any
    wall_ns: int  # time.time_ns() at `clock`: turns perf_counter / monotonic seconds into span times
    clock: float
    stages: list[tuple[str, float, float]] = field(default_factory=list)  # (name, start, end) in perf_counter seconds
    rows: int = 0
    signature: str = ""
    error: tuple[str, str] | None = None  # (exception type, message) of the failure being answered
    grpc_code: int | None = None

    def ns(self, seconds: float) -> int:
        """A perf_counter (or monotonic: the same clock on Linux) time as a span time."""
        return self.wall_ns + int((seconds - self.clock) * 1e9)


def wanted(environ: dict[str, str] | os._Environ = os.environ) -> bool:
    """Whether the environment asks for traces: an OTLP endpoint, and the SDK not disabled."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def start() -> bool:
    """Worker, after fork: the SDK with an OTLP/HTTP exporter behind a bounded batch processor; False when off."""
    global ENABLED, _tracer, _propagator, _processor, _context_with_span, _error_status, _link, _server_kind, _root_bound
    if ENABLED or not wanted():
        return ENABLED
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
    from opentelemetry.trace import (
        Link,
        SpanKind,
        Status,
        StatusCode,
        set_span_in_context,
    )
    from opentelemetry.trace.propagation.tracecontext import (
        TraceContextTextMapPropagator,
    )

    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
    sampler, _root_bound = _sampler()

    class _PresetIds(RandomIdGenerator):
        """Random ids, except the root trace id begin() already drew and sampled on this thread."""

        def generate_trace_id(self) -> int:
            preset = getattr(_preset, "trace_id", 0)
            if preset:
                _preset.trace_id = 0
                return preset
            return super().generate_trace_id()

    provider = TracerProvider(resource=resource, sampler=sampler, id_generator=_PresetIds())
    # NOTE: the exporter logs every retry of every failed export (unformatted, to stderr); a down
    # collector is counted and reported by _CountingExporter instead
    logging.getLogger("opentelemetry.exporter.otlp").setLevel(logging.CRITICAL)
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    _processor = BatchSpanProcessor(_CountingExporter(OTLPSpanExporter(session=exporter_session()), endpoint))
    _count_queue_drops(_processor)
    provider.add_span_processor(_processor)
    _tracer = provider.get_tracer("forkserve")
    _propagator = TraceContextTextMapPropagator()
    _context_with_span, _link, _server_kind = set_span_in_context, Link, SpanKind.SERVER
    _error_status = lambda message: Status(StatusCode.ERROR, message)  # noqa: E731
    for reason in DROP_REASONS:  # at 0 from the start
        metrics.record(lambda reason=reason: metrics.TRACE_SPANS_DROPPED.labels(reason))
    ENABLED = True
    return True


CREDENTIAL_PROVIDER_VARIABLES = ("OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER",
                                 "OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER")


def exporter_session() -> Any:
    """The OTLP exporter's session: bounded answers and time, no redirects (bounded_http); None: a credential provider's, unbounded."""
    if any(os.environ.get(name) for name in CREDENTIAL_PROVIDER_VARIABLES):
        return None
    from server.telemetry.bounded_http import BoundedSession

    return BoundedSession()


def _sampler() -> tuple[Any, int | None]:
    """(sampler, root bound): parentbased_traceidratio at OTEL_TRACES_SAMPLER_ARG (1.0) unless OTEL_TRACES_SAMPLER names another.

    The bound lets begin() decide as this sampler would before any SDK call (None: another sampler, the SDK decides).
    """
    named = os.environ.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if named and named != "parentbased_traceidratio":
        return None, None  # the SDK reads the variables itself
    from opentelemetry.sdk.trace.sampling import (
        ParentBasedTraceIdRatio,
        TraceIdRatioBased,
    )

    try:
        ratio = min(1.0, max(0.0, float(os.environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0"))))
    except ValueError:
        ratio = 1.0
    return ParentBasedTraceIdRatio(ratio), TraceIdRatioBased.get_bound_for_rate(ratio)


def parse_traceparent(header: str) -> tuple[int, bool] | None:
    """(trace id, sampled flag) of a W3C traceparent; None when absent or invalid, by the SDK propagator's rules."""
    match = TRACEPARENT.search(header) if 0 < len(header) <= 512 else None
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if trace_id == "0" * 32 or span_id == "0" * 16 or version == "ff" or (version == "00" and rest):
        return None
    return int(trace_id, 16), bool(int(flags, 16) & 1)


def pre_sample(header: str, bound: int) -> tuple[int, bool, bool]:
    """(trace id, sampled, root) as the parent-based ratio sampler will decide them, for a request with `header`."""
    parent = parse_traceparent(header)
    if parent is not None:
        return parent[0], parent[1], False
    trace_id = random.getrandbits(128) or 1
    return trace_id, (trace_id & LOW_64) < bound, True


def stop() -> None:
    """Worker exit: export what is queued, for EXIT_FLUSH_S at most."""
    if _processor is None:
        return
    # NOTE: BatchSpanProcessor.shutdown() takes no timeout (SDK 1.45): the bounded join below is the limit
    flushing = threading.Thread(target=_processor.shutdown, name="trace-exit-flush", daemon=True)
    flushing.start()
    flushing.join(EXIT_FLUSH_S + 0.5)


def count_dropped(reason: str, spans: int) -> None:
    """Count spans that never reached the collector."""
    if spans:
        metrics.record(lambda: metrics.TRACE_SPANS_DROPPED.labels(reason).inc(spans))


class _CountingExporter:
    """The OTLP exporter, with every span of a failed export counted (endpoint down, 5xx, timeout)."""

    def __init__(self, exporter: Any, endpoint: str) -> None:
        self._exporter = exporter
        self._endpoint = endpoint
        self._failed_spans = 0  # since the last report (the exporter thread alone touches these)
        self._reported = -EXPORT_FAILURE_REPORT_S

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        problem = "down, refusing or too slow"
        try:
            result = self._exporter.export(spans)
        except Exception as exc:  # the processor would log it; counted here like any failure
            result, problem = SpanExportResult.FAILURE, repr(exc)
        if result != SpanExportResult.SUCCESS:
            count_dropped("export_failed", len(spans))
            self._failed_spans += len(spans)
            if time.monotonic() - self._reported >= EXPORT_FAILURE_REPORT_S:
                self._reported = time.monotonic()
                log.warning("trace export to %s failed (%s): %d spans dropped since the last report, counted in "
                            "forkserve_trace_spans_dropped_total", self._endpoint, problem, self._failed_spans)
                self._failed_spans = 0
        return result

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)


class _QueueDrops:
    """The batch processor's own metrics hook, counting its queue overflows too."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def drop_items(self, count: int, error_type: str = "queue_full") -> None:
        count_dropped("queue_full" if error_type == "queue_full" else "export_failed", count)
        self._inner.drop_items(count, error_type)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _count_queue_drops(processor: Any) -> None:
    """Hook the processor's drop count (NOTE: SDK internals, 1.45; the queue stays bounded without the count)."""
    inner = getattr(processor, "_batch_processor", None)
    if inner is not None and hasattr(inner, "_metrics"):
        inner._metrics = _QueueDrops(inner._metrics)
    else:
        log.warning("this opentelemetry-sdk hides its queue: spans dropped on a full queue are not counted")


def _log_once(message: str, *args: Any) -> None:
    """A tracing problem, logged at most once a second (it must never cost a request)."""
    if ERROR_LIMIT.admit() is not None:
        log.warning(message, *args)


# --- the request path (called only while ENABLED) ---


class _EnvironGetter:
    """W3C headers from a WSGI environ."""

    def get(self, carrier: dict[str, Any], key: str) -> list[str] | None:
        value = carrier.get("HTTP_" + key.upper().replace("-", "_"))
        return [value] if value else None

    def keys(self, carrier: dict[str, Any]) -> list[str]:
        return [name[5:].lower().replace("_", "-") for name in carrier if name.startswith("HTTP_")]


class _MetadataGetter:
    """W3C headers from gRPC invocation metadata."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        values = [value for name, value in carrier.invocation_metadata() if name == key and isinstance(value, str)]
        return values or None

    def keys(self, carrier: Any) -> list[str]:
        return [name for name, _ in carrier.invocation_metadata()]


ENVIRON_GETTER = _EnvironGetter()
METADATA_GETTER = _MetadataGetter()


def begin(inference: Any, carrier: Any = None, method: str = "") -> None:
    """Start the request's SERVER span, continuing the client's trace: its trace id, and `inference.trace` when sampled.

    `carrier`: the request's WSGI environ (None: none known), or the gRPC servicer context with `method`.
    """
    try:
        if _root_bound is not None:  # NOTE: an unsampled request (most, at a low ratio) must cost a trace id, no SDK call
            header = _traceparent(inference, carrier)
            trace_id, sampled, root = pre_sample(header, _root_bound)
            if not sampled:
                inference.trace_id = format(trace_id, "032x")
                return
            if root:
                _preset.trace_id = trace_id
        wall_ns, clock = time.time_ns(), time.perf_counter()
        if inference.protocol == "grpc":
            parent = _propagator.extract(carrier, getter=METADATA_GETTER)
            name = method.lstrip("/")
            service, _, rpc_method = name.rpartition("/")
            attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": rpc_method,
                          "network.protocol.name": "http", "network.protocol.version": "2"}
            peer = carrier.peer() or ""  # "ipv4:127.0.0.1:5000"
            if peer:
                attributes["client.address"] = peer.split(":", 1)[-1].rsplit(":", 1)[0].strip("[]")
        else:
            environ = carrier if carrier is not None else {}
            parent = _propagator.extract(environ, getter=ENVIRON_GETTER)
            path = environ.get("PATH_INFO", "")
            route = http_route(inference.api, path)
            # NOTE: only POSTs begin (the fast path, the views' POST branch), so the method is one semconv knows
            http_method = environ.get("REQUEST_METHOD", "POST")
            name = f"{http_method} {route}" if route is not None else http_method  # semconv: "{method}" when no route
            attributes = {"http.request.method": http_method, "url.path": path,
                          "url.scheme": environ.get("wsgi.url_scheme", "http"),
                          "network.protocol.name": "http",
                          "network.protocol.version": environ.get("SERVER_PROTOCOL", "HTTP/1.1").rpartition("/")[2],
                          "client.address": environ.get("REMOTE_ADDR", "")}
            if route is not None:
                attributes["http.route"] = route
            host = environ.get("HTTP_HOST") or environ.get("SERVER_NAME", "")
            if host:
                address, _, port = host.rpartition(":") if host.rpartition(":")[2].isdigit() else (host, "", "")
                attributes["server.address"] = address.strip("[]")
                if port:
                    attributes["server.port"] = int(port)
        attributes["forkserve.request_id"] = inference.request_id
        span = _tracer.start_span(name, context=parent, kind=_server_kind, attributes=attributes,
                                  start_time=wall_ns + int((inference.started - clock) * 1e9))
        inference.trace_id = format(span.get_span_context().trace_id, "032x")
        if span.is_recording():
            trace = RequestTrace(span, wall_ns, clock)
            waited = inference.stages.get("thread_wait")
            if waited:
                trace.stages.append(("thread_wait", inference.started, inference.started + waited))
            inference.trace = trace
    except Exception as exc:  # NOTE: a tracing bug costs the trace, never the request
        _preset.trace_id = 0
        _log_once("tracing a request failed: %r", exc)


def http_route(api: str, path: str) -> str | None:
    """The route template of a REST request to `api` at `path` (one of ROUTES), or None when it is none of them.

    NOTE: an unknown verb, a malformed path or a path of another API has no route: a raw path as a
    span name or http.route would make one name per path (a client chooses them, thousands of
    characters long).
    """
    if api == "v2_infer":
        match = V2_INFER_PATH.fullmatch(path)
        if match is None:
            return None
        return "/v2/models/{model}/versions/{version}/infer" if match[1] else "/v2/models/{model}/infer"
    verb = TFSERVING_VERBS.get(api)
    match = TFSERVING_PATH.fullmatch(path) if verb is not None else None
    if match is None or match[3].lower() != verb:
        return None
    middle = "/versions/{version}" if match[1] else "/labels/{label}" if match[2] else ""
    return f"/v1/models/{{model}}{middle}:{verb}"


def _traceparent(inference: Any, carrier: Any) -> str:
    """The request's traceparent header ("" when it has none)."""
    if inference.protocol == "grpc":
        return next((value for name, value in carrier.invocation_metadata() if name == "traceparent" and isinstance(value, str)), "")
    return carrier.get("HTTP_TRACEPARENT", "") if carrier is not None else ""


def note_error(trace: RequestTrace, error: BaseException) -> None:
    """The failure the request is answered with: its type, and forkserve's message to the client (never a handler's, never the payload)."""
    from server.errors import ApiError

    if not isinstance(error, ApiError):
        message = "internal error"
    elif error.quotes_user_code:
        message = "refused by the model's handler (its message is in the response, not in the trace)"
    else:
        message = error.message
    trace.error = (type(error).__qualname__, message)


def end(inference: Any, trace: RequestTrace, status: int) -> None:
    """End the request's span: its outcome, its model attributes, and its stages as children."""
    try:
        span = trace.span
        span.set_attribute("forkserve.model", inference.model)
        span.set_attribute("forkserve.model.version", inference.version)
        span.set_attribute("forkserve.api", inference.api)
        if trace.rows:
            span.set_attribute("forkserve.rows", trace.rows)
        if trace.signature:
            span.set_attribute("forkserve.signature", trace.signature)
        failed = status >= 400
        if inference.protocol == "grpc":
            code = trace.grpc_code if trace.grpc_code is not None else (0 if status < 400 else 2)
            span.set_attribute("rpc.grpc.status_code", code)
            failed = code != 0
        else:
            span.set_attribute("http.response.status_code", status)
        if failed:
            kind, message = trace.error or (str(status), f"status {status}")
            span.set_attribute("error.type", kind)
            if trace.error is not None:
                span.add_event("exception", {"exception.type": kind, "exception.message": message})
            span.set_status(_error_status(message))
        context = _context_with_span(span)
        for name, started, ended in list(trace.stages):
            child = _tracer.start_span(name, context=context, start_time=trace.ns(started))
            child.end(end_time=trace.ns(ended))
        span.end()
    except Exception as exc:
        _log_once("ending a request's span failed: %r", exc)


def batch(model: str, jobs: list[Any]) -> None:
    """One span for a TensorFlow call that served >= 1 sampled request: a child of the first, linked to each."""
    traced = [job for job in jobs if job.trace is not None]
    if not traced:
        return
    try:
        wall_ns, clock = time.time_ns(), time.monotonic()
        started = min(job.started for job in jobs)
        finished = max(job.finished or clock for job in jobs)
        attributes = {"forkserve.model": model, "forkserve.signature": jobs[0].signature,
                      "forkserve.batch.rows": sum(job.rows for job in jobs), "forkserve.batch.jobs": len(jobs),
                      "forkserve.batch.traced_jobs": len(traced)}
        first = traced[0].trace
        span = _tracer.start_span("batch", context=_context_with_span(_non_recording(first)),
                                  links=[_link(job.trace) for job in traced], attributes=attributes,
                                  start_time=wall_ns + int((started - clock) * 1e9))
        span.end(end_time=wall_ns + int((finished - clock) * 1e9))
    except Exception as exc:
        _log_once("tracing a batch failed: %r", exc)


def _non_recording(span_context: Any) -> Any:
    """A parent for a span from another thread: the request's span context wrapped as a span."""
    from opentelemetry.trace import NonRecordingSpan

    return NonRecordingSpan(span_context)


def loaded() -> bool:
    """Whether this process imported the OpenTelemetry SDK (tests, diagnostics)."""
    return "opentelemetry.sdk.trace" in sys.modules
