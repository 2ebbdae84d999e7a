"""What a sampled request's inputs and outputs become as JSON, and which redaction hook each form of inputs passes through."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from server.telemetry.payloads import capture, record
from server.telemetry.payloads.capture import Capture, Redaction, Sampled, outputs, request_body


class Measured:
    def __init__(self, redaction: Redaction | None = None) -> None:
        self.payload = Capture(0.0, redaction)
        self.request_id, self.trace_id, self.model, self.version = "r1", "", "m", "1"
        self.api, self.protocol, self.started = "v2_infer", "grpc", 0.0


def test_string_tensors_are_logged_as_tf_servings_b64() -> None:
    inference = Measured()
    request_body(inference, {"image": np.array([b"\x89PNG\r\n", b"ab"], dtype=object), "scale": np.ones((1, 2), np.float32)})
    assert json.loads(inference.payload.inputs) == {"image": [{"b64": "iVBORw0K"}, {"b64": "YWI="}], "scale": [[1.0, 1.0]]}


def test_what_cannot_be_written_is_null_never_an_error() -> None:
    inference = Measured()
    outputs(inference, {"handle": object()})
    assert inference.payload.outputs is None
    request_body(inference, {"instances": [[0.5]]})
    assert json.loads(inference.payload.inputs) == {"instances": [[0.5]]}


def built(inference: Measured) -> dict[str, Any]:
    """The record the writer makes of the captured request, as its JSON line."""
    taken: list[Sampled] = []
    capture._submit, saved = taken.append, capture._submit
    try:
        inference.payload.submit(inference, 200, b'{"outputs": []}', True)
    finally:
        capture._submit = saved
    return json.loads(record.build(taken[0]).line())


SECRET = np.asarray([[0.123456, 2.0]], dtype=np.float32)


def redact_body(body: dict) -> dict:
    return {**body, "user": "REDACTED"}


def redact_tensors(inputs: dict[str, np.ndarray]) -> dict:
    inputs["features"][:, 0] = 0  # its own writable copy
    return {"features": inputs["features"]}


def test_a_tensor_request_to_a_version_that_redacts_bodies_only_leaves_its_inputs_out() -> None:
    inference = Measured(Redaction(redact_body, None))
    request_body(inference, {"inputs": {"features": SECRET}})  # what a version without hooks would log
    capture.tensors(inference, {"features": SECRET})
    line = built(inference)
    assert line["inputs"] is None and line["inputs_omitted"] == capture.NO_TENSOR_REDACTION
    assert "0.123456" not in json.dumps(line)


def test_redact_tensors_gets_the_decoded_inputs_whatever_the_protocol() -> None:
    inference = Measured(Redaction(redact_body, redact_tensors))
    request_body(inference, {"inputs": [{"name": "features", "data": SECRET.tolist()}]})  # the V2 JSON body: never logged
    capture.tensors(inference, {"features": SECRET})
    line = built(inference)
    assert line["inputs"] == {"inputs": {"features": [[0.0, 2.0]]}} and "inputs_omitted" not in line
    assert SECRET[0, 0] == np.float32(0.123456)  # the request's own array untouched


def test_a_handler_body_to_a_version_that_redacts_tensors_only_leaves_its_inputs_out() -> None:
    inference = Measured(Redaction(None, redact_tensors))
    capture.handler_body(inference, {"features": [0.5], "user": "alice"})
    line = built(inference)
    assert line["inputs"] is None and line["inputs_omitted"] == capture.NO_BODY_REDACTION


def test_a_request_that_failed_before_decoding_says_so() -> None:
    inference = Measured(Redaction(redact_body, redact_tensors))
    request_body(inference, {"inputs": "garbage"})
    line = built(inference)
    assert line["inputs"] is None and line["inputs_omitted"] == capture.NOT_DECODED


def test_a_raising_redact_tensors_costs_the_inputs() -> None:
    def raising(inputs: dict) -> dict:
        raise SystemExit(3)

    inference = Measured(Redaction(None, raising))
    capture.tensors(inference, {"features": SECRET})
    line = built(inference)
    assert line["inputs"] is None and line["redact_error"].startswith("SystemExit")


def test_without_hooks_inputs_are_logged_as_they_came() -> None:
    inference = Measured()
    request_body(inference, {"inputs": {"features": SECRET}})
    capture.tensors(inference, {"features": SECRET})  # nothing to redact: not kept
    assert inference.payload.tensors is None
    assert built(inference)["inputs"] == {"inputs": {"features": [[0.123456, 2.0]]}}
