"""JSON values to numpy arrays of a signature's dtypes (strings, b64 values, images)."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any, Callable

import numpy as np
import pytest

import server.settings
from server.config import ModelConfig
from server.errors import InvalidArgument
from server.settings import Settings
from server.signature import SignatureInfo, TensorInfo
from server.tensors.arrays import to_array
from server.tensors.declared import STRING_ELEMENT_BYTES

CONFIG = ModelConfig()


def info(dtype: str, *shape: int | None, name: str = "x") -> TensorInfo:
    """A TensorInfo named `name` with the given dtype and shape."""
    return TensorInfo(name, dtype, tuple(shape))


def signature(*inputs: TensorInfo, strict: bool = True) -> SignatureInfo:
    """A predict signature over `inputs` with one float output."""
    return SignatureInfo(
        "serving_default",
        "predict",
        {t.name: t for t in inputs},
        {"y": TensorInfo("y", "float32", (None,))},
        strict_shapes=strict,
    )


def b64(data: bytes) -> dict[str, str]:
    """TF Serving's binary value form."""
    return {"b64": base64.b64encode(data).decode()}


# --- to_array: dtypes -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_numbers_become_the_float_dtype_of_the_input(dtype: str) -> None:
    array = to_array([[1, 2.5], [3, -4]], info(dtype, None, 2), CONFIG)
    assert array.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(array, [[1, 2.5], [3, -4]])


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8", "uint16"])
def test_integers_become_the_int_dtype_of_the_input(dtype: str) -> None:
    array = to_array([[1, 2], [3, 4]], info(dtype, None, 2), CONFIG)
    assert array.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(array, [[1, 2], [3, 4]])


@pytest.mark.parametrize("value", [[1.5], [1.0], [1, 2.5]])
def test_floats_into_an_int_input_are_refused(value: list) -> None:
    with pytest.raises(InvalidArgument, match="input 'x' takes int32, got floating-point values"):
        to_array(value, info("int32", None), CONFIG)


@pytest.mark.parametrize(("dtype", "value"), [("uint8", [256]), ("uint8", [-1]), ("int8", [-129]), ("int32", [2**31]), ("int64", [2**70])])
def test_integers_out_of_range_are_refused(dtype: str, value: list) -> None:
    with pytest.raises(InvalidArgument, match="input 'x'"):
        to_array(value, info(dtype, None), CONFIG)


def test_booleans_into_a_float_input_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="input 'x' takes float32, got booleans"):
        to_array([True, False], info("float32", None), CONFIG)


def test_booleans_into_an_int_input_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="got booleans"):
        to_array([True], info("int64", None), CONFIG)


def test_bool_input_takes_only_booleans() -> None:
    array = to_array([True, False], info("bool", None), CONFIG)
    assert array.dtype == np.bool_ and array.tolist() == [True, False]
    with pytest.raises(InvalidArgument, match="input 'x' takes booleans, got int64 values"):
        to_array([1, 0], info("bool", None), CONFIG)


@pytest.mark.parametrize("value", [["1.0"], [1, "a"], [None], [{"a": 1}], "abc"])
def test_strings_and_objects_into_a_numeric_input_are_refused(value: Any) -> None:
    with pytest.raises(InvalidArgument, match="takes float32 numbers; got strings, objects"):
        to_array(value, info("float32", None), CONFIG)


@pytest.mark.parametrize("value", [[[1, 2], [3]], [[1, 2], 3], [[[1]], [[1, 2]]]])
def test_ragged_numeric_lists_are_refused(value: list) -> None:
    with pytest.raises(InvalidArgument, match="input 'x'"):
        to_array(value, info("float32", None, None), CONFIG)


def test_strings_become_bytes_and_b64_values_are_decoded() -> None:
    array = to_array([["héllo", b64(b"\x00\xff")]], info("string", None, 2), CONFIG)
    assert array.dtype == object and array.shape == (1, 2)
    assert array.tolist() == [["héllo".encode(), b"\x00\xff"]]


