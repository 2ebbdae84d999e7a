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


NO_TENSOR_REDACTION = ("the model's handler defines redact(body) but not redact_tensors(inputs): "
                       "inputs of a request that bypasses the handler are not logged")
NO_BODY_REDACTION = ("the model's handler defines redact_tensors(inputs) but not redact(body): "
                     "request bodies through the handler are not logged")
NOT_DECODED = "the request failed before its inputs were read for the handler's redaction"


@dataclass(frozen=True, slots=True)
class Redaction:
    """A handler's redaction hooks (one at least): a record's inputs pass through the one made for their form, or are left out."""

    body: Callable[[Any], Any] | None  # redact(body): the JSON body a REST request through the handler brings
    tensors: Callable[[dict[str, np.ndarray]], Any] | None  # redact_tensors(inputs): decoded inputs of any other request


@dataclass(slots=True)
class Capture:
    """What a sampled request carries until it is answered (Inference.payload)."""

    arrived: float  # time.time() of the request's arrival
    redaction: Redaction | None  # the handler's hooks, run by the writer; None: inputs are logged as they came
    inputs: bytes | None = None  # JSON frozen at capture (a handler may mutate the body later): as logged, or for redact(body)
    tensors: dict[str, np.ndarray] | None = None  # decoded inputs, for redact_tensors (never logged without it)
    tensor_bytes: int = 0  # what `tensors` holds (the writer's queue counts it)
    omitted: str = ""  # why a redacted version's inputs are left out of the record
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
    """Mark the request being measured for logging, with the answering version's sample rate and redaction hooks."""
    rate = version.config.payload_log_sample
    if inference is None or not rate or random.random() >= rate:
        return
    handler = version.handler
    redaction = None
    if handler is not None and (handler.redact is not None or handler.redact_tensors is not None):
        redaction = Redaction(handler.redact, handler.redact_tensors)
    inference.payload = Capture(time.time() - (time.perf_counter() - inference.started), redaction)


def _json_default(value: Any) -> Any:
    """What orjson cannot write itself: bytes (a gRPC string tensor, an image) as TF Serving's {"b64": ...}, object arrays as lists."""
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, np.ndarray):  # dtype object: DT_STRING tensors
        return value.tolist()
    raise TypeError(type(value).__name__)


def to_json(value: Any) -> bytes:
    """JSON of inputs or outputs (numpy arrays as nested lists, bytes as {"b64": ...}); TypeError when it cannot be."""
    try:
        return orjson.dumps(value, default=_json_default, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError as exc:
        raise TypeError(str(exc)) from None


def _dumps(value: Any) -> bytes | None:
    """to_json, or None when the value cannot be written (the record says null; never fails the request)."""
    try:
        return to_json(value)
    except TypeError:
        return None


def _nbytes(array: np.ndarray) -> int:
    """The memory an input array holds, the bytes of its strings included (what a queued record keeps alive)."""
    if array.dtype != object:
        return array.nbytes
    return array.nbytes + sum(len(item) for item in array.flat if isinstance(item, (bytes, str)))


# NOTE: which capture function a request path calls says which form its inputs have; a version whose
# handler defines redact or redact_tensors logs a form only through the hook made for it, else leaves
# the inputs out (docs/handlers.md, docs/observability.md#payloads).


def handler_body(inference: Any, body: Any) -> None:
    """REST predict through the handler: freeze the JSON body it gets (for redact(body), or as it came without hooks)."""
    capture = getattr(inference, "payload", None)
    if capture is None:
        return
    if capture.redaction is not None and capture.redaction.body is None:
        capture.omitted = NO_BODY_REDACTION
        return
    capture.inputs = _dumps(body)


def request_body(inference: Any, body: Any) -> None:
    """A request the handler never sees, as its protocol has it (JSON; gRPC: {"inputs": tensors}): frozen unless the version redacts."""
    capture = getattr(inference, "payload", None)
    if capture is None:
        return
    if capture.redaction is None:
        capture.inputs = _dumps(body)
    elif capture.tensors is None:
        capture.omitted = NOT_DECODED if capture.redaction.tensors is not None else NO_TENSOR_REDACTION


def tensors(inference: Any, inputs: dict[str, np.ndarray]) -> None:
    """A request the handler never sees, decoded: its input arrays kept for redact_tensors when the version's handler has it."""
    capture = getattr(inference, "payload", None)
    if capture is None or capture.redaction is None:
        return
    if capture.redaction.tensors is None:
        capture.omitted = NO_TENSOR_REDACTION
        return
    capture.tensors = dict(inputs)  # NOTE: references, not copies: the writer copies them for the hook, off the request path
    capture.tensor_bytes = sum(_nbytes(array) for array in capture.tensors.values())
    capture.omitted = ""


def outputs(inference: Any, tensors: Any) -> None:
    """gRPC: freeze the output tensors (numpy arrays as nested lists) of a sampled call."""
    capture = getattr(inference, "payload", None)
    if capture is None:
        return
    capture.outputs = _dumps(tensors)


def grpc_inputs(inference: Any, inputs: dict[str, np.ndarray]) -> None:
    """A gRPC call's decoded input tensors, as both forms: {"inputs": tensors} (no hook) and for redact_tensors."""
    request_body(inference, {"inputs": inputs})  # nested lists of the decoded tensors
    tensors(inference, inputs)


def grpc_outputs(inference: Any, outputs_by_name: dict[str, np.ndarray], wanted: list[str]) -> None:
    """A gRPC call's output tensors: the ones it asked for (all when it named none)."""
    outputs(inference, {"outputs": {name: outputs_by_name[name] for name in wanted or outputs_by_name}})
