"""A test OTLP/HTTP trace receiver: decodes real ExportTraceServiceRequest protobufs; answers 200, 503, hangs, or 200 with 256 MiB."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

HUGE = 256 << 20
ZEROS = b"\0" * (1 << 20)


@dataclass(frozen=True)
class Span:
    """One received span, ids as hex."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str]]  # (trace id, span id)
    service: str


def _value(any_value: Any) -> Any:
    """An OTLP AnyValue as Python."""
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


class Receiver:
    """OTLP/HTTP on 127.0.0.1:<port>/v1/traces; `mode` is "ok", "503", "hang" or "huge" (switchable while running)."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.spans: list[Span] = []
        self.posts = 0
        self._lock = threading.Lock()
        self._release = threading.Event()  # ends the hangs
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    receiver.posts += 1
                mode = receiver.mode
                if mode == "hang":
                    receiver._release.wait(60)
                    return
                if mode == "huge":  # 200, then an answer no exporter should read: its spans are not kept
                    self.send_response(200)
                    self.send_header("Content-Length", str(HUGE))
                    self.end_headers()
                    try:
                        for _ in range(HUGE // len(ZEROS)):
                            self.wfile.write(ZEROS)
                    except OSError:
                        pass
                    return
                if mode == "503":
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                receiver._take(body)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self._handler = Handler
        self.port = 0
        self.open()
        self.endpoint = f"http://127.0.0.1:{self.port}/v1/traces"

    def open(self) -> None:
        """Listen (again, after close(): on the same port, so a server's endpoint reaches it again)."""
        self._release.clear()
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource_spans in request.resource_spans:
            service = _attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found = Span(
                        span.name, span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(), span.kind,
                        span.start_time_unix_nano, span.end_time_unix_nano, _attributes(span.attributes),
                        span.status.code, span.status.message,
                        [(event.name, _attributes(event.attributes)) for event in span.events],
                        [(link.trace_id.hex(), link.span_id.hex()) for link in span.links], service,
                    )
                    with self._lock:
                        self.spans.append(found)

    def in_trace(self, trace_id: str) -> list[Span]:
        """The spans received so far of one trace."""
        with self._lock:
            return [span for span in self.spans if span.trace_id == trace_id]

    def close(self) -> None:
        """Stop listening: the port refuses from now on."""
        self._release.set()
        self._server.shutdown()
        self._server.server_close()
