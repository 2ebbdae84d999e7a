"""TensorProto <-> numpy against TensorFlow's own tf.make_tensor_proto / tf.make_ndarray, every supported dtype."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2

import server.settings
from server.errors import ApiError, InvalidArgument
from server.protocols.tfserving.tensor_proto import DTYPES, ENUMS, from_array, to_array
from server.settings import Settings
from server.tensors.declared import STRING_ELEMENT_BYTES

NUMERIC = [name for name, _ in DTYPES.values() if name != "string"]


def sample(dtype: str, shape: tuple[int, ...] = (2, 3)) -> np.ndarray:
    """Values that use the dtype's range (negatives, large magnitudes, fractions) in `shape`."""
    rng = np.random.default_rng(3)
    if dtype == "bool":
        return rng.random(shape) > 0.5
    info = np.finfo(dtype) if dtype.startswith("float") else np.iinfo(dtype)
    if dtype.startswith("float"):
        return (rng.standard_normal(shape) * 100).astype(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def proto(dtype: int, dims: list[int], unknown_rank: bool = False, **fields: Any) -> tensor_pb2.TensorProto:
    """A TensorProto built field by field, as a client other than TensorFlow's may send it."""
    shape = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in dims],
                                              unknown_rank=unknown_rank)
    return tensor_pb2.TensorProto(dtype=dtype, tensor_shape=shape, **fields)


