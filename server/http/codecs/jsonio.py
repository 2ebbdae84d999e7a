"""JSON in and out: orjson on the fast path, the standard library only for NaN / Infinity."""

from __future__ import annotations

import json
from typing import Any

import orjson

from server.errors import InvalidArgument

_DUMPS_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


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
    """Serialize a response; numpy arrays and scalars are written natively, NaN as null."""
    return orjson.dumps(value, option=_DUMPS_OPTIONS)
