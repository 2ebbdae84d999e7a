"""What a logged request becomes: one JSON record (the file sink's line) and its parts (the HTTP sink's events)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson

from server.telemetry.payloads import capture as captured
from server.telemetry.payloads.capture import Sampled


@dataclass(slots=True)
class Record:
    """A sampled request ready to write: metadata, and inputs / outputs as JSON bytes (None: not logged)."""

    sampled: Sampled
    time: str
    inputs: bytes | None
    outputs: bytes | None
    error: dict[str, Any] | None
    redact_error: str = ""
    inputs_omitted: str = ""  # why a redacted version's record has no inputs

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
            **({"inputs_omitted": self.inputs_omitted} if self.inputs_omitted else {}),
        }

    def line(self) -> bytes:
        """One JSON line."""
        return orjson.dumps(self.fields()) + b"\n"


def build(sampled: Sampled) -> Record:
    """The record of a sampled request, redacted by the handler's hook for its inputs' form (writer thread).

    A hook that raises (or returns what JSON cannot hold) leaves the inputs out with `redact_error`
    set, for the caller to count; a version with hooks never logs inputs that none of them saw.
    """
    capture = sampled.capture
    arrived = datetime.fromtimestamp(capture.arrived, UTC).isoformat(timespec="milliseconds")
    outputs, error = None, None
    if sampled.status >= 400:
        error = {"status": sampled.status, "message": _error_message(sampled.body)}
    elif sampled.is_json:
        outputs = sampled.body
    redaction = capture.redaction
    record = Record(sampled, arrived.replace("+00:00", "Z"), capture.inputs if redaction is None else None, outputs, error)
    if redaction is None:
        return record
    try:
        if capture.tensors is not None and redaction.tensors is not None:
            copies = {name: np.array(array, copy=True) for name, array in capture.tensors.items()}  # its own, writable
            record.inputs = captured.to_json({"inputs": redaction.tensors(copies)})
        elif capture.inputs is not None and redaction.body is not None:
            record.inputs = captured.to_json(redaction.body(orjson.loads(capture.inputs)))
        else:
            record.inputs_omitted = capture.omitted or captured.NOT_DECODED
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
