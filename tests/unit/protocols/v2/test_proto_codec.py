"""V2 gRPC tensors to numpy and back: every datatype typed and raw, BYTES length prefixes, clear errors.

NOTE: the messages are tritonclient's (tritonclient.grpc.service_pb2), wire-identical to ours
(tests/unit/protocols/v2/test_messages.py checks): both define `inference.*` in protobuf's default pool, so a
test process holds one of them, and the e2e tests' client process needs tritonclient's.
"""

from __future__ import annotations

import dataclasses
import struct
import tracemalloc

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

import server.settings
from server.errors import InvalidArgument
from server.protocols.v2 import proto_codec
from server.protocols.v2.json_codec import bytes_elements
from server.settings import Settings
from server.signature import SignatureInfo, TensorInfo
from server.tensors.declared import STRING_ELEMENT_BYTES

# datatype -> (numpy dtype, sample values including each type's extremes)
SAMPLES = {
    "BOOL": ("bool", [True, False, True, True]),
    "UINT8": ("uint8", [0, 1, 200, 255]),
    "UINT16": ("uint16", [0, 1, 40000, 65535]),
    "UINT32": ("uint32", [0, 1, 3_000_000_000, 2**32 - 1]),
    "UINT64": ("uint64", [0, 1, 2**63, 2**64 - 1]),
    "INT8": ("int8", [-128, -1, 0, 127]),
    "INT16": ("int16", [-32768, -1, 0, 32767]),
    "INT32": ("int32", [-(2**31), -1, 0, 2**31 - 1]),
    "INT64": ("int64", [-(2**63), -1, 0, 2**63 - 1]),
    "FP16": ("float16", [-1.5, 0.0, 0.25, 65504.0]),
    "FP32": ("float32", [-1.5, 0.0, 0.1, 3.4e38]),
    "FP64": ("float64", [-1.5, 0.0, 0.1, 1e300]),
}
TYPED = [name for name in SAMPLES if name != "FP16"]  # FP16 has no typed contents field in the protocol


def tensor(name: str, datatype: str, shape: list[int]) -> service_pb2.ModelInferRequest.InferInputTensor:
    return service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape)


def info(dtype: str, name: str = "x", shape: tuple[int | None, ...] | None = None) -> TensorInfo:
    """A signature input (of unknown rank unless `shape` says)."""
    return TensorInfo(name, dtype, shape)


def decode(message: object, raw: bytes | None, tensor_info: TensorInfo, max_rows: int = 1024) -> np.ndarray:
    return proto_codec.to_array(message, raw, tensor_info, max_rows)


@pytest.mark.parametrize("datatype", TYPED)
def test_typed_contents_become_the_datatype_s_array(datatype: str) -> None:
    dtype, values = SAMPLES[datatype]
    message = tensor("x", datatype, [2, 2])
    getattr(message.contents, proto_codec.CONTENTS[datatype]).extend(values)
    array = decode(message, None, info(dtype))
    assert array.dtype == np.dtype(dtype) and array.shape == (2, 2)
    np.testing.assert_array_equal(array, np.array(values, dtype=dtype).reshape(2, 2))


@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_raw_contents_are_little_endian_values_read_in_place(datatype: str) -> None:
    dtype, values = SAMPLES[datatype]
    expected = np.array(values, dtype=dtype).reshape(2, 2)
    raw = expected.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    array = decode(tensor("x", datatype, [2, 2]), raw, info(dtype))
    assert array.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(array, expected)
    if datatype != "BOOL":
        assert not array.flags.owndata  # a view of the message's bytes, not a copy


@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_outputs_round_trip_raw(datatype: str) -> None:
    dtype, values = SAMPLES[datatype]
    array = np.array(values, dtype=dtype).reshape(2, 2)
    raw = proto_codec.raw_bytes(array)
    assert raw == array.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    np.testing.assert_array_equal(decode(tensor("x", datatype, [2, 2]), raw, info(dtype)), array)