@pytest.mark.parametrize("value", [[["a"], ["b", "c"]], [["a", "b"], "c"]])
def test_ragged_string_lists_are_refused(value: list) -> None:
    with pytest.raises(InvalidArgument, match="input 'x' is ragged"):
        to_array(value, info("string", None, None), CONFIG)


@pytest.mark.parametrize("value", [[1], ["a", 2], [None], [True]])
def test_non_strings_into_a_string_input_are_refused(value: list) -> None:
    with pytest.raises(InvalidArgument, match="input 'x' takes strings"):
        to_array(value, info("string", None), CONFIG)


def test_invalid_b64_in_a_string_input_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="invalid base64"):
        to_array([{"b64": "!!"}], info("string", None), CONFIG)


def test_a_string_input_is_held_to_the_size_it_takes_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    limit = 64 * 1024
    monkeypatch.setattr(server.settings, "_current", dataclasses.replace(Settings.current(), max_body_bytes=limit))
    fits = limit // STRING_ELEMENT_BYTES  # zero-length strings: 3 bytes of JSON each
    assert to_array([[""]] * fits, info("string", None, 1), CONFIG).shape == (fits, 1)
    with pytest.raises(InvalidArgument, match="input 'x': 1025 strings of 0 bytes in all make a tensor of 65600 bytes"):
        to_array([[""]] * (fits + 1), info("string", None, 1), CONFIG)
    with pytest.raises(InvalidArgument, match="larger than the request size limit"):
        to_array([[b64(b"x" * 100)]] * (fits // 2), info("string", None, 1), CONFIG)


def test_lone_surrogate_in_a_string_input_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument):
        to_array(["\ud800"], info("string", None), CONFIG)


def test_b64_for_a_numeric_non_image_input_is_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"input 'x' is float32 \[-1, 3\], not an image or string input"):
        to_array([b64(b"abc")], info("float32", None, 3), CONFIG)
    with pytest.raises(InvalidArgument, match="b64 values are not accepted"):
        to_array(b64(b"abc"), info("float32", None, 3), CONFIG, batched=False)


def test_b64_for_an_integer_image_shaped_input_is_refused(encode_image: Callable[..., bytes]) -> None:
    image = b64(encode_image(np.zeros((8, 8), np.uint8)))
    with pytest.raises(InvalidArgument, match="not an image or string input"):
        to_array([image], info("uint8", None, 8, 8, 1), CONFIG)


def test_b64_images_are_decoded_for_an_image_input(encode_image: Callable[..., bytes]) -> None:
    image_info = info("float32", None, 8, 8, 1, name="image")
    first = np.full((8, 8), 255, np.uint8)
    second = np.zeros((8, 8), np.uint8)
    array = to_array([b64(encode_image(first)), b64(encode_image(second))], image_info, CONFIG)
    assert array.shape == (2, 8, 8, 1) and array.dtype == np.float32
    assert array[0].min() == 1.0 and array[1].max() == 0.0


def test_image_rows_may_mix_b64_and_numbers(encode_image: Callable[..., bytes]) -> None:
    image_info = info("float32", None, 8, 8, 1, name="image")
    numbers = np.full((8, 8, 1), 0.5).tolist()
    array = to_array([numbers, b64(encode_image(np.zeros((8, 8), np.uint8)))], image_info, CONFIG)
    assert array.shape == (2, 8, 8, 1)
    assert array[0, 0, 0, 0] == 0.5 and array[1].max() == 0.0


def test_image_rows_of_different_shapes_are_refused(encode_image: Callable[..., bytes]) -> None:
    image_info = info("float32", None, 8, 8, 1, name="image")
    with pytest.raises(InvalidArgument, match="rows have different shapes"):
        to_array([[[[0.5]]], b64(encode_image(np.zeros((8, 8), np.uint8)))], image_info, CONFIG)


def test_unbatched_b64_image_decodes_to_one_example(encode_image: Callable[..., bytes]) -> None:
    image_info = info("float32", None, 8, 8, 1, name="image")
    array = to_array(b64(encode_image(np.zeros((8, 8), np.uint8))), image_info, CONFIG, batched=False)
    assert array.shape == (8, 8, 1)