def assert_same(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("dtype", NUMERIC)
def test_what_make_tensor_proto_writes_decodes_as_make_ndarray(dtype: str) -> None:
    array = sample(dtype)
    message = tf.make_tensor_proto(array)
    assert message.dtype == ENUMS[dtype]
    decoded = to_array(message, "x")
    assert_same(decoded, tf.make_ndarray(message))
    assert_same(decoded, array)


@pytest.mark.parametrize("dtype", NUMERIC)
def test_tensor_content_of_every_dtype(dtype: str) -> None:
    array = sample(dtype)
    message = proto(ENUMS[dtype], [2, 3], tensor_content=array.astype(array.dtype.newbyteorder("<")).tobytes())
    assert_same(to_array(message, "x"), tf.make_ndarray(message))


@pytest.mark.parametrize("dtype", NUMERIC)
def test_typed_value_fields_of_every_dtype(dtype: str) -> None:
    array = sample(dtype)
    field = DTYPES[ENUMS[dtype]][1]
    values = array.view(np.uint16).reshape(-1).tolist() if dtype == "float16" else array.reshape(-1).tolist()
    message = proto(ENUMS[dtype], [2, 3], **{field: values})
    assert_same(to_array(message, "x"), tf.make_ndarray(message))
    assert_same(to_array(message, "x"), array)


def test_half_val_holds_the_bits_of_each_half() -> None:
    array = np.array([0.5, -2.0, 65504.0, np.inf], dtype=np.float16)
    message = proto(types_pb2.DT_HALF, [4], half_val=array.view(np.uint16).tolist())
    assert_same(to_array(message, "x"), array)
    assert_same(to_array(message, "x"), tf.make_ndarray(message))


@pytest.mark.parametrize("dtype", NUMERIC)
def test_one_value_fills_the_shape(dtype: str) -> None:
    value = sample(dtype, (1,))[0]
    message = tf.make_tensor_proto(value, dtype=tf.as_dtype(dtype), shape=[2, 3])
    assert not message.tensor_content
    assert_same(to_array(message, "x"), tf.make_ndarray(message))
    assert_same(to_array(message, "x"), np.full((2, 3), value, dtype=dtype))


def test_strings_both_ways() -> None:
    values = [[b"a", b""], [b"\xff\x00 binary", "é".encode()]]
    message = tf.make_tensor_proto(values)
    decoded = to_array(message, "x")
    assert decoded.dtype == object and decoded.shape == (2, 2) and decoded.tolist() == values
    np.testing.assert_array_equal(decoded, tf.make_ndarray(message))
    for array in (decoded, np.array(values, dtype="S"), np.array([["a", ""], ["b", "é"]])):
        out = tensor_pb2.TensorProto()
        from_array(array, out)
        assert out.dtype == types_pb2.DT_STRING
        expected = [[x if isinstance(x, bytes) else x.encode() for x in row] for row in array.tolist()]
        assert tf.make_ndarray(out).tolist() == expected
    broadcast = tf.make_tensor_proto(b"same", shape=[3])
    assert to_array(broadcast, "x").tolist() == [b"same"] * 3


@pytest.mark.parametrize("dtype", NUMERIC)
def test_outputs_read_back_with_make_ndarray(dtype: str) -> None:
    for array in (sample(dtype), sample(dtype, (4, 5)).T, sample(dtype, ()), sample(dtype, (0, 3))):
        out = tensor_pb2.TensorProto()
        from_array(array, out)
        assert out.dtype == ENUMS[dtype]
        # TF Serving's Tensor::AsProtoField: the values in the dtype's typed field, never tensor_content
        assert not out.tensor_content and len(getattr(out, DTYPES[out.dtype][1])) == np.asarray(array).size
        assert_same(tf.make_ndarray(out), np.asarray(array))
        assert_same(to_array(out, "y"), np.asarray(array))


def test_shapes_scalar_and_empty() -> None:
    assert_same(to_array(tf.make_tensor_proto(np.float32(2.5)), "x"), np.array(2.5, dtype=np.float32))
    empty = np.zeros((0, 3), dtype=np.float32)
    assert_same(to_array(tf.make_tensor_proto(empty), "x"), empty)
    assert_same(to_array(proto(types_pb2.DT_FLOAT, [0, 3]), "x"), empty)


def test_tensor_content_is_read_without_a_copy() -> None:
    array = to_array(tf.make_tensor_proto(np.ones((4, 4), dtype=np.float32)), "x")
    assert not array.flags.owndata and not array.flags.writeable


@pytest.mark.parametrize(("message", "says"), [
    (proto(types_pb2.DT_FLOAT, [2, 3], tensor_content=b"\x00" * 20), "20 bytes of tensor_content for shape [2, 3] of DT_FLOAT (24 expected)"),
    (proto(types_pb2.DT_INT64, [2], tensor_content=b"\x00" * 8), "(16 expected)"),
    (proto(types_pb2.DT_FLOAT, [2, -1], float_val=[1.0]), "shape [2, -1] has a negative size"),
    (proto(types_pb2.DT_FLOAT, [], unknown_rank=True, float_val=[1.0]), "unknown rank"),
    (proto(types_pb2.DT_FLOAT, [3], float_val=[1.0, 2.0]), "2 values in float_val for shape [3] (3 expected, or 1"),
    (proto(types_pb2.DT_FLOAT, [3], float_val=[1.0, 2.0, 3.0, 4.0]), "4 values in float_val for shape [3]"),
    (proto(types_pb2.DT_FLOAT, [3]), "0 values in float_val"),
    (proto(types_pb2.DT_UINT8, [1], int_val=[300]), "out of range for DT_UINT8"),
    (proto(types_pb2.DT_INT8, [1], int_val=[-129]), "out of range for DT_INT8"),
    (proto(types_pb2.DT_UINT16, [1], int_val=[-1]), "out of range for DT_UINT16"),
    (proto(types_pb2.DT_HALF, [1], half_val=[70000]), "not a 16-bit pattern"),
    (proto(types_pb2.DT_STRING, [1], tensor_content=b"abc"), "carries its values in string_val"),
    (tf.make_tensor_proto(np.ones(2, dtype=np.complex64)), "dtype DT_COMPLEX64 is not supported"),
    (proto(types_pb2.DT_RESOURCE, [1]), "is not supported"),
])
def test_malformed_tensors_are_refused_with_a_reason(message: tensor_pb2.TensorProto, says: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        to_array(message, "pixels")
    assert "input 'pixels'" in refused.value.message and says in refused.value.message, refused.value.message


def test_an_output_dtype_without_an_encoding_is_a_server_error() -> None:
    with pytest.raises(ApiError) as failed:
        from_array(np.ones(2, dtype=np.complex64), tensor_pb2.TensorProto(), "z")
    assert failed.value.status == 500 and "output 'z' is complex64" in failed.value.message


@pytest.mark.parametrize("dtype", ["float32", "string"])
def test_one_value_may_not_fill_a_shape_past_the_request_size_limit(dtype: str) -> None:
    proto = tf.make_tensor_proto(b"x" if dtype == "string" else 1.0, shape=[1_000_000, 1_000_000])
    assert proto.ByteSize() < 100  # a tiny request naming a tensor of terabytes
    with pytest.raises(InvalidArgument, match="larger than the request size limit"):
        to_array(proto, "x")


@pytest.fixture
def body_limit(monkeypatch: pytest.MonkeyPatch) -> int:
    """FORKSERVE_MAX_BODY_BYTES of 1 MiB for this test."""
    limit = 1024 * 1024
    monkeypatch.setattr(server.settings, "_current", dataclasses.replace(Settings.current(), max_body_bytes=limit))
    return limit


def test_a_string_fill_counts_the_string_s_length_and_each_element(body_limit: int) -> None:
    png = b"\x89PNG" + b"p" * 189  # the 193 bytes of the demo's digit
    rows = body_limit // (len(png) + STRING_ELEMENT_BYTES)
    assert to_array(tf.make_tensor_proto(png, shape=[rows]), "image").shape == (rows,)
    with pytest.raises(InvalidArgument) as refused:  # 8 bytes an element would have let 131,072 rows through
        to_array(tf.make_tensor_proto(png, shape=[rows + 1]), "image")
    assert "input 'image'" in refused.value.message and "larger than the request size limit" in refused.value.message
    empty = body_limit // STRING_ELEMENT_BYTES + 1
    with pytest.raises(InvalidArgument, match="larger than the request size limit"):
        to_array(tf.make_tensor_proto(b"", shape=[empty]), "text")


def test_many_short_strings_are_held_to_the_size_they_take_decoded(body_limit: int) -> None:
    count = body_limit // STRING_ELEMENT_BYTES + 1
    message = proto(types_pb2.DT_STRING, [count], string_val=[b""] * count)
    assert message.ByteSize() < body_limit // 20  # 2 bytes each on the wire
    with pytest.raises(InvalidArgument, match="larger than the request size limit"):
        to_array(message, "text")
    fits = proto(types_pb2.DT_STRING, [count - 2], string_val=[b""] * (count - 2))
    assert to_array(fits, "text").shape == (count - 2,)


@pytest.mark.parametrize(("dims", "says"), [
    ([0, 2**62, 2**62, 1], "is larger than any tensor can be"),
    ([1] * 70, "has rank 70"),
])
def test_shapes_no_array_can_have_are_refused_not_raised_by_numpy(dims: list[int], says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        to_array(proto(types_pb2.DT_FLOAT, dims), "x")
