"""The bounded queue of sampled requests and the daemon thread that writes them (started in each worker after fork)."""

from __future__ import annotations

import logging
import queue
import threading
from pathlib import Path
from typing import Any, Protocol

from server.settings import Settings
from server.telemetry import metrics
from server.telemetry.lines import LineLimit
from server.telemetry.payloads import capture, record
from server.telemetry.payloads.capture import Sampled
from server.telemetry.payloads.file_sink import FileSink
from server.telemetry.payloads.http_sink import HttpSink

log = logging.getLogger("forkserve.payloads")
LOG_LIMIT = LineLimit(per_second=1)


class Sink(Protocol):
    def write(self, record: record.Record) -> None: ...


def count_drop(reason: str) -> None:
    """One more record in forkserve_payload_log_dropped_total{reason}."""
    metrics.record(lambda: metrics.PAYLOAD_LOG_DROPPED.labels(reason).inc())


def _warn(message: str, *args: Any) -> None:
    """A warning at most once a second, with how many were suppressed."""
    suppressed = LOG_LIMIT.admit()
    if suppressed is None:
        return
    if suppressed:
        log.warning("%d more payload log problems were not logged", suppressed)
    log.warning(message, *args)


def size_of(sampled: Sampled) -> int:
    """The bytes a queued record holds: its inputs, its response body and (gRPC) its outputs."""
    capture = sampled.capture
    return len(sampled.body) + len(capture.inputs or b"") + len(capture.outputs or b"")


class Writer:
    """Takes sampled requests without blocking (full: dropped) and writes them to `sink` on its own daemon thread.

    Bounded twice: `size` records and `max_bytes` of their bodies (a record may hold two 32 MiB
    bodies; a receiver that hangs must cost records, never the worker's memory).
    """

    def __init__(self, sink: Sink, size: int, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.sink = sink
        self.queue: queue.Queue[Sampled] = queue.Queue(size)
        self.max_bytes = max_bytes
        self.queued_bytes = 0
        self._bytes_lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="forkserve-payloads", daemon=True)

    def put(self, sampled: Sampled) -> None:
        """The request path's hand-off."""
        size = size_of(sampled)
        with self._bytes_lock:
            fits = self.queued_bytes + size <= self.max_bytes
            if fits:
                self.queued_bytes += size
        if fits:
            try:
                self.queue.put_nowait(sampled)
                return
            except queue.Full:
                self._release(size)
        count_drop("queue_full")
        _warn("payload log queue full (%d records, %d bytes at most): a sampled request was not logged",
              self.queue.maxsize, self.max_bytes)

    def _release(self, size: int) -> None:
        with self._bytes_lock:
            self.queued_bytes -= size

    def _run(self) -> None:
        while True:
            sampled = self.queue.get()
            try:
                self.write(sampled)
            except BaseException as exc:  # NOTE: this thread must outlive anything a record brings (a redact's SystemExit)
                count_drop("write_failed")
                _warn("payload record of request %s not written: %r", sampled.request_id, exc)
            finally:
                self._release(size_of(sampled))

    def write(self, sampled: Sampled) -> None:
        """Build, redact and write one record; every failure counted and logged (rate-limited), none raised."""
        try:
            built = record.build(sampled)
        except Exception as exc:
            count_drop("encode_failed")
            _warn("payload record of request %s could not be built: %r", sampled.request_id, exc)
            return
        if built.redact_error:
            count_drop("redact_failed")
            _warn("model %s: Handler.redact raised (%s): request %s logged without its inputs",
                  sampled.model, built.redact_error, sampled.request_id)
        try:
            self.sink.write(built)
        except Exception as exc:  # NOTE: full disk, unreachable or slow receiver, 500: the record only
            count_drop("write_failed")
            _warn("payload record of request %s not written: %s", sampled.request_id, exc)


def make_sink(target: str, max_mb: float) -> Sink:
    """The sink FORKSERVE_PAYLOAD_LOG names (checked by Settings)."""
    if target.startswith("file:"):
        return FileSink(Path(target[len("file:"):]), max(1, int(max_mb * 1024 * 1024)))
    return HttpSink(target)


def start(settings: Settings, sampled_models: list[str]) -> Writer | None:
    """Worker, after fork: start the writer when a sink is configured (capture.ON), else say the setting is ignored."""
    if not settings.payload_log:
        if sampled_models:
            log.warning("payload_log is set for %s in models.toml but FORKSERVE_PAYLOAD_LOG is not: nothing is logged",
                        ", ".join(sorted(sampled_models)))
        return None
    writer = Writer(make_sink(settings.payload_log, settings.payload_log_max_mb), settings.payload_log_queue,
                    max(1, int(settings.payload_log_queue_mb * 1024 * 1024)))
    writer.thread.start()
    capture._submit = writer.put
    capture.ON = True
    return writer
