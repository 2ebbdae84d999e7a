"""A handler model's predict through the Flask app: what the handler raises or returns becomes one answer, never more.

Real handler.py files, the real app, registry, executor and handler pool; the model is a stand-in
that echoes its input (no TensorFlow).
"""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace
from typing import Iterator

import numpy as np
import pytest
from flask.testing import FlaskClient
from prometheus_client import REGISTRY

from server.config import ModelConfig, ServerConfig
from server.dataplane import answers
from server.http.app import create_app
from server.models.registry import Model, ModelVersion
from server.repository import VersionSource
from server.settings import Settings
from server.signature import SignatureInfo, TensorInfo
from server.telemetry.lines import LineLimit

SIGNATURE = SignatureInfo("serving_default", "predict", {"x": TensorInfo("x", "float32", (None, 2))},
                          {"y": TensorInfo("y", "float32", (None, 2))})
HANDLER = '''
import sys
import threading
import time
import numpy as np

HANG = threading.Event()


class Handler:
    def preprocess(self, body):
        action = body.get("pre")
        if action == "exit3":
            sys.exit(3)
        if action == "exit1":
            sys.exit(1)
        if action == "interrupt":
            raise KeyboardInterrupt
        if action == "hang":
            HANG.wait()
        if action == "late":
            time.sleep(float(body["seconds"]))
        if action == "list":
            return [body["rows"]]
        if action == "names":
            return {"features": np.asarray(body["rows"], dtype=np.float32)}
        if action == "type":
            return {"x": np.asarray(body["rows"], dtype=np.float32) * len(body["scale"])}
        return {"x": np.asarray(body["rows"], dtype=np.float32)}

    def postprocess(self, outputs, body):
        action = body.get("post")
        if action == "exit3":
            sys.exit(3)
        if action == "missing_output":
            return outputs["scores"]
        if action == "complex":
            return {"ok": 1, "score": np.complex64(1j)}
        if action == "hang":
            HANG.wait()
        return {"second": outputs["y"][:, 1], "labels": np.array(["a", "b"])[: len(outputs["y"])]}
'''


def servable() -> SimpleNamespace:
    return SimpleNamespace(signatures={"serving_default": SIGNATURE}, warm_up=lambda buckets: len(buckets), traces=lambda: 0,
                           run=lambda name, fed: {"y": np.asarray(fed["x"])})


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlaskClient]:
    """An app serving model `m` version 1 with HANDLER."""
    directory = tmp_path_factory.mktemp("handled") / "m" / "1"
    directory.mkdir(parents=True)
    (directory / "handler.py").write_text(HANDLER)
    config = ModelConfig(handler=True, request_timeout_s=5.0)
    version = ModelVersion(VersionSource("m", 1, directory, "keras"), config)
    app = create_app(config=ServerConfig())
    registry = app.extensions["forkserve"]
    assert registry._load_version(version, SimpleNamespace(load_servable=lambda source: servable())), version.error
    registry.models["m"] = Model("m", config, {1: version})
    registry.loaded = True
    yield app.test_client()
    __import__(version.handler.module_name).HANG.set()


