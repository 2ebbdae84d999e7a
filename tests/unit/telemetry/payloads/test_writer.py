"""The payload writer: records built, redacted, written to files (rotated) and never raised; a full queue drops."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from server.cli.payloads import log_files, records
from server.telemetry.lines import LineLimit
from server.telemetry.payloads import capture, record, writer
from server.telemetry.payloads.capture import Capture, Redaction, Sampled
from server.telemetry.payloads.file_sink import KEEP, FileSink
from server.telemetry.payloads.writer import Writer
from tests.support.harness import wait_until


class Answered:
    """What an Inference carries when it is answered (measure.Inference's fields the capture reads)."""

    def __init__(self, request_id: str) -> None:
        self.request_id, self.trace_id, self.model, self.version = request_id, "ab" * 16, "m", "3"
        self.api, self.protocol, self.started, self.payload = "tfserving_predict", "rest", 0.0, None


def sampled(request_id: str = "r1", body: Any = None, redact: Any = None, status: int = 200,
            answer: bytes = b'{"predictions":[[1.0]]}') -> Sampled:
    """A sampled request through capture's own functions."""
    inference = Answered(request_id)
    inference.payload = Capture(1_700_000_000.0, Redaction(redact, None) if redact is not None else None)
    capture.handler_body(inference, body if body is not None else {"instances": [[0.5]]})
    taken: list[Sampled] = []
    capture._submit, saved = taken.append, capture._submit
    try:
        inference.payload.submit(inference, status, answer, True)
    finally:
        capture._submit = saved
    return taken[0]


def test_the_record_has_every_field() -> None:
    line = json.loads(record.build(sampled()).line())
    assert line["time"] == "2023-11-14T22:13:20.000Z" and line["trace_id"] == "ab" * 16
    assert {k: line[k] for k in ("request_id", "model", "version", "api", "protocol", "status", "error")} == {
        "request_id": "r1", "model": "m", "version": "3", "api": "tfserving_predict", "protocol": "rest",
        "status": 200, "error": None}
    assert line["inputs"] == {"instances": [[0.5]]} and line["outputs"] == {"predictions": [[1.0]]}


def test_inputs_are_frozen_at_capture() -> None:
    body = {"instances": [[0.5]], "user": "alice"}
    taken = sampled(body=body)
    body.pop("user")  # a handler's preprocess mutating the body after capture
    assert json.loads(record.build(taken).line())["inputs"]["user"] == "alice"


def test_an_error_is_recorded_with_its_status_and_message() -> None:
    line = json.loads(record.build(sampled(status=400, answer=b'{"error":"bad shape"}')).line())
    assert line["error"] == {"status": 400, "message": "bad shape"} and line["outputs"] is None


def test_a_raising_redact_drops_the_inputs_never_logs_them() -> None:
    def redact(body: dict) -> dict:
        raise ValueError("oops")

    built = record.build(sampled(body={"secret": "s3cr3t"}, redact=redact))
    assert built.inputs is None and "ValueError" in built.redact_error and b"s3cr3t" not in built.line()


def test_redact_is_applied() -> None:
    built = record.build(sampled(body={"secret": "s3cr3t", "x": 1}, redact=lambda body: {**body, "secret": "***"}))
    assert json.loads(built.line())["inputs"] == {"secret": "***", "x": 1}


def test_files_rotate_and_keep_a_bounded_number(tmp_path: Path) -> None:
    sink = FileSink(tmp_path / "logs", max_bytes=1000)
    for number in range(100):
        sink.write(record.build(sampled(f"r{number}")))
    sink.close()
    files = log_files(tmp_path / "logs")
    rotated = [path for path in files if not path.name.endswith(".jsonl")]
    assert len(rotated) == KEEP and len(files) <= KEEP + 1 and all(path.stat().st_size >= 1000 for path in rotated)
    assert {path.stat().st_mode & 0o777 for path in files} == {0o600}
    assert (tmp_path / "logs").stat().st_mode & 0o777 == 0o750
    ids = [r["request_id"] for r in records(tmp_path / "logs")]
    assert ids[-1] == "r99" and len(ids) == len(set(ids))


class Failing:
    def write(self, built: record.Record) -> None:
        raise OSError(28, "No space left on device")


def _dropped(reason: str) -> float:
    return REGISTRY.get_sample_value("forkserve_payload_log_dropped_total", {"reason": reason}) or 0.0


def test_a_failing_sink_never_raises_and_counts_and_logs_the_record(monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(writer, "LOG_LIMIT", LineLimit(per_second=1))  # no earlier test's warning in this second
    before = _dropped("write_failed")
    with caplog.at_level(logging.WARNING, logger="forkserve.payloads"):
        assert Writer(Failing(), 4).write(sampled("r-full")) is False
    assert _dropped("write_failed") == before + 1
    assert "payload record of request r-full not written: [Errno 28] No space left on device" in caplog.text


class Blocked:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.written: list[str] = []

    def write(self, built: record.Record) -> None:
        self.release.wait(10)
        self.written.append(built.sampled.request_id)


def test_a_full_queue_drops_without_blocking() -> None:
    sink = Blocked()
    writer = Writer(sink, 2)
    writer.thread.start()
    started = time.perf_counter()
    for number in range(10):
        writer.put(sampled(f"r{number}"))  # returns at once: the writer is stuck on the first it took
    assert time.perf_counter() - started < 0.5 and writer.queued() <= 2
    sink.release.set()
    wait_until(lambda: writer.queued() == 0 and len(sink.written) >= 2, 10, "the queue drained")
    assert len(sink.written) <= 3  # the one being written and the two queued; the rest were dropped


def test_the_queue_is_bounded_in_bytes_too() -> None:
    sink = Blocked()
    big = b'{"predictions":[' + b"0.5," * 250_000 + b"0.5]]}"  # about 1 MB each
    writer = Writer(sink, 1000, max_bytes=3_500_000)
    writer.thread.start()
    for number in range(10):
        writer.put(sampled(f"r{number}", answer=big))
    assert writer.queued() <= 3 and writer.queued_bytes <= 3_500_000  # the rest dropped, not held
    sink.release.set()
    wait_until(lambda: writer.queued() == 0 and writer.queued_bytes == 0, 10, "the queue drained, its bytes released")
    assert 1 <= len(sink.written) <= 4


def test_a_redact_raising_system_exit_costs_its_inputs_not_the_writer(tmp_path: Path) -> None:
    def redact(body: dict) -> dict:
        raise SystemExit(3)

    sink = FileSink(tmp_path / "logs", max_bytes=1_000_000)
    writer = Writer(sink, 10)
    writer.thread.start()
    writer.put(sampled("exits", body={"secret": "s3cr3t"}, redact=redact))
    writer.put(sampled("after"))
    wait_until(lambda: [r["request_id"] for r in records(tmp_path / "logs")] == ["exits", "after"], 10, "both written")
    assert writer.thread.is_alive() and "s3cr3t" not in log_files(tmp_path / "logs")[0].read_text()


def test_a_removed_directory_is_made_again(tmp_path: Path, monkeypatch: Any) -> None:
    from server.telemetry.payloads import file_sink

    monkeypatch.setattr(file_sink, "RECHECK_S", 0.0)
    sink = FileSink(tmp_path / "logs", max_bytes=1_000_000)
    sink.write(record.build(sampled("before")))
    for path in log_files(tmp_path / "logs"):
        path.unlink()
    (tmp_path / "logs").rmdir()  # rm -r DIR while the worker writes
    sink.write(record.build(sampled("after")))
    sink.close()
    assert [r["request_id"] for r in records(tmp_path / "logs")] == ["after"]


class Slow:
    """A sink that takes `seconds` per record; abort() ends the record being written (as the HTTP sink's does)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.written: list[str] = []
        self.aborted = threading.Event()

    def write(self, built: record.Record) -> None:
        if self.aborted.wait(self.seconds):
            raise OSError("aborted")
        self.written.append(built.sampled.request_id)

    def abort(self) -> None:
        self.aborted.set()


def test_drain_writes_what_is_queued_when_the_sink_keeps_up() -> None:
    sink = Slow(0.01)
    writer = Writer(sink, 100)
    writer.thread.start()
    for number in range(20):
        writer.put(sampled(f"r{number}"))
    assert writer.drain(5.0) == 0 and len(sink.written) == 20


def test_drain_is_bounded_and_says_how_many_were_left() -> None:
    sink = Slow(0.2)
    writer = Writer(sink, 100)
    writer.thread.start()
    for number in range(30):
        writer.put(sampled(f"r{number}"))
    started = time.monotonic()
    left = writer.drain(0.5)
    assert time.monotonic() - started < 0.5 + 0.3  # the record being written at the deadline was aborted, not awaited
    assert sink.aborted.is_set() and left + len(sink.written) == 30 and 1 <= len(sink.written) <= 4
    writer.put(sampled("late"))  # answered after the drain: dropped (counted as shutdown), not queued
    assert writer.queued() == 0 and writer.queued_bytes == 0
