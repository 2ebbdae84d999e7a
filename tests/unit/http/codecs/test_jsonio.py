"""JSON in and out: orjson fast path, json fallback for NaN/Infinity, numpy output."""

from __future__ import annotations

import math

import numpy as np
import pytest

from server.errors import InvalidArgument
from server.http.codecs import jsonio


def test_loads_parses_standard_json() -> None:
    assert jsonio.loads(b'{"instances": [[1, 2.5], [3, 4]], "s": "\\u00e9"}') == {
        "instances": [[1, 2.5], [3, 4]],
        "s": "é",
    }


def test_loads_accepts_nan_and_infinity_tokens() -> None:
    value = jsonio.loads(b'{"instances": [NaN, Infinity, -Infinity, 1.0]}')
    nan, inf, ninf, one = value["instances"]
    assert math.isnan(nan)
    assert inf == math.inf and ninf == -math.inf and one == 1.0


@pytest.mark.parametrize(
    "raw",
    [b"{", b'{"a": }', b"[1, 2,]", b"{'a': 1}", b"nan", b'{"a": 1} trailing', b"   ", b"\xff\xfe{}", b'"\xc3\x28"'],
)
def test_loads_refuses_malformed_json(raw: bytes) -> None:
    with pytest.raises(InvalidArgument, match="malformed JSON") as caught:
        jsonio.loads(raw)
    assert caught.value.status == 400


def test_loads_refuses_an_empty_body() -> None:
    with pytest.raises(InvalidArgument, match="request body is empty"):
        jsonio.loads(b"")


def test_loads_refuses_absurd_nesting_without_crashing() -> None:
    with pytest.raises(InvalidArgument, match="malformed JSON"):
        jsonio.loads(b"[" * 100_000 + b"]" * 100_000)


def test_dumps_writes_numpy_arrays_and_scalars_natively() -> None:
    value = {
        "f32": np.array([[0.5, 1.5]], dtype=np.float32),
        "i64": np.array([1, -2], dtype=np.int64),
        "u8": np.array([255], dtype=np.uint8),
        "b": np.array([True, False]),
        "scalar": np.float32(0.25),
        "int": np.int32(7),
        "plain": [1, "x", None],
    }
    assert jsonio.dumps(value) == (
        b'{"f32":[[0.5,1.5]],"i64":[1,-2],"u8":[255],"b":[true,false],"scalar":0.25,"int":7,"plain":[1,"x",null]}'
    )


def test_dumps_writes_nan_and_infinity_as_null() -> None:
    assert jsonio.dumps(np.array([np.nan, np.inf, 1.0], dtype=np.float32)) == b"[null,null,1.0]"


def test_dumps_accepts_non_string_keys() -> None:
    assert jsonio.dumps({1: "a"}) == b'{"1":"a"}'


def test_dumps_output_round_trips_through_loads() -> None:
    value = {"predictions": [[0.125, 2.0]], "name": "digits"}
    assert jsonio.loads(jsonio.dumps(value)) == value
