"""JSON in and out: orjson fast path, json fallback for NaN/Infinity, numpy output."""

from __future__ import annotations

import math

import numpy as np
import pytest

from server.errors import InvalidArgument
from server.tensors import jsonio


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


def test_dumps_writes_slices_and_transposes_of_any_number_of_rows() -> None:
    probs = np.array([[0.25, 0.75], [0.5, 0.5], [1.0, 0.0]], dtype=np.float32)
    assert jsonio.dumps({"p": probs[:, 1]}) == b'{"p":[0.75,0.5,0.0]}'  # passed publish's one-row example, failed for two
    assert jsonio.dumps(probs.T) == b"[[0.25,0.5,1.0],[0.75,0.5,0.0]]"
    assert jsonio.dumps(np.arange(6, dtype=np.int64)[::-2]) == b"[5,3,1]"


def test_dumps_writes_numpy_strings_and_bytes_as_text() -> None:
    value = {"labels": np.array(["cat", "chèvre"]), "one": np.str_("dog"), "raw": np.bytes_(b"barolo"),
             "tf_strings": np.array([b"red", b"blue"], dtype=object), "fixed": np.array([b"ab"], dtype="S2")}
    assert jsonio.loads(jsonio.dumps(value)) == {"labels": ["cat", "chèvre"], "one": "dog", "raw": "barolo",
                                                 "tf_strings": ["red", "blue"], "fixed": ["ab"]}


def test_dumps_writes_bytes_that_are_not_text_as_b64() -> None:
    assert jsonio.dumps({"png": b"\x89PNG\xff"}) == b'{"png":{"b64":"iVBOR/8="}}'


def test_dumps_writes_other_numpy_scalars_and_object_arrays() -> None:
    value = [np.longdouble(0.5), np.array([0.5], dtype=np.longdouble), np.float16(1.5), np.array([1, None, "x"], dtype=object),
             np.array(2.5), np.bool_(True)]
    assert jsonio.dumps(value) == b'[0.5,[0.5],1.5,[1,null,"x"],2.5,true]'


def test_dumps_writes_nan_from_a_slice_as_null_too() -> None:
    assert jsonio.dumps(np.array([[np.nan, 1.0], [2.0, np.inf]])[:, 0]) == b"[null,2.0]"


@pytest.mark.parametrize(("value", "where"), [
    ({"score": np.complex64(1 + 2j)}, "$['score'] (complex64) cannot be written as JSON"),
    ({"rows": [{"ok": 1}, {"bad": np.array([1j])}]}, "$['rows'][1]['bad'] (array of complex128) cannot be written as JSON"),
    ({"labels": {"a", "b"}}, "$['labels'] (set) cannot be written as JSON"),
    ({"by_class": {np.int64(3): 0.5}}, "a key of $['by_class'] cannot be written as JSON"),
])
def test_dumps_names_where_a_value_it_cannot_write_is(value: object, where: str) -> None:
    with pytest.raises(jsonio.NotJSON) as raised:
        jsonio.dumps(value)
    assert str(raised.value).startswith(where)