def test_bytes_typed_and_raw_with_length_prefixes() -> None:
    words = [b"cat", b"", "dög".encode(), b"\x00\xff"]
    typed = tensor("text", "BYTES", [4, 1])
    typed.contents.bytes_contents.extend(words)
    raw = b"".join(struct.pack("<I", len(w)) + w for w in words)
    for array in (decode(typed, None, info("string", "text")),
                  decode(tensor("text", "BYTES", [4, 1]), raw, info("string", "text"))):
        assert array.dtype == object and array.shape == (4, 1) and array.reshape(-1).tolist() == words
    # outputs: bytes as they are, other objects as their text
    assert proto_codec.raw_bytes(np.array([[b"cat"], [b""]], dtype=object)) == b"\x03\x00\x00\x00cat\x00\x00\x00\x00"
    assert proto_codec.raw_bytes(np.array(["é"], dtype=object)) == b"\x02\x00\x00\x00" + "é".encode()


def test_an_empty_tensor_is_fine_typed_and_raw() -> None:
    assert decode(tensor("x", "FP32", [0, 2]), None, info("float32")).shape == (0, 2)
    assert decode(tensor("x", "FP32", [0, 2]), b"", info("float32")).shape == (0, 2)
    assert decode(tensor("x", "BYTES", [0]), b"", info("string")).shape == (0,)


def _typed(datatype: str, shape: list[int], field: str, values: list) -> service_pb2.ModelInferRequest.InferInputTensor:
    message = tensor("x", datatype, shape)
    getattr(message.contents, field).extend(values)
    return message


BAD = [
    ("unknown datatype", tensor("x", "FP128", [1, 2]), None, "float32", "unknown datatype 'FP128'"),
    ("datatype mismatch", _typed("INT32", [1, 2], "int_contents", [1, 2]), None, "float32", "model takes FP32"),
    ("negative dimension", tensor("x", "FP32", [-1, 2]), b"", "float32", "negative size"),
    ("typed count short", _typed("FP32", [2, 2], "fp32_contents", [1.0, 2.0]), None, "float32", "2 fp32_contents values for shape [2, 2] (4 expected)"),
    ("values in another field", _typed("FP32", [1, 2], "fp64_contents", [1.0, 2.0]), None, "float32", "0 fp32_contents values"),
    ("INT8 out of range", _typed("INT8", [1, 2], "int_contents", [1, 128]), None, "int8", "out of range for INT8"),
    ("UINT16 out of range", _typed("UINT16", [1, 2], "uint_contents", [1, 70000]), None, "uint16", "out of range for UINT16"),
    ("FP16 typed", tensor("x", "FP16", [1, 2]), None, "float16", "FP16 has no typed contents field"),
    ("raw byte count", tensor("x", "FP32", [2, 2]), b"\x00" * 12, "float32", "12 raw bytes for shape [2, 2] of FP32 (16 expected)"),
    ("raw and contents", _typed("FP32", [1, 1], "fp32_contents", [1.0]), b"\x00" * 4, "float32", "both contents and raw_input_contents"),
    ("raw BOOL not 0 or 1", tensor("x", "BOOL", [1, 2]), b"\x01\x02", "bool", "must be 0 or 1"),
    ("BYTES prefix cut", tensor("x", "BYTES", [2]), b"\x01\x00\x00\x00a\x03\x00\x00", "string", "truncated BYTES element length"),
    ("BYTES element past the end", tensor("x", "BYTES", [1]), b"\x09\x00\x00\x00abc", "string", "runs past the data"),
    ("BYTES count", tensor("x", "BYTES", [2]), b"\x01\x00\x00\x00a", "string", "5 bytes of BYTES data cannot hold the 2 elements"),
    ("BYTES after the count", tensor("x", "BYTES", [1]), b"\x01\x00\x00\x00a\x00\x00\x00\x00", "string",
     "4 bytes of BYTES data after the 1 elements"),
    ("BYTES typed count", _typed("BYTES", [2], "bytes_contents", [b"a"]), None, "string", "1 bytes_contents values for shape [2]"),
]


