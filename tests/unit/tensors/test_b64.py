"""Base64 for TF Serving's {"b64": ...} values: the forms common tools produce, nothing else."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from server.errors import InvalidArgument
from server.tensors.b64 import decode_b64, encode_b64, is_b64_value


def test_decode_standard_base64() -> None:
    assert decode_b64("aGVsbG8=") == b"hello"
    assert decode_b64("") == b""


def test_decode_repairs_plus_signs_that_form_encoding_turned_into_spaces() -> None:
    data = b"\xfb\xef\xbehi!\xfb\xef\xbehi!\xfb\xef\xbe"  # "++++aGkh++++aGkh++++": plus signs at both ends and inside
    encoded = base64.b64encode(data).decode()
    assert "+" in encoded
    assert decode_b64(encoded.replace("+", " ")) == data


def test_decode_strips_surrounding_newlines() -> None:
    assert decode_b64("aGk=\n") == b"hi"
    assert decode_b64("\taGk=\r\n") == b"hi"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("aGk", b"hi"),  # unpadded (JWT-style, many JavaScript encoders)
        ("aGk==", b"hi"),  # one '=' too many
        ("-_8=", b"\xfb\xff"),  # URL-safe alphabet
        ("aGVs\nbG8=", b"hello"),  # MIME line break inside
    ],
)
def test_decode_accepts_what_common_tools_produce(text: str, expected: bytes) -> None:
    assert decode_b64(text) == expected


def test_decode_accepts_the_base64_command_s_wrapped_output() -> None:
    data = bytes(range(256)) * 4
    wrapped = base64.encodebytes(data).decode()  # 76 columns, as `base64 file` prints it
    assert "\n" in wrapped.strip()
    assert decode_b64(wrapped) == data
    assert decode_b64(base64.urlsafe_b64encode(data).decode().rstrip("=")) == data


@pytest.mark.parametrize(
    "text",
    [
        "not base64!",
        "aGk=aGk=",  # data after padding
        "aGVsb",  # one character past a whole group: no padding makes it whole
        "é",
    ],
)
def test_decode_refuses_anything_else(text: str) -> None:
    with pytest.raises(InvalidArgument, match="invalid base64 in b64 value") as caught:
        decode_b64(text)
    assert caught.value.status == 400


@pytest.mark.parametrize("value", [123, None, b"aGk=", ["aGk="], {"b64": "aGk="}])
def test_decode_refuses_non_strings(value: Any) -> None:
    with pytest.raises(InvalidArgument, match="b64 value must be a string"):
        decode_b64(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"b64": "aGk="}, True),
        ({"b64": 1}, True),  # the shape is right; decode_b64 refuses the content
        ({"b64": "aGk=", "x": 1}, False),
        ({}, False),
        ("aGk=", False),
        (["b64"], False),
        (None, False),
    ],
)
def test_is_b64_value_recognises_exactly_one_b64_key(value: Any, expected: bool) -> None:
    assert is_b64_value(value) is expected


def test_encode_round_trips_through_decode() -> None:
    data = bytes(range(256))
    encoded = encode_b64(data)
    assert list(encoded) == ["b64"]
    assert encoded["b64"] == base64.b64encode(data).decode("ascii")
    assert decode_b64(encoded["b64"]) == data
