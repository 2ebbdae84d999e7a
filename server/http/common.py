"""What every API view shares: reading a JSON body, answering JSON, running inference."""

from __future__ import annotations

import itertools
import logging
import os
import re
import socket
import ssl
import struct
import sys
import time
from typing import Any

import numpy as np
from flask import Response, current_app, request
from werkzeug.exceptions import ClientDisconnected, RequestEntityTooLarge

from server.errors import ApiError, Cancelled, DeadlineExceeded, InvalidArgument, ResourceExhausted
from server.http import instrument
from server.http.codecs import jsonio, tfserving
from server.http.codecs.declared import check_rows
from server.http.codecs.tensors import validate_inputs
from server.repository import is_model_name, parse_version
from server.signature import SignatureInfo
from server.telemetry import metrics
from server.telemetry.lines import LineLimit
from server.worker.executor import Abandoned
from server.worker.flow import Steps, Wait, run_blocking
from server.worker.registry import ModelRegistry, ModelVersion
from server.worker.reply import CancelledError, ReplyTimeout

log = logging.getLogger("forkserve.app")
TRACEBACK_LOG_LIMIT = LineLimit(per_second=5)

# curl -d sends form-urlencoded and TF Serving's docs use it, so that (and none) also means JSON.
JSON_CONTENT_TYPES = frozenset({"", "application/json", "application/x-www-form-urlencoded", "text/plain"})
REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # NOTE: used with fullmatch (`$` accepts a trailing "\n")


class RequestIds:
    """Unique request ids without a system call each: a random prefix per process and a counter.

    NOTE: uuid4() reads os.urandom per request (12-15 us of CPU on this VM, 5 % of an MLP request's
    Python). The prefix is drawn again in each forked worker, so workers never share one.
    """

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._counter = itertools.count()

    def new(self) -> str:
        return f"{self._prefix}{next(self._counter):016x}"


REQUEST_IDS = RequestIds()


def request_id_for(given: str) -> str:
    """The caller's X-Request-Id when it is sane, else a new one."""
    return given if given and REQUEST_ID_RE.fullmatch(given) else REQUEST_IDS.new()


def is_json_type(mimetype: str, also: frozenset[str] = frozenset()) -> bool:
    """Whether a body of this media type (no parameters, lower case) is read as JSON."""
    return mimetype in JSON_CONTENT_TYPES or mimetype in also or mimetype.endswith("+json")


def registry() -> ModelRegistry:
    """This worker's models."""
    return current_app.extensions["forkserve"]


def check_content_type(also: frozenset[str] = frozenset()) -> None:
    """415 unless the body is JSON (or one of `also`)."""
    mimetype = request.mimetype or ""
    if not is_json_type(mimetype, also):
        wanted = " or ".join(["application/json", *sorted(also)])
        raise ApiError(f"unsupported Content-Type {mimetype!r}; send {wanted}", status=415)


def request_body() -> bytes:
    """The whole request body: 413 over the size limit (chunked bodies too), 408 when the client stalls."""
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    limit_client_silence(request.environ, current_app.extensions["forkserve.settings"].client_timeout)
    try:
        if request.content_length is None and "wsgi.input_terminated" in request.environ:
            # NOTE: werkzeug stops a chunked body at the limit without an error (the JSON parser then
            # saw a truncated document); read one byte past it to tell "exactly the limit" from "more".
            data = request.environ["wsgi.input"].read(limit + 1)
            if len(data) > limit:
                raise RequestEntityTooLarge()
            return data
        data = request.get_data(cache=False)
        if request.content_length is not None and len(data) < request.content_length:
            raise ClientDisconnected()  # NOTE: werkzeug returns a short body as it is; it would parse as JSON
        return data
    except (OSError, ClientDisconnected):  # the receive timeout set above (werkzeug wraps it), or a reset
        raise ApiError("the client stopped sending the request body", status=408) from None


def limit_client_silence(environ: dict[str, Any], seconds: float) -> None:
    """Bound how long this connection's reads and writes may wait for the client (gunicorn's socket).

    NOTE: gthread reads a body with blocking calls and no timeout: one client stalled mid-body
    held a request thread, and a retiring worker, until graceful_timeout and then gunicorn's kill.
    SO_RCVTIMEO / SO_SNDTIMEO survive gunicorn's setblocking(True) calls.
    """
    sock = environ.get("gunicorn.socket")
    if sock is None:
        return
    if isinstance(sock, ssl.SSLSocket):
        # NOTE: TLS (server.tls): a blocking SSLSocket retries its read after SO_RCVTIMEO's EAGAIN (CPython's
        # _ssl loops on SSL_ERROR_WANT_READ), so only its own timeout ends the wait; gthread's setblocking(True)
        # before the connection's next request clears it.
        sock.settimeout(seconds)
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


def encode_json(payload: Any, timed: bool) -> bytes:
    """A JSON body; `timed`: its time is the request's encode stage."""
    started = time.perf_counter()
    body = jsonio.dumps(payload)
    if timed:
        instrument.stage("encode", time.perf_counter() - started)
    return body


def json_response(payload: Any, status: int = 200, version: ModelVersion | None = None) -> Response:
    """A JSON response, with the version that answered in X-Model-Version."""
    response = Response(encode_json(payload, timed=version is not None), status=status, mimetype="application/json")
    if version is not None:
        response.headers["X-Model-Version"] = str(version.version)
    return response


def request_timeout(version: ModelVersion, header: str | None) -> float:
    """Seconds this request may wait: the model's deadline, shortened by the X-Request-Timeout header's value."""
    limit = version.config.request_timeout_s
    if header is None:
        return limit
    try:
        asked = float(header)
    except ValueError:
        asked = float("nan")
    if not asked > 0 or asked == float("inf"):
        raise ApiError(f"X-Request-Timeout must be a positive number of seconds, got {header!r}", status=400)
    return min(limit, asked)