@pytest.fixture(autouse=True)
def every_traceback_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh traceback rate limit per test: these tests read the traceback of their own request."""
    monkeypatch.setattr(answers, "TRACEBACK_LOG_LIMIT", LineLimit(per_second=5))


def post(client: FlaskClient, body: dict, **headers: str):
    return client.post("/v1/models/m:predict", json={"rows": [[0.5, 1.5], [2.0, 3.0]], **body}, headers=headers)


def test_a_handler_answers_slices_and_string_arrays_of_several_rows(client: FlaskClient) -> None:
    answer = post(client, {})
    assert answer.status_code == 200, answer.json
    assert answer.json == {"second": [1.5, 3.0], "labels": ["a", "b"]}


@pytest.mark.parametrize(("body", "raised"), [
    ({"pre": "exit3"}, "Handler.preprocess raised SystemExit: 3 (handler.py line"),
    ({"pre": "exit1"}, "Handler.preprocess raised SystemExit: 1 (handler.py line"),
    ({"pre": "interrupt"}, "Handler.preprocess raised KeyboardInterrupt (handler.py line"),
    ({"post": "exit3"}, "Handler.postprocess raised SystemExit: 3 (handler.py line"),
    ({"post": "missing_output"}, "Handler.postprocess raised KeyError: 'scores' (handler.py line"),
    ({"post": "complex"}, "Handler.postprocess's result: $['score'] (complex64) cannot be written as JSON"),
    ({"pre": "list"}, "Handler.preprocess must return a dict of input name to array, got list (the handler has no example"),
    ({"pre": "names"}, "Handler.preprocess returned inputs ['features']; signature 'serving_default' takes ['x']"),
])
def test_a_handler_bug_is_a_500_for_its_request_naming_the_model_and_what_it_raised(
    client: FlaskClient, caplog: pytest.LogCaptureFixture, body: dict, raised: str,
) -> None:
    with caplog.at_level(logging.ERROR, logger="forkserve.app"):
        answer = post(client, body, **{"X-Request-Id": "bug-1"})
    assert answer.status_code == 500 and answer.json == {"error": "internal error (request id bug-1)"}
    assert answer.headers["X-Model-Version"] == "1"  # the access log's version=
    assert "request bug-1: unexpected error" in caplog.text and f"model m version 1: {raised}" in caplog.text
    assert post(client, {}).status_code == 200  # the next request is served


@pytest.mark.parametrize(("body", "message"), [
    ({"rows": None, "pre": None, "missing": True}, "the request has no field 'rows' (the model's handler needs it)"),
    ({"pre": "type", "scale": 3}, "a field of the request has the wrong type: object of type 'int' has no len()"),
])
def test_a_missing_or_mistyped_field_read_by_preprocess_is_the_clients_400(client: FlaskClient, body: dict, message: str) -> None:
    if body.pop("missing", False):
        answer = client.post("/v1/models/m:predict", json={})
    else:
        answer = post(client, body)
    assert answer.status_code == 400 and answer.json == {"error": message}
    assert answer.headers["X-Model-Version"] == "1"


def deadlines() -> float:
    """Requests of model m answered 504 so far (each must be counted once)."""
    return REGISTRY.get_sample_value("forkserve_rejected_requests_total", {"model": "m", "reason": "deadline"}) or 0.0


@pytest.mark.parametrize("body", [
    {"pre": "hang"}, {"post": "hang"},
    {"pre": "late", "seconds": 0.32},  # back within the request thread's grace
    {"pre": "late", "seconds": 0.45},  # back after the request thread answered
])
def test_a_handler_past_the_deadline_is_one_504_counted_once(client: FlaskClient, body: dict) -> None:
    before = deadlines()
    started = time.monotonic()
    answer = post(client, body, **{"X-Request-Timeout": "0.3"})
    assert answer.status_code == 504 and "did not return from" in answer.json["error"]
    assert 0.25 < time.monotonic() - started < 2.5
    assert post(client, {}).status_code == 200  # other threads of the pool answer meanwhile
    time.sleep(0.3)  # NOTE: a late preprocess's flow goes on after its 504: it must not reach the model's own count
    assert deadlines() - before == 1


def test_a_handler_whose_threads_all_hang_is_refused_at_once(client: FlaskClient) -> None:
    results: list[int] = []

    def hang() -> None:
        results.append(post(client, {"pre": "hang"}, **{"X-Request-Timeout": "0.3"}).status_code)

    threads = [threading.Thread(target=hang) for _ in range(Settings.current().threads + 2)]  # more than the pool has threads
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert set(results) == {504}
    started = time.monotonic()
    refused = post(client, {})
    assert refused.status_code == 503 and "is stuck" in refused.json["error"] and refused.headers["Retry-After"] == "1"
    assert time.monotonic() - started < 1.0
