"""What a logged request becomes: one JSON record (the file sink's line) and its parts (the HTTP sink's events)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from server.telemetry.payloads.capture import Sampled


class RedactFailed(Exception):
    """The handler's redact raised: the record is written without its inputs."""


@dataclass(slots=True)
class Record:
    """A sampled request ready to write: metadata, and inputs / outputs as JSON bytes (None: not logged)."""

    sampled: Sampled
    time: str
    inputs: bytes | None
    outputs: bytes | None
    error: dict[str, Any] | None
    redact_error: str = ""

    def fields(self) -> dict[str, Any]:
        """The record as one JSON object (a file line); inputs and outputs embedded without parsing them again."""
        s = self.sampled
        return {
            "time": self.time, "request_id": s.request_id, "trace_id": s.trace_id, "model": s.model,
            "version": s.version, "api": s.api, "protocol": s.protocol, "status": s.status,
            "latency_ms": round(s.latency_ms, 3),
            "inputs": orjson.Fragment(self.inputs) if self.inputs is not None else None,
            "outputs": orjson.Fragment(self.outputs) if self.outputs is not None else None,
            "error": self.error,
            **({"redact_error": self.redact_error} if self.redact_error else {}),
        }

    def line(self) -> bytes:
        """One JSON line."""
        return orjson.dumps(self.fields()) + b"\n"


def build(sampled: Sampled) -> Record:
    """The record of a sampled request: redaction applied (writer thread); RedactFailed is left to the caller to count."""
    capture = sampled.capture
    arrived = datetime.fromtimestamp(capture.arrived, UTC).isoformat(timespec="milliseconds")
    outputs, error = None, None
    if sampled.status >= 400:
        error = {"status": sampled.status, "message": _error_message(sampled.body)}
    elif sampled.is_json:
        outputs = sampled.body
    record = Record(sampled, arrived.replace("+00:00", "Z"), capture.inputs, outputs, error)
    if capture.redact is not None and capture.inputs is not None:
        try:
            record.inputs = orjson.dumps(capture.redact(orjson.loads(capture.inputs)), option=orjson.OPT_SERIALIZE_NUMPY)
        except BaseException as exc:  # NOTE: user code (SystemExit included): never log unredacted inputs
            record.inputs = None
            record.redact_error = f"{type(exc).__name__}: {exc}"[:200]
    return record


def _error_message(body: bytes) -> str:
    """The message of an error answer ({"error": "..."}), or the body as text."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace")[:1000]
    return str(parsed.get("error", parsed)) if isinstance(parsed, dict) else str(parsed)
