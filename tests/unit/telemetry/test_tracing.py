"""The cheap sampling decision tracing.begin() makes before any SDK call agrees with the SDK's own."""

from __future__ import annotations

import random

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.sampling import Decision, ParentBasedTraceIdRatio, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from server.telemetry import tracing

TRACE, SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
HEADERS = [
    f"00-{TRACE}-{SPAN}-01", f"00-{TRACE}-{SPAN}-00", f"00-{TRACE}-{SPAN}-03", f"  00-{TRACE}-{SPAN}-01 ",
    f"01-{TRACE}-{SPAN}-01-future", f"00-{TRACE}-{SPAN}-01-extra", f"ff-{TRACE}-{SPAN}-01",
    f"00-{'0' * 32}-{SPAN}-01", f"00-{TRACE}-{'0' * 16}-01", f"00-{TRACE.upper()}-{SPAN}-01",
    f"00-{TRACE[:-1]}-{SPAN}-01", "", "garbage", f"00-{TRACE}-{SPAN}-0x", "00-" + "a" * 600,
]


def propagated(header: str) -> tuple[int, bool] | None:
    """What the SDK's propagator makes of `header`: (trace id, sampled) of a valid parent, else None."""
    context = TraceContextTextMapPropagator().extract({"traceparent": header} if header else {})
    parent = trace.get_current_span(context).get_span_context()
    return (parent.trace_id, parent.trace_flags.sampled) if parent.is_valid else None


@pytest.mark.parametrize("header", HEADERS)
def test_traceparent_is_read_as_the_sdk_reads_it(header: str) -> None:
    assert tracing.parse_traceparent(header) == propagated(header)


@pytest.mark.parametrize("ratio", [0.0, 0.01, 0.5, 1.0])
def test_root_decisions_match_the_parent_based_ratio_sampler(ratio: float) -> None:
    sampler, bound = ParentBasedTraceIdRatio(ratio), TraceIdRatioBased.get_bound_for_rate(ratio)
    random.seed(21)
    decided = []
    for _ in range(2000):
        trace_id, sampled, root = tracing.pre_sample("", bound)
        assert root and 0 < trace_id < 1 << 128
        assert sampled == (sampler.should_sample(None, trace_id, "x").decision == Decision.RECORD_AND_SAMPLE)
        decided.append(sampled)
    assert sum(decided) == pytest.approx(2000 * ratio, abs=2000 * 0.02 + 1)


def test_a_parent_decides_for_its_children() -> None:
    bound = TraceIdRatioBased.get_bound_for_rate(0.0)
    assert tracing.pre_sample(f"00-{TRACE}-{SPAN}-01", bound) == (int(TRACE, 16), True, False)
    assert tracing.pre_sample(f"00-{TRACE}-{SPAN}-00", TraceIdRatioBased.get_bound_for_rate(1.0)) == (int(TRACE, 16), False, False)


def test_an_errors_span_message_never_quotes_a_handler() -> None:
    from server.errors import InvalidArgument
    from server.dataplane.handler_flow import HandlerRefused

    trace = tracing.RequestTrace(span=None, wall_ns=0, clock=0.0)
    tracing.note_error(trace, HandlerRefused("card 4111-1111-1111-1111 is blocked"))
    assert trace.error[0] == "HandlerRefused" and "4111" not in trace.error[1]
    tracing.note_error(trace, InvalidArgument("input 'x' takes float32 numbers"))
    assert trace.error == ("InvalidArgument", "input 'x' takes float32 numbers")
    tracing.note_error(trace, KeyError("secret"))
    assert trace.error == ("KeyError", "internal error")


@pytest.mark.parametrize(("api", "path", "route"), [
    ("tfserving_predict", "/v1/models/mlp:predict", "/v1/models/{model}:predict"),
    ("tfserving_predict", "/v1/models/mlp/versions/12:predict", "/v1/models/{model}/versions/{version}:predict"),
    ("tfserving_predict", "/v1/models/mlp/labels/stable:PREDICT/", "/v1/models/{model}/labels/{label}:predict"),
    ("tfserving_classify", "/v1/models/versions:classify", "/v1/models/{model}:classify"),  # a model named "versions"
    ("tfserving_regress", "/v1/models/m/labels/versions:regress", "/v1/models/{model}/labels/{label}:regress"),
    ("v2_infer", "/v2/models/mlp/infer", "/v2/models/{model}/infer"),
    ("v2_infer", "/v2/models/mlp/versions/1/infer", "/v2/models/{model}/versions/{version}/infer"),
    ("v2_infer", "/v2/models/no-such-model-123/infer", "/v2/models/{model}/infer"),  # a 404, on a route all the same
])
def test_a_request_on_a_route_gets_its_template(api: str, path: str, route: str) -> None:
    assert tracing.http_route(api, path) == route and route in tracing.ROUTES


@pytest.mark.parametrize(("api", "path"), [
    ("tfserving_other", "/v1/models/m-123:frobnicate-456"),  # an unknown verb (the catch-all view's api)
    ("tfserving_other", "/v1/models/mlp:" + "x" * 3000),
    ("tfserving_other", "/v1/models/mlp/metadata"),  # a POST to a GET route
    ("tfserving_predict", "/v1/models/a/b/c:predict"),  # malformed, but _verb_of says predict
    ("tfserving_predict", "/v1/models/mlp:classify"),  # the path's verb is not the api's
    ("tfserving_predict", "/v1/models/mlp/versions/1/labels/x:predict"),
    ("tfserving_predict", "/v1/models/mlp:predict\n"),
    ("v2_infer", "/v2/models/mlp/versions/1/2/infer"),
    ("v2_infer", "/v2/models/mlp/infer/" + "y" * 3000),
    ("", "/v1/models/mlp:predict"),
])
def test_a_request_on_no_route_gets_none(api: str, path: str) -> None:
    assert tracing.http_route(api, path) is None


def test_the_route_set_is_small_and_fixed() -> None:
    assert len(tracing.ROUTES) == 11 and all(len(route) < 60 and "{model}" in route for route in tracing.ROUTES)


@pytest.mark.parametrize("mode", ["trickle", "trickle_headers", "huge", "redirect"])
def test_the_exporter_forkserve_builds_is_bounded_by_a_hostile_collector(mode: str) -> None:
    import time
    import tracemalloc

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider

    from tests.support.hostile_receiver import HostileReceiver

    span = TracerProvider().get_tracer("t").start_span("x")
    span.end()
    with HostileReceiver(mode, size=256 << 20, interval=0.2) as collector, HostileReceiver() as elsewhere:
        collector.location = elsewhere.url
        exporter = OTLPSpanExporter(endpoint=collector.url, timeout=1.5, session=tracing.exporter_session())
        tracemalloc.start()
        started = time.monotonic()
        try:
            exporter.export([span])
            seconds, peak = time.monotonic() - started, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            exporter.shutdown()
    assert seconds < 3 and peak < 1 << 20, (seconds, peak)  # the export's whole timeout; a few KB of the answer
    assert elsewhere.posts == 0
