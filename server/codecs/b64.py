"""Strict base64 for `{"b64": ...}` values."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from server.errors import InvalidArgument


def is_b64_value(value: Any) -> bool:
    """True for TF Serving's binary value form `{"b64": "<base64>"}`."""
    return isinstance(value, dict) and len(value) == 1 and "b64" in value


def decode_b64(text: Any) -> bytes:
    """Decode standard base64 strictly, after repairing '+' that form encoding turned into ' '."""
    if not isinstance(text, str):
        raise InvalidArgument(f"b64 value must be a string, got {type(text).__name__}")
    repaired = text.replace(" ", "+").strip()
    try:
        return base64.b64decode(repaired, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidArgument(f"invalid base64 in b64 value: {exc}") from None


def encode_b64(data: bytes) -> dict[str, str]:
    """Binary output in TF Serving's `{"b64": ...}` form."""
    return {"b64": base64.b64encode(data).decode("ascii")}
