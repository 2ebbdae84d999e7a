"""The request thread's part of a model version with a handler: preprocess, the shared predict flow, postprocess.

The TensorFlow call is not here: preprocess's arrays go through the same validation and the
same executor queue as a plain request (server.http.common.predict), so requests through a
handler are batched with each other. `ValueError` from the handler is the client's fault (400
with its message); any other exception reaches the app's error handler (500 with the request
id, the traceback logged once) and the worker goes on.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from server.errors import InvalidArgument
from server.http import instrument
from server.http.codecs import tfserving
from server.http.common import flask_request_timeout, predict
from server.worker.handlers import model_inputs
from server.worker.registry import ModelVersion


def predict_with_handler(version: ModelVersion, body: Any) -> Any:
    """The whole response body for `body`, as the version's handler shapes it."""
    handler = version.handler
    assert handler is not None
    body = tfserving.request_object(body)
    started = time.perf_counter()
    if handler.preprocess is not None:
        inputs = model_inputs(_client_errors("preprocess", handler.preprocess, body))
        signature_name, row_format = handler.signature_name, True
        instrument.stage("preprocess", time.perf_counter() - started)
        started = time.perf_counter()
    else:
        decoded = tfserving.decode_predict(body, version.signature, version.config)
        inputs, signature_name, row_format = decoded.inputs, decoded.signature_name, decoded.row_format
    _, outputs = predict(version, signature_name, inputs, started, flask_request_timeout(version))
    if handler.postprocess is None:
        return tfserving.encode_predict(outputs, row_format)
    started = time.perf_counter()
    result = _client_errors("postprocess", handler.postprocess, outputs, body)
    instrument.stage("postprocess", time.perf_counter() - started)
    return result


def _client_errors(step: str, method: Callable[..., Any], *args: Any) -> Any:
    """Call a handler method; its ValueError becomes a 400 carrying its message."""
    try:
        return method(*args)
    except ValueError as exc:
        raise InvalidArgument(str(exc) or f"the model's handler refused the request ({step})") from None
