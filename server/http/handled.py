"""The request thread's part of a model version with a handler: preprocess, the shared predict flow, postprocess.

The TensorFlow call is not here: preprocess's arrays go through the same validation and the
same executor queue as a plain request (server.http.common.predict), so requests through a
handler are batched with each other. preprocess and postprocess run on the version's own
threads (server.worker.handler_pool), each waited for with what is left of the request's
deadline: a handler that hangs costs its requests a 504, never the worker's request threads.

What a handler raises is sorted here (docs/handlers.md): the client's fault is a 400 with its
message, anything else (SystemExit and KeyboardInterrupt included) a 500 for this request only,
logged with the model, version and request id. The worker goes on.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import orjson

from server.errors import DeadlineExceeded, InvalidArgument, Unavailable
from server.http import instrument
from server.http.codecs import jsonio, tfserving
from server.http.common import flask_request_timeout, predict
from server.telemetry import metrics
from server.worker.handler_pool import HandlerRaised, HandlerStuck, HandlerTimeout
from server.worker.handlers import describe_failure, model_inputs
from server.worker.registry import ModelVersion

log = logging.getLogger("forkserve.handlers")

# What each step may raise for a request the client got wrong (400); anything else is the handler's bug (500).
# NOTE: preprocess reads the client's body: `body["x"]` on a missing field (KeyError) or a field of
# the wrong type (TypeError) is the request's fault, as a missing form field is in Flask. postprocess
# reads the model's outputs: a KeyError there is a wrong output name in handler.py.
CLIENT_ERRORS: dict[str, tuple[type[BaseException], ...]] = {
    "preprocess": (ValueError, KeyError, TypeError),
    "postprocess": (ValueError,),
}
CLIENT_ERROR_LOG_LIMIT = instrument.LineLimit(per_second=5)


class HandlerFailed(Exception):
    """The handler raised or returned what answers its request 500: a bug in handler.py (the cause is chained)."""


def predict_with_handler(version: ModelVersion, body: Any) -> Any:
    """The whole response body for `body`, as the version's handler shapes it."""
    handler = version.handler
    assert handler is not None
    instrument.label_errors_with_version()  # the access log names the version of a handler's 4xx / 5xx too
    timeout = flask_request_timeout(version)
    deadline = time.monotonic() + timeout
    body = tfserving.request_object(body)
    started = time.perf_counter()
    if handler.preprocess is not None:
        produced = _call(version, "preprocess", handler.preprocess, (body,), deadline, timeout)
        signature_name, row_format = handler.signature_name, True
        inputs = _model_inputs(version, produced)
        instrument.stage("preprocess", time.perf_counter() - started)
        started = time.perf_counter()
    else:
        decoded = tfserving.decode_predict(body, version.signature, version.config)
        inputs, signature_name, row_format = decoded.inputs, decoded.signature_name, decoded.row_format
    _, outputs = predict(version, signature_name, inputs, started, max(0.0, deadline - time.monotonic()))
    if handler.postprocess is None:
        return tfserving.encode_predict(outputs, row_format)
    started = time.perf_counter()
    result = _call(version, "postprocess", handler.postprocess, (outputs, body), deadline, timeout)
    instrument.stage("postprocess", time.perf_counter() - started)
    started = time.perf_counter()
    encoded = _encoded(version, result)
    instrument.stage("encode", time.perf_counter() - started)
    return encoded


def _call(
    version: ModelVersion, step: str, method: Callable[..., Any], args: tuple[Any, ...], deadline: float, timeout: float,
) -> Any:
    """One handler method on the version's pool, within the request's deadline; its failure sorted."""
    assert version.handler is not None
    try:
        return version.handler.pool.call(step, method, args, deadline - time.monotonic())
    except HandlerRaised as raised:
        error = raised.error
        if isinstance(error, CLIENT_ERRORS[step]):
            raise InvalidArgument(_client_message(version, step, error)) from None
        raise HandlerFailed(f"{_name(version)}: Handler.{step} raised {describe_failure(error)}") from error
    except HandlerTimeout:
        metrics.record(lambda: metrics.REJECTED_REQUESTS.labels(version.name, "deadline").inc())
        raise DeadlineExceeded(
            f"{_name(version)}: its handler did not return from {step} within the request's deadline ({timeout:g}s)"
        ) from None
    except HandlerStuck as stuck:
        metrics.record(lambda: metrics.REJECTED_REQUESTS.labels(version.name, "handler_stuck").inc())
        raise Unavailable(str(stuck)) from None


def _client_message(version: ModelVersion, step: str, error: BaseException) -> str:
    """The 400's message for what the handler raised about the request (and a log line for the unexpected kinds)."""
    if isinstance(error, ValueError):
        return str(error) or f"the model's handler refused the request ({step})"
    if CLIENT_ERROR_LOG_LIMIT.admit() is not None:  # a bug in handler.py looks the same: leave a trace of it
        log.info("%s: Handler.%s raised %s; answered 400 (the request's fault, docs/handlers.md)",
                 _name(version), step, describe_failure(error))
    if isinstance(error, KeyError) and error.args:
        return f"the request has no field {error.args[0]!r} (the model's handler needs it)"
    return f"a field of the request has the wrong type: {error}"


def _model_inputs(version: ModelVersion, produced: Any) -> dict[str, Any]:
    """preprocess's result as named arrays; not a dict of the signature's input names: the handler's bug."""
    try:
        inputs = model_inputs(produced)
    except TypeError as exc:
        raise HandlerFailed(f"{_name(version)}: {exc}{_unchecked(version)}") from None
    except ValueError as exc:  # ragged lists: numpy cannot make one array of the client's rows
        raise InvalidArgument(f"the model's handler made an input that is not an array: {exc}") from None
    assert version.handler is not None
    expected = version.signature(version.handler.signature_name).inputs
    if set(inputs) != set(expected):
        raise HandlerFailed(
            f"{_name(version)}: Handler.preprocess returned inputs {sorted(inputs)}; signature "
            f"{version.handler.signature_name!r} takes {sorted(expected)}{_unchecked(version)}"
        )
    return inputs


def _encoded(version: ModelVersion, result: Any) -> orjson.Fragment:
    """postprocess's result as JSON, ready for the response; a value JSON cannot carry is the handler's bug."""
    try:
        return orjson.Fragment(jsonio.dumps(result))
    except jsonio.NotJSON as exc:
        raise HandlerFailed(f"{_name(version)}: Handler.postprocess's result: {exc}") from None


def _unchecked(version: ModelVersion) -> str:
    """A hint for a handler bug that its example would have caught before the version served."""
    assert version.handler is not None
    if version.handler.example is not None:
        return ""
    return " (the handler has no example, so publish and warm-up could not check this: add Handler.example)"


def _name(version: ModelVersion) -> str:
    return f"model {version.name} version {version.version}"
