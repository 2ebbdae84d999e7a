"""What every API view shares: reading a JSON body, answering JSON, running inference."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from flask import Response, current_app, request

from server import metrics
from server.api import instrument
from server.codecs import jsonio
from server.errors import ApiError, DeadlineExceeded, InvalidArgument
from server.models import ModelRegistry, ModelVersion
from server.reply import ReplyTimeout
from server.repository import is_model_name, parse_version

# curl -d sends form-urlencoded and TF Serving's docs use it, so that (and none) also means JSON.
JSON_CONTENT_TYPES = frozenset({"", "application/json", "application/x-www-form-urlencoded", "text/plain"})


def registry() -> ModelRegistry:
    """This worker's models."""
    return current_app.extensions["forkserve"]


def check_content_type(also: frozenset[str] = frozenset()) -> None:
    """415 unless the body is JSON (or one of `also`)."""
    mimetype = request.mimetype or ""
    if mimetype not in JSON_CONTENT_TYPES | also and not mimetype.endswith("+json"):
        wanted = " or ".join(["application/json", *sorted(also)])
        raise ApiError(f"unsupported Content-Type {mimetype!r}; send {wanted}", status=415)


def read_json() -> Any:
    """The request body parsed as JSON; 415 for another content type, 413 over the size limit."""
    check_content_type()
    return jsonio.loads(request.get_data(cache=False))


def model_address(name: str, version: str | None) -> tuple[str, int | None]:
    """A model name and optional version from a URL, validated like repository directories."""
    if not is_model_name(name):
        raise InvalidArgument(f"invalid model name {name!r}")
    if version is None:
        return name, None
    number = parse_version(version)
    if number is None:
        raise InvalidArgument(f"model version must be a positive integer, got {version!r}")
    return name, number


def json_response(payload: Any, status: int = 200, version: ModelVersion | None = None) -> Response:
    """A JSON response, with the version that answered in X-Model-Version."""
    started = time.perf_counter()
    body = jsonio.dumps(payload)
    if version is not None:
        instrument.stage("encode", time.perf_counter() - started)
    response = Response(body, status=status, mimetype="application/json")
    if version is not None:
        response.headers["X-Model-Version"] = str(version.version)
    return response


def request_timeout(version: ModelVersion) -> float:
    """Seconds this request may wait: the model's deadline, shortened by an X-Request-Timeout header."""
    limit = version.config.request_timeout_s
    header = request.headers.get("X-Request-Timeout")
    if header is None:
        return limit
    try:
        asked = float(header)
    except ValueError:
        asked = float("nan")
    if not asked > 0 or asked == float("inf"):
        raise ApiError(f"X-Request-Timeout must be a positive number of seconds, got {header!r}", status=400)
    return min(limit, asked)


def infer(version: ModelVersion, signature: str, inputs: dict[str, np.ndarray], rows: int, batchable: bool) -> dict[str, np.ndarray]:
    """Queue the inputs on the version's executor and wait for its rows, within the deadline."""
    assert version.executor is not None
    timeout = request_timeout(version)
    job = version.executor.submit(signature, inputs, rows, batchable)
    try:
        outputs = job.future.result(timeout=timeout)
    except ReplyTimeout:
        version.executor.cancel(job)
        metrics.record(lambda: metrics.REJECTED_REQUESTS.labels(version.name, "deadline").inc())
        raise DeadlineExceeded(
            f"model {version.name} version {version.version} did not answer within {timeout}s"
        ) from None
    finally:
        if job.started:
            instrument.stage("queue", job.started - job.enqueued)
        if job.finished:
            instrument.stage("compute", job.finished - job.started)
    return outputs
