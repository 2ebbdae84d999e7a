"""JSON in and out: orjson on the fast path, the standard library only for NaN / Infinity."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import orjson

from server.errors import InvalidArgument

_DUMPS_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
_CONTIGUOUS_KINDS = frozenset("biuf")  # dtypes orjson writes natively once the array is C-contiguous
_MAX_DEPTH = 254  # orjson's recursion limit


class NotJSON(TypeError):
    """A value JSON cannot carry; the message names where it is in the value (`$["scores"][2]`)."""


def loads(raw: bytes) -> Any:
    """Parse a request body; NaN / Infinity (TF Serving accepts them) go through json."""
    if not raw:
        raise InvalidArgument("request body is empty; expected a JSON object")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as fast_error:
        # orjson rejects the non-standard NaN / Infinity tokens and nesting beyond 1024 levels;
        # json accepts the tokens (validation later decides whether the model takes them).
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            raise InvalidArgument(f"malformed JSON: {fast_error}") from None


def dumps(value: Any) -> bytes:
    """Serialize a response: numpy arrays and scalars as numbers and lists, NaN and Infinity as null.

    C-contiguous numeric arrays, numpy scalars and Python values are written natively by orjson;
    what it does not take (slices, strings, bytes, object arrays) goes through `_convert`. NotJSON
    names the first value that cannot be written (a complex number, a set, a class instance).
    """
    try:
        return orjson.dumps(value, _convert, _DUMPS_OPTIONS)  # NOTE: positional: keywords cost more per call
    except orjson.JSONEncodeError as exc:
        where = _first_unwritable(value, "$")
        raise NotJSON(f"{where or 'the value'} cannot be written as JSON: {exc}") from None


def _convert(value: Any) -> Any:
    """orjson's `default`: what it does not write natively, as something it does (TypeError: nothing)."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind in _CONTIGUOUS_KINDS and not value.flags.c_contiguous:
            return np.ascontiguousarray(value)  # a slice such as probs[:, 1], or a transpose
        return value.tolist()  # strings, bytes, objects, float128: Python values, converted in turn
    if isinstance(value, (bytes, bytearray, memoryview)):  # np.bytes_ too
        data = bytes(value)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(data).decode("ascii")}  # TF Serving's form for binary values
    if isinstance(value, np.floating):  # float128: .item() would return the same type again
        return float(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.generic) and not isinstance(value, np.complexfloating):
        return value.item()
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def _first_unwritable(value: Any, path: str, depth: int = 0) -> str | None:
    """The path of the first part of `value` that cannot be written (slow: only after a failure)."""
    if depth > _MAX_DEPTH:  # orjson's own limit; a value that holds itself ends here
        return "a value nested deeper than 254 levels"
    if isinstance(value, dict):
        for key, item in value.items():
            found = _first_unwritable(item, f"{path}[{key!r}]", depth + 1)
            if found is not None:
                return found
        try:
            orjson.dumps(dict.fromkeys(value), option=_DUMPS_OPTIONS)
        except orjson.JSONEncodeError:
            return f"a key of {path}"
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = _first_unwritable(item, f"{path}[{index}]", depth + 1)
            if found is not None:
                return found
        return None
    try:
        orjson.dumps(value, default=_convert, option=_DUMPS_OPTIONS)
    except orjson.JSONEncodeError:
        kind = f"array of {value.dtype}" if isinstance(value, np.ndarray) else type(value).__name__
        return f"{path} ({kind})"
    return None
