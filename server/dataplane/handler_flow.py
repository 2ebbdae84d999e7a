"""Predict for a model version with a handler: preprocess, the shared predict flow, postprocess.

The TensorFlow call is not here: preprocess's arrays go through the same validation and the
same executor queue as a plain request (server.dataplane.inference.predict), so requests through a
handler are batched with each other. The flow runs on a thread of the version's own pool
(server.models.handler_pool) and the request thread waits for it with the request's deadline:
a handler that hangs costs its requests a 504 and holds each waiting request thread at most that
deadline; once the version's threads are all held past it, its requests are refused at once.

What a handler raises is sorted here (docs/handlers.md): the client's fault is a 400 with its
message, anything else (SystemExit and KeyboardInterrupt included) a 500 for this request only,
logged with the model, version and request id. The worker goes on.
"""

from __future__ import annotations

import contextvars
import logging
import time
from typing import Any, Callable

import orjson

from server.dataplane.inference import predict
from server.errors import DeadlineExceeded, InvalidArgument, Unavailable
from server.models.handler_pool import HandlerRaised, HandlerStuck, HandlerTimeout
from server.models.handlers import describe_failure, model_inputs
from server.models.registry import ModelVersion
from server.protocols.tfserving import json_codec
from server.telemetry import measure, metrics
from server.telemetry.lines import LineLimit
from server.tensors import jsonio

log = logging.getLogger("forkserve.handlers")

# What each step may raise for a request the client got wrong (400); anything else is the handler's bug (500).
# NOTE: preprocess reads the client's body: `body["x"]` on a missing field (KeyError) or a field of
# the wrong type (TypeError) is the request's fault, as a missing form field is in Flask. postprocess
# reads the model's outputs: a KeyError there is a wrong output name in handler.py.
CLIENT_ERRORS: dict[str, tuple[type[BaseException], ...]] = {
    "preprocess": (ValueError, KeyError, TypeError),
    "postprocess": (ValueError,),
}
CLIENT_ERROR_LOG_LIMIT = LineLimit(per_second=5)
MODEL_STEP = "the model"
# The request waits this much past its deadline for the flow: a model that is late answers its own
# 504 from the flow (server.dataplane.inference.infer), so it is counted once.
FLOW_GRACE_S = 0.05


class HandlerRefused(InvalidArgument):
    """The handler raised about the request (400): the message is the handler's own words."""

    quotes_user_code = True


class HandlerFailed(Exception):
    """The handler raised or returned what answers its request 500: a bug in handler.py (the cause is chained)."""


def predict_with_handler(served: ModelVersion, body: Any, timeout: float) -> Any:
    """The whole response body for `body`, as the version's handler shapes it (JSON, ready to send), within `timeout` seconds.

    NOTE: the whole flow (preprocess, the model's queue, postprocess, encoding) runs on one
    thread of the version's pool and this request thread waits once, with the deadline: two
    thread switches per request, the fewest another thread allows (the alternatives, one hand-off
    per handler method or a smaller pool, measured: bench/results/code-notes.md#handler-flow).
    """
    handler = served.handler
    assert handler is not None
    measure.label_errors_with_version()  # the access log names the version of a handler's 4xx / 5xx too
    deadline = time.monotonic() + timeout
    body = json_codec.request_object(body)
    flow = _Flow(served, body, deadline)
    context = contextvars.copy_context()  # NOTE: the stage times land in this request's measurement
    try:
        return handler.pool.call("a request's handler", context.run, (flow.run,), deadline - time.monotonic() + FLOW_GRACE_S)
    except HandlerRaised as raised:
        failure = raised.error  # what _Flow made of it: an ApiError or HandlerFailed (raised below: no chained context)
    except HandlerTimeout:
        if flow.step == MODEL_STEP:  # NOTE: the model's own wait counts its deadline (server.dataplane.inference.infer)
            raise DeadlineExceeded(f"{_name(served)} did not answer within {timeout:g}s") from None
        failure = _Overran()
    except HandlerStuck as stuck:
        metrics.record(lambda: metrics.REJECTED_REQUESTS.labels(served.name, "handler_stuck").inc())
        raise Unavailable(str(stuck)) from None
    if isinstance(failure, _Overran):  # the handler's time ran out (the model's own wait was never reached)
        metrics.record(lambda: metrics.REJECTED_REQUESTS.labels(served.name, "deadline").inc())
        raise DeadlineExceeded(
            f"{_name(served)}: its handler did not return from {flow.step} within the request's deadline ({timeout:g}s)"
        ) from None
    raise failure


