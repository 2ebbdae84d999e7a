"""TensorFlow Serving's predict answered before Flask: the hot path, with the same answers, headers and metrics.

Runs in workers, in front of the Flask app (create_app installs it; FORKSERVE_FAST_PREDICT=0 turns
it off). Flask's request machinery (request context, routing, hooks, Response objects) costs most
of an MLP predict's Python work (measured: bench/results/code-notes.md#fast-path). This
answers `POST /v1/models/NAME[/versions/N]:predict` itself when nothing unusual is asked: a served
model without a handler, a JSON body with a Content-Length within the limit. Anything else
(another route, a label, a handler, a chunked or oversized body, a version that cannot answer)
goes to Flask untouched, before a byte of the body is read, so every error keeps one wording.
The work and the envelope are the dataplane's, as for the Flask view (server.dataplane).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from werkzeug.http import HTTP_STATUS_CODES

from server.dataplane import envelope
from server.dataplane.answers import api_error_answer, unexpected_error_answer
from server.dataplane.inference import tfserving_predict
from server.dataplane.requests import request_id_for, request_timeout
from server.errors import ApiError
from server.http.request import encode_json, is_json_type, limit_client_silence
from server.models.registry import ModelRegistry, ModelVersion
from server.settings import Settings
from server.telemetry import measure
from server.telemetry.payloads import capture
from server.tensors import jsonio

# NOTE: used with fullmatch: re.match with a final `$` also accepts a trailing "\n" (":predict%0A"), which Flask refuses.
PREDICT_PATH_RE = re.compile(r"/v1/models/([^/:]+)(?:/versions/([1-9][0-9]{0,17}))?:predict")
API = "tfserving_predict"
REASONS = {code: f"{code} {phrase.upper()}" for code, phrase in HTTP_STATUS_CODES.items()}  # werkzeug's status lines

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class FastPredict:
    """WSGI middleware: plain predicts answered here, every other request passed to `app`."""

    def __init__(self, app: WSGIApp, registry: ModelRegistry, settings: Settings) -> None:
        self.app = app
        self.registry = registry
        self.max_body_bytes = settings.max_body_bytes
        self.client_timeout = settings.client_timeout

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        try:
            served = self._served(environ)
        except Exception:  # NOTE: a surprise here must not become gunicorn's HTML 500: Flask answers instead
            served = None
        if served is None:
            return self.app(environ, start_response)
        return self._answer(served, environ, start_response)

    def _served(self, environ: dict[str, Any]) -> ModelVersion | None:
        """The version this request can be answered with here, or None: Flask answers it."""
        if environ.get("REQUEST_METHOD") != "POST" or "HTTP_TRANSFER_ENCODING" in environ:
            return None
        match = PREDICT_PATH_RE.fullmatch(environ.get("PATH_INFO", ""))
        if match is None:
            return None
        model = self.registry.models.get(match[1])
        length = environ.get("CONTENT_LENGTH", "")
        if model is None or not length.isdigit() or int(length) > self.max_body_bytes:
            return None
        if not is_json_type(environ.get("CONTENT_TYPE", "").split(";", 1)[0].strip().lower()):
            return None
        try:
            served = model.resolve(int(match[2]) if match[2] else None)
        except ApiError:
            return None
        return served if served.handler is None else None

    def _answer(self, served: ModelVersion, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        """Read, run and answer one predict; measured like the Flask view's (server.telemetry.measure)."""
        request_id = request_id_for(environ.get("HTTP_X_REQUEST_ID", ""))
        envelope.begin(served.name, API, request_id, carrier=environ)
        envelope.serving(served)
        headers = [("Content-Type", "application/json")]
        inference = measure.current()
        if inference is not None and inference.trace_id:
            headers.append(("X-Trace-Id", inference.trace_id))
        try:
            try:
                data = jsonio.loads(self._body(environ))
                if capture.ON:
                    capture.request_body(measure.current(), data)
                payload = tfserving_predict(served, data, request_timeout(served, environ.get("HTTP_X_REQUEST_TIMEOUT")))
                body, status = encode_json(payload, timed=True), 200
                headers.append(("X-Model-Version", str(served.version)))
            except ApiError as exc:
                status, error, extra = api_error_answer(exc, request_id)
                body = encode_json(error, timed=False)
                headers.extend(extra.items())
            except Exception:
                status, error = unexpected_error_answer(request_id)
                body = encode_json(error, timed=False)
            envelope.finish(status, body, True)
        finally:
            envelope.release()
        headers += [("Content-Length", str(len(body))), ("X-Request-Id", request_id)]
        start_response(REASONS.get(status, f"{status} Error"), headers)
        return [body]

    def _body(self, environ: dict[str, Any]) -> bytes:
        """The whole body (its length was checked against the limit); 408 when the client stops sending."""
        limit_client_silence(environ, self.client_timeout)
        length = int(environ["CONTENT_LENGTH"])
        try:
            data = environ["wsgi.input"].read(length)
        except OSError:  # the receive timeout limit_client_silence set, or a reset
            data = b""
        if len(data) < length:
            raise ApiError("the client stopped sending the request body", status=408)
        return data
