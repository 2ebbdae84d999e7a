"""Open Inference Protocol V2 request decoding (JSON and the binary extension): declared shapes, sizes, names."""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import numpy as np
import pytest

import server.settings
from server.errors import InvalidArgument
from server.protocols.v2.json_codec import decode_infer
from server.settings import Settings
from server.signature import SignatureInfo, TensorInfo
from server.tensors.declared import STRING_ELEMENT_BYTES

SIGNATURE = SignatureInfo(
    "serving_default",
    "predict",
    {"x": TensorInfo("x", "float32", (None, 1)), "text": TensorInfo("text", "string", (None,))},
    {"y": TensorInfo("y", "float32", (None, 1)), "z": TensorInfo("z", "float32", (None, 1))},
)
ROWS = 4


def decode(header: dict[str, Any], binary: bytes = b"") -> Any:
    return decode_infer(header, binary, lambda name: SIGNATURE, ROWS)


def refusal(header: dict[str, Any], binary: bytes = b"") -> str:
    with pytest.raises(InvalidArgument) as refused:
        decode(header, binary)
    assert refused.value.status == 400
    return refused.value.message


@pytest.fixture
def body_limit(monkeypatch: pytest.MonkeyPatch) -> int:
    """FORKSERVE_MAX_BODY_BYTES of 1 MiB for this test."""
    limit = 1024 * 1024
    monkeypatch.setattr(server.settings, "_current", dataclasses.replace(Settings.current(), max_body_bytes=limit))
    return limit


def test_a_request_decodes_json_and_binary_tensors() -> None:
    words = [b"cat", b""]
    binary = b"".join(struct.pack("<I", len(w)) + w for w in words)
    decoded = decode({"inputs": [
        {"name": "x", "shape": [2, 1], "datatype": "FP32", "data": [1.0, 2.0]},
        {"name": "text", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": len(binary)}},
    ], "outputs": [{"name": "y"}]}, binary)
    np.testing.assert_array_equal(decoded.inputs["x"], [[1.0], [2.0]])
    assert decoded.inputs["text"].tolist() == words and decoded.outputs == {"y": False}


@pytest.mark.parametrize(("shape", "says"), [
    ([5, 1], "request has 5 rows; the limit is 4 (max_request_rows)"),
    ([2, 3], "input 'x' has shape [2, 3], the model takes [-1, 1]"),
    ([0, 2**62, 2**62, 1], "input 'x': shape [0, 4611686018427387904, 4611686018427387904, 1] is larger than any tensor"),
    ([1] * 70, "input 'x' has rank 70"),
])
@pytest.mark.parametrize("form", ["json", "binary"])
def test_the_declared_shape_is_checked_before_the_data(shape: list[int], says: str, form: str) -> None:
    spec: dict[str, Any] = {"name": "x", "shape": shape, "datatype": "FP32"}
    if form == "json":
        spec["data"] = []  # no data: a check of the data would say so first
    else:
        spec["parameters"] = {"binary_data_size": 0}
    assert says in refusal({"inputs": [spec]})


def test_zero_length_bytes_elements_are_held_to_the_request_size_limit(body_limit: int) -> None:
    count = body_limit // STRING_ELEMENT_BYTES + 1
    rows = SignatureInfo("s", "predict", {"text": TensorInfo("text", "string", None)}, {})
    binary = b"\x00" * (4 * count)
    header = {"inputs": [{"name": "text", "shape": [count], "datatype": "BYTES", "parameters": {"binary_data_size": len(binary)}}]}
    with pytest.raises(InvalidArgument, match="larger than the request size limit"):
        decode_infer(header, binary, lambda name: rows, count)
    header = {"inputs": [{"name": "text", "shape": [count], "datatype": "BYTES", "data": [""] * count}]}
    with pytest.raises(InvalidArgument, match="larger than the request size limit"):
        decode_infer(header, b"", lambda name: rows, count)


def test_an_input_given_twice_is_refused() -> None:
    x = {"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}
    assert refusal({"inputs": [x, {**x, "data": [2.0]}]}) == "input 'x' is given twice"


def test_an_output_requested_twice_is_refused() -> None:
    x = {"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}
    assert refusal({"inputs": [x], "outputs": [{"name": "y"}, {"name": "z"}, {"name": "y"}]}) == "output 'y' is requested twice"
    assert decode({"inputs": [x], "outputs": [{"name": "y"}, {"name": "z"}]}).outputs == {"y": False, "z": False}
