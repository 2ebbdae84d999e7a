"""Which requests the predict fast path takes and which it leaves to Flask (no TensorFlow: versions are records)."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pytest

from server.config import ModelConfig
from server.http.fast_predict import FastPredict
from server.models.registry import AVAILABLE, END, Model, ModelRegistry, ModelVersion
from server.repository import VersionSource
from server.settings import Settings


def version(model: str, number: int, state: str = AVAILABLE, handler: object = None) -> ModelVersion:
    entry = ModelVersion(VersionSource(model, number, Path("/nonexistent"), "keras"), ModelConfig(), state=state)
    entry.handler = handler  # type: ignore[assignment]
    return entry


@pytest.fixture()
def fast(tmp_path: Path) -> FastPredict:
    registry = ModelRegistry(tmp_path)
    registry.models["mlp"] = Model("mlp", ModelConfig(), {1: version("mlp", 1), 2: version("mlp", 2, END)})
    registry.models["shaped"] = Model("shaped", ModelConfig(), {1: version("shaped", 1, handler=object())})
    settings = dataclasses.replace(Settings.current(), max_body_bytes=1000)
    return FastPredict(lambda environ, start_response: [b"flask"], registry, settings)


def environ(path: str = "/v1/models/mlp:predict", method: str = "POST", length: str | None = "10",
            content_type: str = "application/json", **extra: str) -> dict:
    found = {"REQUEST_METHOD": method, "PATH_INFO": path, "CONTENT_TYPE": content_type, "wsgi.input": io.BytesIO(b"")}
    if length is not None:
        found["CONTENT_LENGTH"] = length
    return {**found, **extra}


@pytest.mark.parametrize(("request_environ", "version_taken"), [
    (environ(), 1),
    (environ("/v1/models/mlp/versions/1:predict"), 1),
    (environ(content_type="application/json; charset=utf-8"), 1),
    (environ(content_type=""), 1),
    (environ(content_type="application/vnd.api+json"), 1),
])
def test_a_plain_predict_is_answered_here(fast: FastPredict, request_environ: dict, version_taken: int) -> None:
    target = fast._served(request_environ)
    assert target is not None and target.version == version_taken


@pytest.mark.parametrize("request_environ", [
    environ(method="GET"),
    environ("/v1/models/mlp:classify"),
    environ("/v1/models/mlp:Predict"),
    environ("/v1/models/mlp:predict/"),
    environ("/v1/models/mlp:predict\n"),  # `:predict%0A`: Flask's routing refuses it (404)
    environ("/v1/models/mlp/versions/1:predict\n"),
    environ("/v1/models/mlp/labels/stable:predict"),
    environ("/v1/models/mlp/versions/2:predict"),  # END: Flask says why
    environ("/v1/models/mlp/versions/3:predict"),
    environ("/v1/models/mlp/versions/01:predict"),
    environ("/v1/models/nope:predict"),
    environ("/v1/models/shaped:predict"),  # a handler shapes its answers
    environ("/v2/models/mlp/infer"),
    environ(length=None),
    environ(length="1001"),
    environ(length="-1"),
    environ(HTTP_TRANSFER_ENCODING="chunked"),
    environ(content_type="text/html"),
])
def test_anything_else_goes_to_flask_untouched(fast: FastPredict, request_environ: dict) -> None:
    assert fast._served(request_environ) is None
    assert fast(request_environ, lambda status, headers: None) == [b"flask"]
