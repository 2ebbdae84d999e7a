"""An OTLP/HTTP receiver for benchmarks: accepts every export at once and counts it, as a healthy collector would.

Runs in the benchmark's process (a thread per connection); its CPU is not the servers'. Tests
decode what they receive (tests/e2e); this one only reads the bytes, so it costs the machine little.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Handler(BaseHTTPRequestHandler):
    """200 with an empty ExportTraceServiceResponse (zero bytes is its protobuf encoding)."""

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        sink: OtlpSink = self.server.sink  # type: ignore[attr-defined]
        with sink.lock:
            sink.exports += 1
            sink.bytes += length
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


class OtlpSink:
    """A context manager: `url` is the OTEL_EXPORTER_OTLP_ENDPOINT to give a server."""

    def __init__(self) -> None:
        self.exports = 0
        self.bytes = 0
        self.lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.sink = self  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "OtlpSink":
        threading.Thread(target=self._server.serve_forever, name="otlp-sink", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
