"""What every API view shares: reading a JSON body, answering JSON, running inference."""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

import numpy as np
from flask import Response, current_app, request
from werkzeug.exceptions import ClientDisconnected, RequestEntityTooLarge

from server.errors import ApiError, DeadlineExceeded, InvalidArgument
from server.http import instrument
from server.http.codecs import jsonio
from server.http.codecs.tensors import validate_inputs
from server.repository import is_model_name, parse_version
from server.signature import SignatureInfo
from server.telemetry import metrics
from server.worker.registry import ModelRegistry, ModelVersion
from server.worker.reply import ReplyTimeout

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


def request_body() -> bytes:
    """The whole request body: 413 over the size limit (chunked bodies too), 408 when the client stalls."""
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    _limit_client_silence(current_app.extensions["forkserve.settings"].client_timeout)
    try:
        if request.content_length is None and "wsgi.input_terminated" in request.environ:
            # NOTE: werkzeug stops a chunked body at the limit without an error (the JSON parser then
            # saw a truncated document); read one byte past it to tell "exactly the limit" from "more".
            data = request.environ["wsgi.input"].read(limit + 1)
            if len(data) > limit:
                raise RequestEntityTooLarge()
            return data
        return request.get_data(cache=False)
    except (OSError, ClientDisconnected):  # the receive timeout set above (werkzeug wraps it), or a reset
        raise ApiError("the client stopped sending the request body", status=408) from None


def _limit_client_silence(seconds: float) -> None:
    """Bound how long this connection's reads and writes may wait for the client (gunicorn's socket).

    NOTE: gthread reads a body with blocking calls and no timeout: one client stalled mid-body
    held a request thread, and a retiring worker, until graceful_timeout and then gunicorn's kill.
    SO_RCVTIMEO / SO_SNDTIMEO survive gunicorn's setblocking(True) calls.
    """
    sock = request.environ.get("gunicorn.socket")
    if sock is None:
        return
    value = struct.pack("ll", int(seconds), int((seconds % 1) * 1_000_000))
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
    except OSError:
        pass


def read_json() -> Any:
    """The request body parsed as JSON; 415 for another content type, 413 over the size limit."""
    check_content_type()
    return jsonio.loads(request_body())


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


def predict(
    version: ModelVersion, signature_name: str, inputs: dict[str, np.ndarray], decode_started: float,
) -> tuple[SignatureInfo, dict[str, np.ndarray]]:
    """The flow every predict API shares: check the decoded inputs against the signature, run them, wait."""
    signature = version.signature(signature_name)
    fed, rows = validate_inputs(inputs, signature, version.config)
    instrument.stage("decode", time.perf_counter() - decode_started)
    batchable = signature.batchable and all(a.ndim >= 1 for a in fed.values())
    return signature, infer(version, signature.name, fed, rows, batchable)


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
        # A request that gave up (deadline) still shows where it waited: in the queue, or in the call.
        now = time.monotonic()
        instrument.stage("queue", (job.started or now) - job.enqueued)
        if job.started:
            instrument.stage("compute", (job.finished or now) - job.started)
    return outputs
