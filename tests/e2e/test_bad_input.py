"""Bad requests get a clear 4xx JSON error, never a 500 or HTML, and the next request still works."""

from __future__ import annotations

import json

import pytest
import requests

from tests.support.harness import Server
from tests.support.models import MAX_BODY_BYTES

MLP_ROW = [0.25] * 20

# (name, path, raw body or JSON object, extra headers, expected status, words the error must contain)
CASES = [
    ("malformed JSON", "/v1/models/mlp:predict", b'{"instances": [1, 2', {}, 400, ["malformed JSON"]),
    ("body not an object", "/v1/models/mlp:predict", b"[1, 2]", {}, 400, ["JSON object"]),
    ("empty body", "/v1/models/mlp:predict", b"", {}, 400, ["empty"]),
    ("wrong content type", "/v1/models/mlp:predict", b"<a/>", {"Content-Type": "application/xml"}, 415, ["Content-Type"]),
    ("both formats", "/v1/models/mlp:predict", {"instances": [MLP_ROW], "inputs": [MLP_ROW]}, {}, 400, ["both"]),
    ("neither format", "/v1/models/mlp:predict", {"signature_name": "serving_default"}, {}, 400, ["neither"]),
    ("missing named input", "/v1/models/multi_h5:predict", {"instances": [{"tag": [1, 2]}]}, {}, 400, ["missing", "signal"]),
    ("unknown input", "/v1/models/multi_h5:predict", {"inputs": {"tag": [[1, 2]], "signal": [[1, 2, 3]], "x": [1]}}, {}, 400, ["unknown input", "'x'"]),
    ("wrong shape", "/v1/models/mlp:predict", {"instances": [[1.0] * 19]}, {}, 400, ["shape", "19"]),
    ("wrong rank", "/v1/models/mlp:predict", {"instances": [[MLP_ROW]]}, {}, 400, ["rank"]),
    ("ragged rows", "/v1/models/mlp:predict", {"instances": [MLP_ROW, MLP_ROW[:3]]}, {}, 400, ["ragged", "depth 2"]),
    ("strings for floats", "/v1/models/mlp:predict", {"instances": [["a"] * 20]}, {}, 400, ["float32"]),
    ("booleans for floats", "/v1/models/mlp:predict", {"instances": [[True] * 20]}, {}, 400, ["boolean"]),
    ("empty batch", "/v1/models/mlp:predict", {"instances": []}, {}, 400, ["empty batch"]),
    ("NaN", "/v1/models/mlp:predict", b'{"instances": [[NaN' + b", 0.5" * 19 + b"]]}", {}, 400, ["NaN or Infinity"]),
    ("Infinity", "/v1/models/mlp:predict", b'{"instances": [[-Infinity' + b", 0.5" * 19 + b"]]}", {}, 400, ["NaN or Infinity"]),
    ("1e999", "/v1/models/mlp:predict", b'{"instances": [[1e999' + b", 0.5" * 19 + b"]]}", {}, 400, ["NaN or Infinity"]),
    ("float overflow for float32", "/v1/models/mlp:predict", {"instances": [[1e300] + [0.5] * 19]}, {}, 400, ["NaN or Infinity"]),
    ("b64 for a numeric input", "/v1/models/mlp:predict", {"instances": [{"b64": "AAAA"}]}, {}, 400, ["b64"]),
    ("base64 junk", "/v1/models/k3cnn:predict", {"instances": [{"b64": "not*base64!"}]}, {}, 400, ["base64"]),
    ("not an image", "/v1/models/k3cnn:predict", {"instances": [{"b64": "aGVsbG8gd29ybGQ="}]}, {}, 400, ["cannot decode image", "not a JPEG"]),
    ("instances not a list", "/v1/models/mlp:predict", {"instances": 3}, {}, 400, ["list"]),
    ("unknown field", "/v1/models/mlp:predict", {"instances": [MLP_ROW], "extra": 1}, {}, 400, ["unknown field"]),
    ("signature_name not a string", "/v1/models/mlp:predict", {"instances": [MLP_ROW], "signature_name": 3}, {}, 400, ["signature_name"]),
    ("deep JSON", "/v1/models/mlp:predict", b'{"instances": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", {}, 400, ["JSON"]),
    ("examples not a list", "/v1/models/half_plus_two:regress", {"examples": {"x": 1}}, {}, 400, ["examples"]),
    ("null feature", "/v1/models/half_plus_two:regress", {"signature_name": "regress_x_to_y", "examples": [{"x": None}]}, {}, 400,
     ["Feature: x has element with unexpected JSON type: Null"]),
    ("path traversal", "/v1/models/..%2F..:predict", {"instances": [1.0]}, {}, 404, ["malformed"]),
    ("version not a number", "/v1/models/mlp/versions/abc:predict", {"instances": [MLP_ROW]}, {}, 400, ["version"]),
    ("unknown verb", "/v1/models/mlp:explode", {"instances": [MLP_ROW]}, {}, 404, ["explode"]),
    # rows are counted before a row is decoded: none of these images would decode
    ("rows before images", "/v1/models/k3cnn:predict", {"instances": [{"b64": "aGVsbG8gd29ybGQ="}] * 1025}, {}, 400,
     ["request has 1025 rows; the limit is 1024"]),
    ("columns before images", "/v1/models/k3cnn:predict", {"inputs": {"pixels": [{"b64": "aGVsbG8gd29ybGQ="}] * 1025}}, {},
     400, ["request has 1025 rows"]),
    ("examples over the row limit", "/v1/models/half_plus_two:regress",
     {"signature_name": "regress_x_to_y", "examples": [{"x": 1.0}] * 1025}, {}, 400, ["request has 1025 rows"]),
    ("examples over the row limit (classify)", "/v1/models/half_plus_two:classify",
     {"signature_name": "classify_x_to_y", "examples": [{"x": True}] * 1025}, {}, 400, ["request has 1025 rows"]),
    ("lists nested past numpy's dimensions", "/v1/models/mlp:predict", b'{"instances": ' + b"[" * 70 + b"0.5" + b"]" * 70 + b"}",
     {}, 400, ["input 'features' nests its lists deeper than an array can have dimensions (64)"]),
]


def _send(server: Server, path: str, body: bytes | dict, headers: dict) -> requests.Response:
    """POST a raw body or a JSON object."""
    if isinstance(body, bytes):
        return server.post(path, data=body, headers={"Content-Type": "application/json", **headers})
    return server.post(path, json=body, headers=headers)


def _assert_clean_error(response: requests.Response, status: int, words: list[str]) -> None:
    """A JSON body with exactly one 'error' string that names the problem."""
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    assert "Traceback" not in body["error"]
    for word in words:
        assert word.lower() in body["error"].lower(), (word, body["error"])
    assert "object at 0x" not in body["error"] and "inhomogeneous" not in body["error"], body["error"]
    assert len(body["error"]) < 300, body["error"]


@pytest.mark.parametrize("name,path,body,headers,status,words", CASES, ids=[c[0] for c in CASES])
def test_bad_request_gets_clear_4xx_and_server_keeps_serving(
    server: Server, name: str, path: str, body: bytes | dict, headers: dict, status: int, words: list[str]
) -> None:
    _assert_clean_error(_send(server, path, body, headers), status, words)
    after = server.post("/v1/models/mlp:predict", json={"instances": [MLP_ROW]})
    assert after.status_code == 200, after.text


def test_body_over_the_limit_is_413(server: Server) -> None:
    body = b'{"instances": [' + b"0.5," * (MAX_BODY_BYTES // 4) + b"0.5]}"
    _assert_clean_error(_send(server, "/v1/models/mlp:predict", body, {}), 413, [])


def test_chunked_body_over_the_limit_is_413_not_a_truncated_parse(server: Server) -> None:
    body = b'{"instances": [' + b"0.5," * (MAX_BODY_BYTES // 4) + b"0.5]}"
    chunks = (body[i : i + 65536] for i in range(0, len(body), 65536))  # no Content-Length: chunked
    response = requests.post(server.url + "/v1/models/mlp:predict", data=chunks, timeout=30,
                             headers={"Content-Type": "application/json"})
    _assert_clean_error(response, 413, [])
    just_under = b'{"instances": [' + b",".join([b"[" + b",".join([b"0.5"] * 20) + b"]"] * 2) + b"]}"
    ok = requests.post(server.url + "/v1/models/mlp:predict", data=iter([just_under[:10], just_under[10:]]), timeout=30)
    assert ok.status_code == 200 and len(ok.json()["predictions"]) == 2


def test_wrong_method_is_405_json(server: Server) -> None:
    _assert_clean_error(server.get("/v1/models/mlp:predict"), 405, ["POST"])
    _assert_clean_error(server.post("/v1/models/mlp/metadata", json={}), 405, ["GET"])


def test_unknown_route_is_json_404(server: Server) -> None:
    _assert_clean_error(server.get("/nothing/here"), 404, [])


def test_non_finite_values_reach_a_model_configured_for_them(server: Server) -> None:
    response = _send(server, "/v1/models/nonfinite:predict", b'{"instances": [[NaN' + b", 0.5" * 19 + b"]]}", {})
    assert response.status_code == 200, response.text
    assert len(response.json()["predictions"][0]) == 2


@pytest.mark.parametrize("body", [
    {"instances": [{"b64": "aGVsbG8gd29ybGQ="}] * 1025},
    {"inputs": [{"b64": "aGVsbG8gd29ybGQ="}] * 1025},
])
def test_rows_are_counted_before_decoding_on_flasks_path_too(server: Server, body: dict) -> None:
    data = json.dumps(body).encode()
    chunks = iter([data[:100], data[100:]])  # no Content-Length: the fast path leaves it to Flask
    response = requests.post(server.url + "/v1/models/k3cnn:predict", data=chunks, timeout=30,
                             headers={"Content-Type": "application/json"})
    _assert_clean_error(response, 400, ["request has 1025 rows; the limit is 1024 (max_request_rows)"])
