"""What a sampled request's inputs and outputs become as JSON, gRPC's string tensors included."""

from __future__ import annotations

import json

import numpy as np

from server.telemetry.payloads.capture import Capture, inputs, outputs


class Measured:
    def __init__(self) -> None:
        self.payload = Capture(0.0, None)


def test_string_tensors_are_logged_as_tf_servings_b64() -> None:
    inference = Measured()
    inputs(inference, {"image": np.array([b"\x89PNG\r\n", b"ab"], dtype=object), "scale": np.ones((1, 2), np.float32)})
    assert json.loads(inference.payload.inputs) == {"image": [{"b64": "iVBORw0K"}, {"b64": "YWI="}], "scale": [[1.0, 1.0]]}


def test_what_cannot_be_written_is_null_never_an_error() -> None:
    inference = Measured()
    outputs(inference, {"handle": object()})
    assert inference.payload.outputs is None
    inputs(inference, {"instances": [[0.5]]})
    assert json.loads(inference.payload.inputs) == {"instances": [[0.5]]}