class _Overran(Exception):
    """preprocess returned after the request's deadline: the model is not asked (the request thread counts the 504)."""


class _Flow:
    """One request's steps on a handler thread; `step` says where it is (for the 504's message)."""

    def __init__(self, served: ModelVersion, body: dict[str, Any], deadline: float) -> None:
        self.served = served
        self.body = body
        self.deadline = deadline
        self.step = "preprocess"

    def run(self) -> Any:
        """preprocess, predict, postprocess, encode: the response body, or an ApiError / HandlerFailed."""
        served, body, handler = self.served, self.body, self.served.handler
        assert handler is not None
        started = time.perf_counter()
        if handler.preprocess is not None:
            inputs = _model_inputs(served, self._call("preprocess", handler.preprocess, body))
            signature_name, row_format = handler.signature_name, True
            measure.stage("preprocess", time.perf_counter() - started)
            started = time.perf_counter()
        else:
            decoded = json_codec.decode_predict(body, served.signature, served.config)
            inputs, signature_name, row_format = decoded.inputs, decoded.signature_name, decoded.row_format
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise _Overran()
        self.step = MODEL_STEP
        _, outputs = predict(served, signature_name, inputs, started, remaining)
        if handler.postprocess is None:
            return json_codec.encode_predict(outputs, row_format)
        started = time.perf_counter()
        result = self._call("postprocess", handler.postprocess, outputs, body)
        measure.stage("postprocess", time.perf_counter() - started)
        self.step = "encoding postprocess's result"
        started = time.perf_counter()
        encoded = _encoded(served, result)
        measure.stage("encode", time.perf_counter() - started)
        return encoded

    def _call(self, step: str, method: Callable[..., Any], *args: Any) -> Any:
        """One handler method; what it raises sorted into the client's fault (400) or the handler's (500)."""
        self.step = step
        try:
            return method(*args)
        except CLIENT_ERRORS[step] as error:
            raise HandlerRefused(_client_message(self.served, step, error)) from None
        except BaseException as error:  # NOTE: SystemExit, KeyboardInterrupt too: a 500 for this request only
            raise HandlerFailed(f"{_name(self.served)}: Handler.{step} raised {describe_failure(error)}") from error


def _client_message(served: ModelVersion, step: str, error: BaseException) -> str:
    """The 400's message for what the handler raised about the request (and a log line for the unexpected kinds)."""
    if isinstance(error, ValueError):
        return str(error) or f"the model's handler refused the request ({step})"
    if CLIENT_ERROR_LOG_LIMIT.admit() is not None:  # a bug in handler.py looks the same: leave a trace of it
        log.info("%s: Handler.%s raised %s; answered 400 (the request's fault, docs/handlers.md)",
                 _name(served), step, describe_failure(error))
    if isinstance(error, KeyError) and error.args:
        return f"the request has no field {error.args[0]!r} (the model's handler needs it)"
    return f"a field of the request has the wrong type: {error}"


def _model_inputs(served: ModelVersion, produced: Any) -> dict[str, Any]:
    """preprocess's result as named arrays; not a dict of the signature's input names: the handler's bug."""
    try:
        inputs = model_inputs(produced)
    except TypeError as exc:
        raise HandlerFailed(f"{_name(served)}: {exc}{_unchecked(served)}") from None
    except ValueError as exc:  # ragged lists: numpy cannot make one array of the client's rows
        raise InvalidArgument(f"the model's handler made an input that is not an array: {exc}") from None
    assert served.handler is not None
    expected = served.signature(served.handler.signature_name).inputs
    if set(inputs) != set(expected):
        raise HandlerFailed(
            f"{_name(served)}: Handler.preprocess returned inputs {sorted(inputs)}; signature "
            f"{served.handler.signature_name!r} takes {sorted(expected)}{_unchecked(served)}"
        )
    return inputs


def _encoded(served: ModelVersion, result: Any) -> orjson.Fragment:
    """postprocess's result as JSON, ready for the response; a value JSON cannot carry is the handler's bug."""
    try:
        return orjson.Fragment(jsonio.dumps(result))
    except jsonio.NotJSON as exc:
        raise HandlerFailed(f"{_name(served)}: Handler.postprocess's result: {exc}") from None


def _unchecked(served: ModelVersion) -> str:
    """A hint for a handler bug that its example would have caught before the version served."""
    assert served.handler is not None
    if served.handler.example is not None:
        return ""
    return " (the handler has no example, so publish and warm-up could not check this: add Handler.example)"


def _name(served: ModelVersion) -> str:
    return f"model {served.name} version {served.version}"
