"""An HTTP receiver that answers POSTs the way a hostile or broken one would (payload events, OTLP exports).

Runs in the test's (or benchmark's) process, a thread per connection. `mode` may change while it
runs; every POST is counted, and its request body read first, whatever the mode.
"""

from __future__ import annotations

import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHUNK = b"\0" * (1 << 20)
CHUNKED = b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK)  # one chunk of a chunked body (made once: tests measure allocations)
MODES = {
    "ok": "200 with an empty body",
    "huge": "200 and a body of `size` bytes (Content-Length), sent as fast as the client reads",
    "endless": "200 and a chunked body that never ends",
    "gzip": "200, Content-Encoding: gzip: `size` bytes as 1 MiB gzip members, ~1 KB on the wire each",
    "trickle": "200, Content-Length 1 MB, one byte every `interval` s",
    "trickle_headers": "the status line, then one header byte every `interval` s (the headers never end)",
    "redirect": "307 to `location`",
    "slow": "200 after `delay` s",
}


class HostileReceiver:
    """POSTs on 127.0.0.1:<port>/; `mode` is one of MODES; `posts` counts them; `sent` the body bytes written."""

    def __init__(self, mode: str = "ok", size: int = 1 << 30, interval: float = 0.5, delay: float = 0.5,
                 location: str = "") -> None:
        self.mode, self.size, self.interval, self.delay, self.location = mode, size, interval, delay, location
        self.posts = 0
        self.sent = 0
        self.answered = 0  # POSTs whose answer was written whole (ok, slow, redirect)
        self.answering = 0  # answers being written now (a bounded client ends them by closing)
        self.connections = 0  # TCP connections accepted (a client that keeps its connection alive opens one)
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.gzipped = gzip.compress(CHUNK, compresslevel=9) * max(1, size // len(CHUNK))  # ~1 KB per MiB
        receiver = self

        class Handle(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with receiver.lock:
                    receiver.connections += 1

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.posts += 1
                    receiver.answering += 1
                try:
                    receiver._answer(self)
                except OSError:  # the client went away: what a bounded client does
                    self.close_connection = True
                finally:
                    with receiver.lock:
                        receiver.answering -= 1

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handle)
        self._server.daemon_threads = True
        self._server.handle_error = lambda request, address: None  # a client that closes mid-answer: what is tested
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/"

    def __enter__(self) -> "HostileReceiver":
        threading.Thread(target=self._server.serve_forever, name="hostile-receiver", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def _count(self, sent: int) -> None:
        with self.lock:
            self.sent += sent

    def _answer(self, handle: BaseHTTPRequestHandler) -> None:
        mode, out = self.mode, handle.wfile
        if mode == "trickle_headers":
            out.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            while not self.stopping.wait(self.interval):
                out.write(b"a")
                out.flush()
            return
        if mode == "slow":
            time.sleep(self.delay)
        if mode in ("ok", "slow", "redirect"):
            handle.send_response(307 if mode == "redirect" else 200)
            if mode == "redirect":
                handle.send_header("Location", self.location)
            handle.send_header("Content-Length", "0")
            handle.end_headers()
            with self.lock:
                self.answered += 1
            return
        handle.send_response(200)
        handle.send_header("Content-Type", "application/json")
        if mode == "endless":
            handle.send_header("Transfer-Encoding", "chunked")
            handle.end_headers()
            while not self.stopping.is_set():
                out.write(CHUNKED)
                self._count(len(CHUNK))
            return
        if mode == "gzip":
            body = self.gzipped
            handle.send_header("Content-Encoding", "gzip")
            handle.send_header("Content-Length", str(len(body)))
            handle.end_headers()
            out.write(body)
            self._count(len(body))
            return
        if mode == "trickle":
            handle.send_header("Content-Length", str(1 << 20))
            handle.end_headers()
            while not self.stopping.wait(self.interval):
                out.write(b"a")
                out.flush()
                self._count(1)
            return
        handle.send_header("Content-Length", str(self.size))  # huge
        handle.end_headers()
        left = self.size
        while left > 0 and not self.stopping.is_set():
            part = CHUNK[:left]
            out.write(part)
            left -= len(part)
            self._count(len(part))
