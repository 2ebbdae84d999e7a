"""JSON values to numpy arrays checked against a signature: dtype, shape, batch, finiteness."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from server.config import ModelConfig
from server.errors import InvalidArgument
from server.signature import TensorInfo
from server.tensors.b64 import decode_b64, is_b64_value
from server.tensors.declared import check_strings
from server.tensors.images import decode_image


def _ragged(name: str, exc: Exception) -> InvalidArgument:
    """A short 400 for nested lists numpy cannot stack (its own message runs for lines)."""
    if "maximum number of dimension" in str(exc):
        return InvalidArgument(f"input {name!r} nests its lists deeper than an array can have dimensions (64)")
    depth = re.search(r"after (\d+) dimension", str(exc))
    where = f": the lists at depth {int(depth[1]) + 1} differ in length" if depth else ""
    return InvalidArgument(f"input {name!r} is ragged{where}; every row must have the same shape")


def utf8(text: str, name: str) -> bytes:
    """A JSON string as UTF-8 bytes; lone surrogates (which json lets through) are a 400."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"{name!r}: string is not valid Unicode: {exc.reason}") from None


def _string_tensor(value: Any, name: str) -> np.ndarray:
    """Nested lists of str / {"b64"} values to an object array of bytes, held to the size limit (check_strings)."""
    count, length = 0, 0

    def convert(item: Any) -> Any:
        nonlocal count, length
        if isinstance(item, list):
            return [convert(x) for x in item]
        if isinstance(item, str):
            data = utf8(item, name)
        elif is_b64_value(item):
            data = decode_b64(item["b64"])
        else:
            raise InvalidArgument(f"input {name!r} takes strings, got {type(item).__name__}")
        count, length = count + 1, length + len(data)
        return data

    converted = convert(value)
    check_strings(name, count, length)
    try:
        array = np.array(converted, dtype=object)
    except ValueError as exc:
        raise _ragged(name, exc) from None
    if array.dtype != object or (array.size and not all(isinstance(x, bytes) for x in array.flat)):
        raise InvalidArgument(f"input {name!r} is ragged: every row needs the same shape")
    return array


def numeric_array(value: Any, info: TensorInfo) -> np.ndarray:
    """Nested lists of numbers to an array of the input's dtype, refusing lossy casts."""
    try:
        array = np.asarray(value)
    except OverflowError:
        raise InvalidArgument(f"input {info.name!r}: value out of range for {info.dtype}") from None
    except ValueError as exc:
        raise _ragged(info.name, exc) from None
    kind = array.dtype.kind
    wanted = np.dtype(info.dtype)
    if kind in "OUS" or kind == "V":
        raise InvalidArgument(
            f"input {info.name!r} takes {info.dtype} numbers; got strings, objects or rows of different shapes"
        )
    if wanted.kind == "b":
        if kind != "b":
            raise InvalidArgument(f"input {info.name!r} takes booleans, got {array.dtype.name} values")
    elif kind == "b":
        raise InvalidArgument(f"input {info.name!r} takes {info.dtype}, got booleans")
    elif wanted.kind in "iu" and kind == "f":
        raise InvalidArgument(f"input {info.name!r} takes {info.dtype}, got floating-point values")
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            cast = array.astype(wanted, copy=False)
    except (OverflowError, ValueError) as exc:
        raise InvalidArgument(f"input {info.name!r}: value out of range for {info.dtype}: {exc}") from None
    if wanted.kind in "iu" and not np.array_equal(cast, array):
        raise InvalidArgument(f"input {info.name!r}: value out of range for {info.dtype}")
    return cast


def _image_rows(rows: list[Any], info: TensorInfo, config: ModelConfig) -> np.ndarray:
    """A batch where rows may be `{"b64": <image>}` or nested numbers."""
    decoded = [
        decode_image(decode_b64(row["b64"]), info, config) if is_b64_value(row) else numeric_array(row, info)
        for row in rows
    ]
    shapes = {a.shape for a in decoded}
    if len(shapes) != 1:
        raise InvalidArgument(f"input {info.name!r}: rows have different shapes {sorted(shapes)}")
    if len(decoded) == 1:  # the usual request: one image; a view, not a copy of its pixels
        return decoded[0][np.newaxis]
    return np.stack(decoded)


def to_array(value: Any, info: TensorInfo, config: ModelConfig, batched: bool = True) -> np.ndarray:
    """Convert the JSON value of one input (the whole batch) to numpy."""
    if info.dtype == "string":
        return _string_tensor(value, info.name)
    if info.is_image:
        if is_b64_value(value) and not batched:
            return decode_image(decode_b64(value["b64"]), info, config)
        if isinstance(value, list) and any(is_b64_value(row) for row in value):
            return _image_rows(value, info, config)
    if is_b64_value(value) or (isinstance(value, list) and value and is_b64_value(value[0])):
        raise InvalidArgument(
            f"input {info.name!r} is {info.dtype} {info.describe_shape()}, not an image or string input: "
            "b64 values are not accepted"
        )
    return numeric_array(value, info)
