"""Base64 for `{"b64": ...}` values: the forms common tools produce, checked strictly after that."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from server.errors import InvalidArgument

# Line breaks are dropped (`base64` wraps at 76 columns); spaces are '+' that form encoding turned
# into ' ' (curl -d); the URL-safe alphabet's '-' and '_' are the standard '+' and '/'.
_NORMALISE = str.maketrans({"\n": None, "\r": None, "\t": None, " ": "+", "-": "+", "_": "/"})


def is_b64_value(value: Any) -> bool:
    """True for TF Serving's binary value form `{"b64": "<base64>"}`."""
    return isinstance(value, dict) and len(value) == 1 and "b64" in value


def decode_b64(text: Any) -> bytes:
    """Decode base64: standard or URL-safe, padded or not, line-wrapped or not; anything else is a 400."""
    if not isinstance(text, str):
        raise InvalidArgument(f"b64 value must be a string, got {type(text).__name__}")
    data = text.translate(_NORMALISE).strip().rstrip("=")
    try:
        return base64.b64decode(data + "=" * (-len(data) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidArgument(f"invalid base64 in b64 value: {exc}") from None


def encode_b64(data: bytes) -> dict[str, str]:
    """Binary output in TF Serving's `{"b64": ...}` form."""
    return {"b64": base64.b64encode(data).decode("ascii")}