@pytest.mark.parametrize("name,message,raw,dtype,words", BAD, ids=[b[0] for b in BAD])
def test_bad_tensors_are_invalid_arguments_naming_the_input(name: str, message: object, raw: bytes | None, dtype: str, words: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        decode(message, raw, info(dtype))
    assert caught.value.status == 400 and words in caught.value.message and "'x'" in caught.value.message


@pytest.fixture
def body_limit(monkeypatch: pytest.MonkeyPatch) -> int:
    """FORKSERVE_MAX_BODY_BYTES of 1 MiB for this test."""
    limit = 1024 * 1024
    monkeypatch.setattr(server.settings, "_current", dataclasses.replace(Settings.current(), max_body_bytes=limit))
    return limit


@pytest.mark.parametrize(("shape", "says"), [
    ([5, 2], "request has 5 rows; the limit is 4 (max_request_rows)"),
    ([2, 3], "input 'x' has shape [2, 3], the model takes [-1, 2]"),
    ([2, 2, 1], "input 'x' has rank 3"),
    ([0, 2**62, 2**62, 1], "is larger than any tensor can be"),
    ([1] * 70, "has rank 70"),
])
@pytest.mark.parametrize("form", ["raw", "typed"])
def test_the_declared_shape_is_checked_against_the_signature_before_the_data(shape: list[int], says: str, form: str) -> None:
    message = tensor("x", "FP32", shape)  # no data at all: any check of the data would say so first
    with pytest.raises(InvalidArgument) as refused:
        decode(message, b"" if form == "raw" else None, info("float32", shape=(None, 2)), max_rows=4)
    assert says in refused.value.message


def test_zero_length_bytes_elements_are_counted_before_one_is_read(body_limit: int) -> None:
    count = body_limit // STRING_ELEMENT_BYTES + 1
    # A first element whose length runs past the data: reading it would say so; the size is refused first.
    raw = b"\xff\xff\xff\xff" + b"\x00" * (4 * count - 4)
    with pytest.raises(InvalidArgument) as refused:
        decode(tensor("x", "BYTES", [count]), raw, info("string"), max_rows=count)
    assert "larger than the request size limit" in refused.value.message and "FORKSERVE_MAX_BODY_BYTES" in refused.value.message
    typed = tensor("x", "BYTES", [count])
    typed.contents.bytes_contents.extend([b""] * count)  # 2 bytes each in the message
    with pytest.raises(InvalidArgument, match="larger than the request size limit"):
        decode(typed, None, info("string"), max_rows=count)
    fits = body_limit // STRING_ELEMENT_BYTES - 1
    assert decode(tensor("x", "BYTES", [fits]), b"\x00" * (4 * fits), info("string"), max_rows=fits).shape == (fits,)


def test_bytes_elements_stop_at_the_shape_s_count() -> None:
    with pytest.raises(InvalidArgument, match="12 bytes of BYTES data cannot hold the 4 elements"):
        bytes_elements(b"\x00" * 12, 4, "x")
    with pytest.raises(InvalidArgument, match="8 bytes of BYTES data after the 2 elements"):
        bytes_elements(b"\x00" * 16, 2, "x")
    assert bytes_elements(b"\x00" * 8, 2, "x").tolist() == [b"", b""]


@pytest.mark.parametrize("length", [0, 2, 10, 100])
@pytest.mark.parametrize("form", ["raw", "typed"])
def test_what_a_decoded_bytes_tensor_holds_is_within_its_counted_size(length: int, form: str) -> None:
    count = 20_000
    words = [bytes([65 + i % 26]) * length for i in range(count)]
    message = tensor("x", "BYTES", [count])
    raw = None
    if form == "raw":
        raw = b"".join(struct.pack("<I", length) + word for word in words)
    else:
        message.contents.bytes_contents.extend(words)
    del words
    tracemalloc.start()
    try:
        array = decode(message, raw, info("string"), max_rows=count)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert array.shape == (count,) and len(array[-1]) == length
    assert peak <= count * (length + STRING_ELEMENT_BYTES), peak / count  # what check_strings counts


SIGNATURE = SignatureInfo("serving_default", "predict",
                          {"a": TensorInfo("a", "float32", (None, 2)), "b": TensorInfo("b", "int32", (None,))},
                          {"y": TensorInfo("y", "float32", (None, 2)), "h": TensorInfo("h", "float16", (None,))})


def infer_request(**parameters: object) -> service_pb2.ModelInferRequest:
    """A ModelInferRequest for SIGNATURE's two inputs, typed contents, one row."""
    request = service_pb2.ModelInferRequest(model_name="m", id="call-1")
    request.inputs.add(name="a", datatype="FP32", shape=[1, 2]).contents.fp32_contents.extend([1.0, 2.0])
    request.inputs.add(name="b", datatype="INT32", shape=[1]).contents.int_contents.append(7)
    for name, value in parameters.items():
        if isinstance(value, bool):
            request.parameters[name].bool_param = value
        else:
            request.parameters[name].string_param = str(value)
    return request


def test_a_request_decodes_to_the_signatures_inputs_and_names_its_signature() -> None:
    request = infer_request()
    assert proto_codec.signature_name(request) == "serving_default"
    assert proto_codec.signature_name(infer_request(signature_name="other")) == "other"
    inputs = proto_codec.decode_inputs(request, SIGNATURE, 1024)
    assert inputs["a"].tolist() == [[1.0, 2.0]] and inputs["b"].dtype == np.int32


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: r.inputs.add(name="c", datatype="FP32", shape=[1]), "unknown input 'c'"),
    (lambda r: r.inputs.add(name="a", datatype="FP32", shape=[1, 2]), "input 'a' is given twice"),
    (lambda r: r.raw_input_contents.append(b"\0" * 8), "1 raw_input_contents for 2 inputs"),
    (lambda r: r.ClearField("inputs"), "'inputs' is empty"),
])
def test_a_malformed_request_is_invalid_argument_naming_what(change, message: str) -> None:  # noqa: ANN001
    request = infer_request()
    change(request)
    with pytest.raises(InvalidArgument, match=message):
        proto_codec.decode_inputs(request, SIGNATURE, 1024)