def flask_request_timeout(version: ModelVersion) -> float:
    """request_timeout() for the request Flask is answering."""
    return request_timeout(version, request.headers.get("X-Request-Timeout"))


def tfserving_predict(version: ModelVersion, body: Any, timeout: float) -> dict[str, Any]:
    """TF Serving's predict without a handler, row or columnar, through the executor: the response body."""
    started = time.perf_counter()
    decoded = tfserving.decode_predict(body, version.signature, version.config)
    _, outputs = predict(version, decoded.signature_name, decoded.inputs, started, timeout)
    return tfserving.encode_predict(outputs, decoded.row_format)


def predict(
    version: ModelVersion, signature_name: str, inputs: dict[str, np.ndarray], decode_started: float, timeout: float,
) -> tuple[SignatureInfo, dict[str, np.ndarray]]:
    """The flow every predict API shares, on this thread: check the decoded inputs against the signature, run them, wait."""
    return run_blocking(predict_steps(version, signature_name, inputs, decode_started, timeout))


def predict_steps(
    version: ModelVersion, signature_name: str, inputs: dict[str, np.ndarray], decode_started: float, timeout: float,
) -> Steps[tuple[SignatureInfo, dict[str, np.ndarray]]]:
    """predict() as a flow (server.worker.flow): its driver waits for the model."""
    signature = version.signature(signature_name)
    fed, rows = validate_inputs(inputs, signature, version.config)
    instrument.stage("decode", time.perf_counter() - decode_started)
    batchable = signature.batchable and all(a.ndim >= 1 for a in fed.values())
    outputs = yield from infer_steps(version, signature.name, fed, rows, batchable, timeout)
    return signature, outputs


def infer(
    version: ModelVersion, signature: str, inputs: dict[str, np.ndarray], rows: int, batchable: bool, timeout: float,
) -> dict[str, np.ndarray]:
    """Queue the inputs on the version's executor and wait for its rows on this thread, within `timeout` seconds."""
    return run_blocking(infer_steps(version, signature, inputs, rows, batchable, timeout))


def infer_steps(
    version: ModelVersion, signature: str, inputs: dict[str, np.ndarray], rows: int, batchable: bool, timeout: float,
) -> Steps[dict[str, np.ndarray]]:
    """infer() as a flow (server.worker.flow): queue the job, yield the wait for its rows.

    A request that gives up (its deadline) abandons its job: the executor stops its rows at the next
    max_batch_size chunk. A job abandoned while the flow waits (its gRPC client cancelled: the
    transport, or a flow closed) ends the request as Cancelled. Every API checked its rows before
    decoding; this is the backstop for any path.
    """
    executor = version.executor
    assert executor is not None
    check_rows(rows, version.config.max_request_rows)
    inference = instrument.current()
    trace = inference.trace if inference is not None else None
    if trace is not None:
        trace.rows += rows
        trace.signature = signature
    job = executor.submit(signature, inputs, rows, batchable, trace.span.get_span_context() if trace else None)
    wait = Wait(executor, job, timeout)
    try:
        outputs = yield wait
    except (CancelledError, Abandoned):  # NOTE: the transport abandoned the job while the flow waited
        wait.abandon()
        raise Cancelled(f"the call to model {version.name} version {version.version} was cancelled") from None
    except GeneratorExit:  # the flow was closed unfinished: nobody waits for these rows
        wait.abandon()
        raise
    except ReplyTimeout:
        wait.abandon()
        metrics.record(lambda: metrics.REJECTED_REQUESTS.labels(version.name, "deadline").inc())
        raise DeadlineExceeded(
            f"model {version.name} version {version.version} did not answer within {timeout}s"
        ) from None
    finally:
        # A request that gave up (deadline) still shows where it waited: in the queue, or in the call.
        now = time.monotonic()
        instrument.stage("queue", (job.started or now) - job.enqueued, job.started or now)
        if job.started:
            instrument.stage("compute", (job.finished or now) - job.started, job.finished or now)
    return outputs


def api_error_answer(exc: ApiError, request_id: str) -> tuple[int, dict[str, str], dict[str, str]]:
    """A known failure: (status, TF Serving's `{"error": ...}`, extra headers)."""
    instrument.note_error(exc)
    if exc.status >= 500:
        log.warning("request %s failed with %d: %s", request_id, exc.status, exc.message)
    retry = isinstance(exc, ResourceExhausted) or exc.status == 503
    return exc.status, {"error": exc.message}, {"Retry-After": "1"} if retry else {}


def log_unexpected(logger: logging.Logger, request_id: str) -> None:
    """A bug's traceback with the request id (call from an except block), at most TRACEBACK_LOG_LIMIT a second.

    NOTE: a request that trips the same bug each time must not fill the log (a full traceback a request),
    REST and gRPC alike: the rest are counted and the count logged with the next traceback let through.
    """
    suppressed = TRACEBACK_LOG_LIMIT.admit()
    if suppressed is None:
        return
    if suppressed:
        log.warning("%d more unexpected errors were not logged (at most %d tracebacks a second)",
                    suppressed, TRACEBACK_LOG_LIMIT.per_second)
    logger.exception("request %s: unexpected error", request_id)


def unexpected_error_answer(request_id: str) -> tuple[int, dict[str, str]]:
    """A bug (call from an except block): log the traceback (rate-limited) with the request id, tell the client only the id."""
    log_unexpected(log, request_id)
    error = sys.exc_info()[1]
    if error is not None:
        instrument.note_error(error)
    return 500, {"error": f"internal error (request id {request_id})"}
