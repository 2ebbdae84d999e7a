"""The bounded queue of sampled requests and the daemon thread that writes them (started in each worker after fork)."""

from __future__ import annotations

import collections
import logging
import os
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
DRAIN_S = 2.0  # a stopping worker writes what is queued for this long (worker_exit: well within graceful_timeout)
ABORT_WAIT_S = 0.5  # then waits this long for the record being written to give up
WRITER: Writer | None = None  # this worker's, once start() ran


class Sink(Protocol):
    def write(self, record: record.Record) -> None: ...


def count_drop(reason: str, records: int = 1) -> None:
    """`records` more in forkserve_payload_log_dropped_total{reason} (written to the metric file now, not buffered)."""
    metrics.record(lambda: metrics.PAYLOAD_LOG_DROPPED.labels(reason).inc(records))


def _warn(message: str, *args: Any) -> None:
    """A warning at most once a second, with how many were suppressed."""
    suppressed = LOG_LIMIT.admit()
    if suppressed is None:
        return
    if suppressed:
        log.warning("%d more payload log problems were not logged", suppressed)
    log.warning(message, *args)


def size_of(sampled: Sampled) -> int:
    """The bytes a queued record holds: its inputs (or decoded tensors), its response body and (gRPC) its outputs."""
    capture = sampled.capture
    return len(sampled.body) + len(capture.inputs or b"") + len(capture.outputs or b"") + capture.tensor_bytes


class Writer:
    """Takes sampled requests without blocking (full: dropped) and writes them to `sink` on its own daemon thread.

    Bounded twice: `size` records and `max_bytes` of their bodies (a record may hold two 32 MiB
    bodies; a receiver that hangs must cost records, never the worker's memory).
    """

    def __init__(self, sink: Sink, size: int, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.sink = sink
        self.size = size
        self.max_bytes = max_bytes
        self.queued_bytes = 0
        self._records: collections.deque[Sampled] = collections.deque()
        self._changed = threading.Condition()  # guards the queue, queued_bytes and the flags below
        self._writing = False  # the thread holds a record it took off the queue
        self._closed = False  # the worker is stopping (drain): no record is taken any more
        self._aborted = False  # drain gave up on the record being written
        self._last_written = False  # whether the thread's last record reached the sink
        self.thread = threading.Thread(target=self._run, name="forkserve-payloads", daemon=True)

    def queued(self) -> int:
        """Records waiting (the one being written not included)."""
        return len(self._records)

    def put(self, sampled: Sampled) -> None:
        """The request path's hand-off."""
        size = size_of(sampled)
        with self._changed:
            if not self._closed and len(self._records) < self.size and self.queued_bytes + size <= self.max_bytes:
                self._records.append(sampled)
                self.queued_bytes += size
                self._changed.notify_all()
                return
            closed = self._closed
        if closed:  # answered while the worker stops: too late to write
            count_drop("shutdown")
            return
        count_drop("queue_full")
        _warn("payload log queue full (%d records, %d bytes at most): a sampled request was not logged",
              self.size, self.max_bytes)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._records)
                sampled = self._records.popleft()
                self._writing = True
            written = False
            try:
                written = self.write(sampled)
            except BaseException as exc:  # NOTE: this thread must outlive anything a record brings (a redact's SystemExit)
                count_drop("write_failed")
                _warn("payload record of request %s not written: %r", sampled.request_id, exc)
            finally:
                with self._changed:
                    self.queued_bytes -= size_of(sampled)
                    self._writing, self._last_written = False, written
                    self._changed.notify_all()

    def write(self, sampled: Sampled) -> bool:
        """Build, redact and write one record (True: written); every failure counted and logged (rate-limited), none raised."""
        try:
            built = record.build(sampled)
        except Exception as exc:
            count_drop("encode_failed")
            _warn("payload record of request %s could not be built: %r", sampled.request_id, exc)
            return False
        if built.redact_error:
            count_drop("redact_failed")
            _warn("model %s: the handler's redaction raised (%s): request %s logged without its inputs",
                  sampled.model, built.redact_error, sampled.request_id)
        try:
            self.sink.write(built)
        except Exception as exc:  # NOTE: full disk, unreachable or slow receiver, 500: the record only
            if not self._aborted:  # else drain counts it, with the queue's rest
                count_drop("write_failed")
                _warn("payload record of request %s not written: %s", sampled.request_id, exc)
            return False
        return True

    def drain(self, seconds: float) -> int:
        """Worker exit: take no more records, write the queued ones for `seconds` at most; the rest are dropped and counted.

        Returns how many were dropped: the queue's rest, and the record being written at the
        deadline (its write is aborted: it may have reached the receiver, or part of it).
        """
        with self._changed:
            self._closed = True
            self._changed.wait_for(lambda: not self._records and not self._writing, seconds)
            left = len(self._records)
            self.queued_bytes -= sum(size_of(sampled) for sampled in self._records)
            self._records.clear()
            writing = self._aborted = self._writing
        if writing:
            abort = getattr(self.sink, "abort", None)  # the HTTP sink's request ends at once; a file write is short
            if abort is not None:
                abort()
            with self._changed:
                self._changed.wait_for(lambda: not self._writing, ABORT_WAIT_S)
                if self._writing or not self._last_written:
                    left += 1
        if left:
            count_drop("shutdown", left)
        return left


def stop(seconds: float = DRAIN_S) -> None:
    """Worker exit (hooks.worker_exit): drain this worker's writer, if it runs, and say once what was left."""
    if WRITER is None:
        return
    left = WRITER.drain(seconds)
    if left:
        log.warning("forkserve worker %s stopped with %d payload records not written (the sink did not take them "
                    "within %.0f s); counted in forkserve_payload_log_dropped_total{reason=\"shutdown\"}",
                    os.getpid(), left, seconds)


def make_sink(target: str, max_mb: float) -> Sink:
    """The sink FORKSERVE_PAYLOAD_LOG names (checked by Settings)."""
    if target.startswith("file:"):
        return FileSink(Path(target[len("file:"):]), max(1, int(max_mb * 1024 * 1024)))
    return HttpSink(target)


def start(settings: Settings, sampled_models: list[str]) -> Writer | None:
    """Worker, after fork: start the writer when a sink is configured (capture.ON), else say the setting is ignored."""
    global WRITER
    if not settings.payload_log:
        if sampled_models:
            log.warning("payload_log is set for %s in models.toml but FORKSERVE_PAYLOAD_LOG is not: nothing is logged",
                        ", ".join(sorted(sampled_models)))
        return None
    writer = Writer(make_sink(settings.payload_log, settings.payload_log_max_mb), settings.payload_log_queue,
                    max(1, int(settings.payload_log_queue_mb * 1024 * 1024)))
    writer.thread.start()
    WRITER = writer
    capture._submit = writer.put
    capture.ON = True
    return writer