def test_requested_outputs_are_the_signatures_and_never_twice() -> None:
    request = infer_request()
    assert proto_codec.requested_outputs(request, SIGNATURE) == []
    request.outputs.add(name="y")
    assert proto_codec.requested_outputs(request, SIGNATURE) == ["y"]
    request.outputs.add(name="y")
    with pytest.raises(InvalidArgument, match="output 'y' is requested twice"):
        proto_codec.requested_outputs(request, SIGNATURE)
    with pytest.raises(InvalidArgument, match="unknown output 'z'"):
        proto_codec.requested_outputs(service_pb2.ModelInferRequest(outputs=[{"name": "z"}]), SIGNATURE)


def test_the_response_is_raw_even_for_typed_inputs_as_triton_answers() -> None:
    outputs = {"y": np.array([[0.5, 1.5]], np.float32), "h": np.array([1.0], np.float16)}
    asked = service_pb2.ModelInferResponse()
    proto_codec.encode_response(infer_request(), asked, "m", 3, SIGNATURE, outputs, ["y"])  # typed contents in
    assert (asked.model_name, asked.model_version, asked.id) == ("m", "3", "call-1")
    assert [(o.name, o.datatype, list(o.shape)) for o in asked.outputs] == [("y", "FP32", [1, 2])]
    assert asked.raw_output_contents == [outputs["y"].tobytes()]
    assert not asked.outputs[0].HasField("contents")  # the protocol forbids both forms in one answer
    every = service_pb2.ModelInferResponse()  # none asked: every output, in the signature's order
    proto_codec.encode_response(infer_request(), every, "m", 3, SIGNATURE, outputs, [])
    assert [(o.name, o.datatype) for o in every.outputs] == [("y", "FP32"), ("h", "FP16")]
    assert every.raw_output_contents == [outputs["y"].tobytes(), outputs["h"].tobytes()]
