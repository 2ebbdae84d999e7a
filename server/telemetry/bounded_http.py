"""A requests session for talking to receivers we do not trust: bounded answers, bounded time, no redirects.

Worker only: the payload log's HTTP sink and the OTLP trace exporter each hold one (their own thread's).
An answer's body is read raw (a gzip answer is never inflated) up to `max_bytes`, kept as the
response's `content`, and the connection closed when the body was longer; a redirect is never
followed; the whole exchange (connect, send, headers, body) ends at its timeout's total (connect +
read of a `(connect, read)` tuple): a receiver that trickles its headers or body a byte at a time
costs its caller that long and no longer.

NOTE: requests' own timeouts bound each socket read, not the exchange. The total is kept by one
watchdog thread per process that shuts down the socket of a request past its deadline; the
connections learn which request they serve through `_current` (a thread-local the adapter sets).
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from typing import Any

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection

MAX_BYTES = 4096  # of an answer's body: receivers answer a status; anything past this is not read
DEFAULT_TOTAL_S = 10.0  # a request sent without a timeout
READ_SIZE = 16 * 1024


class _Watch:
    """One request's deadline, and the connection it runs on (shut down at the deadline)."""

    __slots__ = ("deadline", "connection", "expired")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.connection: Any = None
        self.expired = False


def _shut(connection: Any) -> None:
    """End every read and write blocked on the connection's socket now (the request fails at once)."""
    sock = getattr(connection, "sock", None)
    if sock is None:
        return
    try:
        # NOTE: socket.socket's own shutdown, not SSLSocket's (which drops its SSL object under a reading thread)
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:  # closed already
        pass


class _Watchdog:
    """One daemon thread per process: shuts down the connection of every request still running at its deadline."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._watches: set[_Watch] = set()
        self._wake_at = math.inf  # when the thread wakes next (inf: when told)
        self._pid = 0  # the process whose thread runs; threads do not survive fork

    def start(self, seconds: float) -> _Watch:
        watch = _Watch(time.monotonic() + seconds)
        with self._cond:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                threading.Thread(target=self._run, name="http-deadlines", daemon=True).start()
            self._watches.add(watch)
            if watch.deadline < self._wake_at:  # NOTE: else the thread wakes in time anyway: no wake-up per request
                self._cond.notify()
        return watch

    def attach(self, watch: _Watch, connection: Any) -> None:
        """The connection `watch`'s request runs on (now connected, or about to send)."""
        with self._cond:
            watch.connection = connection
            if watch.expired:
                _shut(connection)

    def end(self, watch: _Watch) -> None:
        with self._cond:
            self._watches.discard(watch)

    def expire(self, watch: _Watch) -> None:
        """End the request now, as its deadline would."""
        with self._cond:
            self._expire(watch)

    def _expire(self, watch: _Watch) -> None:
        watch.expired = True
        self._watches.discard(watch)
        _shut(watch.connection)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for watch in [w for w in self._watches if w.deadline <= now]:
                    self._expire(watch)
                self._wake_at = min((w.deadline for w in self._watches), default=math.inf)
                self._cond.wait(None if self._wake_at == math.inf else self._wake_at - now)


_WATCHDOG = _Watchdog()
_current = threading.local()  # .watch: the request this thread is sending (the adapter sets it)


def _attach_current(connection: Any) -> None:
    watch = getattr(_current, "watch", None)
    if watch is not None:
        _WATCHDOG.attach(watch, connection)


class _WatchedHTTPConnection(HTTPConnection):
    """urllib3's connection, telling the watchdog which request it serves."""

    def connect(self) -> None:
        super().connect()
        _attach_current(self)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _attach_current(self)
        super().request(*args, **kwargs)


class _WatchedHTTPSConnection(HTTPSConnection):
    """urllib3's TLS connection, telling the watchdog which request it serves (the handshake included)."""

    def connect(self) -> None:
        _attach_current(self)  # NOTE: self.sock is set before the handshake: a trickled handshake is ended too
        super().connect()
        _attach_current(self)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _attach_current(self)
        super().request(*args, **kwargs)


