"""The request path's side of payload logging: sample a request, freeze its inputs, hand it to the writer."""

from __future__ import annotations

import base64
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

ON = False  # a sink is configured and this worker's writer runs (writer.start); False: callers skip everything
_submit: Callable[[Sampled], None] = lambda sampled: None  # the writer's put (writer.start)


@dataclass(slots=True)
class Capture:
    """What a sampled request carries until it is answered (Inference.payload)."""

    arrived: float  # time.time() of the request's arrival
    redact: Callable[[Any], Any] | None  # the handler's redact(body), run by the writer
    inputs: bytes | None = None  # the decoded body as JSON, frozen at capture (a handler may mutate the body later)
    outputs: bytes | None = None  # gRPC: the output tensors as JSON (REST logs the response body instead)

    def submit(self, inference: Any, status: int, body: bytes, is_json: bool) -> None:
        """The request was answered: queue it for the writer (never blocks; a full queue drops it)."""
        latency_ms = (time.perf_counter() - inference.started) * 1000
        _submit(Sampled(self, inference.request_id, inference.trace_id, inference.model, inference.version,
                        inference.api, inference.protocol, status, latency_ms, body, is_json))


@dataclass(slots=True)
class Sampled:
    """One answered, sampled request as the writer receives it."""

    capture: Capture
    request_id: str
    trace_id: str
    model: str
    version: str
    api: str
    protocol: str
    status: int
    latency_ms: float
    body: bytes  # the response body as sent: outputs, or the error
    is_json: bool


def sample(inference: Any, version: Any) -> None:
    """Mark the request being measured for logging, with the answering version's sample rate."""
    rate = version.config.payload_log_sample
    if inference is None or not rate or random.random() >= rate:
        return
    handler = version.handler
    redact = getattr(handler, "redact", None) if handler is not None else None
    inference.payload = Capture(time.time() - (time.perf_counter() - inference.started), redact)


def _json_default(value: Any) -> Any:
    """What orjson cannot write itself: bytes (a gRPC string tensor, an image) as TF Serving's {"b64": ...}, object arrays as lists."""
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, np.ndarray):  # dtype object: DT_STRING tensors
        return value.tolist()
    raise TypeError(type(value).__name__)


def _dumps(value: Any) -> bytes | None:
    """JSON of inputs or outputs (numpy arrays as nested lists); None when they cannot be written."""
    try:
        return orjson.dumps(value, default=_json_default, option=orjson.OPT_SERIALIZE_NUMPY)
    except (TypeError, orjson.JSONEncodeError):
        return None  # the record says so (null); never fails the request


def inputs(inference: Any, body: Any) -> None:
    """Freeze the decoded request body of a sampled request (orjson, now: later it may have changed)."""
    capture = getattr(inference, "payload", None)
    if capture is None:
        return
    capture.inputs = _dumps(body)


def outputs(inference: Any, tensors: Any) -> None:
    """gRPC: freeze the output tensors (numpy arrays as nested lists) of a sampled call."""
    capture = getattr(inference, "payload", None)
    if capture is None:
        return
    capture.outputs = _dumps(tensors)