_WATCHED = {HTTPConnection: _WatchedHTTPConnection, HTTPSConnection: _WatchedHTTPSConnection}


def total_seconds(timeout: Any) -> float:
    """The whole exchange's bound: connect + read of a (connect, read) tuple, or the one number."""
    if isinstance(timeout, tuple):
        return sum(part for part in timeout if part is not None) or DEFAULT_TOTAL_S
    if isinstance(timeout, (int, float)):
        return float(timeout)
    return DEFAULT_TOTAL_S


class BoundedAdapter(HTTPAdapter):
    """Sends with a total deadline and keeps at most `max_bytes` of the raw body as the response's content."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        super().__init__()
        self.max_bytes = max_bytes
        self._active: set[_Watch] = set()

    def get_connection_with_tls_context(self, *args: Any, **kwargs: Any) -> Any:
        pool = super().get_connection_with_tls_context(*args, **kwargs)
        pool.ConnectionCls = _WATCHED.get(pool.ConnectionCls, pool.ConnectionCls)  # a SOCKS pool keeps its own
        return pool

    def send(self, request: requests.PreparedRequest, stream: bool = False, timeout: Any = None,  # type: ignore[override]
             verify: Any = True, cert: Any = None, proxies: Any = None) -> requests.Response:
        seconds = total_seconds(timeout)
        watch = _WATCHDOG.start(seconds)
        self._active.add(watch)
        _current.watch = watch
        try:
            response = super().send(request, stream=True, timeout=timeout, verify=verify, cert=cert, proxies=proxies)
            self._keep_at_most(response)
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            if watch.expired:
                raise requests.Timeout(f"{request.url} took longer than {seconds:g} s in total", request=request) from exc
            if isinstance(exc, requests.RequestException):
                raise
            raise requests.ConnectionError(exc, request=request) from exc  # the body's read failed (a reset, bad chunks)
        finally:
            _current.watch = None
            _WATCHDOG.end(watch)
            self._active.discard(watch)
        if watch.expired:  # the shutdown looked like the body's end
            raise requests.Timeout(f"{request.url} took longer than {seconds:g} s in total", request=request)
        return response

    def _keep_at_most(self, response: requests.Response) -> None:
        """Read the raw body up to max_bytes (one more to know whether it ended); a longer one's connection is closed."""
        parts, size, ended = [], 0, False
        try:
            while size <= self.max_bytes:
                # NOTE: read1 returns what one socket read brings (read(n) would wait for n bytes), undecoded
                chunk = response.raw.read1(min(READ_SIZE, self.max_bytes + 1 - size), decode_content=False)
                if not chunk:
                    ended = True
                    break
                parts.append(chunk)
                size += len(chunk)
        finally:
            response._content_consumed = ended  # type: ignore[attr-defined]
            response.close()  # ended: the connection goes back to the pool; else it is closed, the rest unread
            response._content = b"".join(parts)[: self.max_bytes]  # type: ignore[attr-defined]
            response._content_consumed = True  # type: ignore[attr-defined]

    def abort(self) -> None:
        """End every request this adapter is sending, now (a stopping worker's last write)."""
        for watch in list(self._active):
            _WATCHDOG.expire(watch)


class BoundedSession(requests.Session):
    """A requests.Session whose every answer is bounded (see the module): for payload receivers and OTLP collectors."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        super().__init__()
        self.adapter = BoundedAdapter(max_bytes)
        self.mount("http://", self.adapter)
        self.mount("https://", self.adapter)

    def get_redirect_target(self, response: requests.Response) -> None:
        """Never follow a redirect (a 307 would send the payload to a URL the receiver chose): it is the answer."""
        return None

    def abort(self) -> None:
        """End the request in flight now (it fails with requests.Timeout)."""
        self.adapter.abort()
