"""create_app(): the Flask application of one worker (models are loaded by the worker hook)."""

from __future__ import annotations

import logging

from flask import Flask, Response, g, request
from werkzeug.exceptions import HTTPException

from server.config import ServerConfig, load_config
from server.dataplane import envelope
from server.dataplane.answers import api_error_answer, unexpected_error_answer
from server.dataplane.requests import request_id_for
from server.errors import ApiError
from server.http import health, metrics, openapi, tfserving, v2
from server.http.fast_predict import FastPredict
from server.http.request import json_response
from server.models.registry import ModelRegistry
from server.settings import Settings
from server.telemetry import measure

log = logging.getLogger("forkserve.app")


def create_app(settings: Settings | None = None, config: ServerConfig | None = None) -> Flask:
    """Build the app with an empty model registry; `registry.load_all()` fills it.

    Under gunicorn the models and their configuration come from the master's target
    (server.target); `config` (or conf/models.toml, read at load time) only serves an app run
    without a master. Never raises on a bad configuration: a worker boot error halts gunicorn.
    """
    settings = settings or Settings.current()
    app = Flask("forkserve")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.extensions["forkserve"] = ModelRegistry(
        settings.models_dir, settings.run_dir, config if config is not None else (lambda: load_config(settings.conf_path)),
        strict_readiness=settings.strict_readiness,
    )
    app.extensions["forkserve.settings"] = settings
    app.register_blueprint(health.blueprint)
    app.register_blueprint(tfserving.blueprint)
    app.register_blueprint(metrics.blueprint)
    app.register_blueprint(v2.blueprint)
    app.register_blueprint(openapi.blueprint)
    if settings.tfserving_metrics_path:
        metrics.add_tfserving_path(app, settings.tfserving_metrics_path)
    app.before_request(_assign_request_id)
    app.after_request(_echo_request_id)
    app.after_request(_finish)
    app.teardown_request(envelope.release)
    app.register_error_handler(ApiError, _api_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected_error)
    if settings.fast_predict:
        app.wsgi_app = FastPredict(app.wsgi_app, app.extensions["forkserve"], settings)  # type: ignore[method-assign]
    return app


def _assign_request_id() -> None:
    """Use the caller's X-Request-Id when it is sane, else make one."""
    g.request_id = request_id_for(request.headers.get("X-Request-Id", ""))


def _echo_request_id(response: Response) -> Response:
    """Every response carries the request id."""
    response.headers["X-Request-Id"] = g.get("request_id", "")
    return response


def _finish(response: Response) -> Response:
    """An inference request's answer (server.dataplane.envelope): its headers, then counted, timed and payload-logged."""
    inference = measure.current()
    if inference is not None:
        if inference.version_on_errors and inference.version:
            response.headers.setdefault("X-Model-Version", inference.version)
        if inference.trace_id:
            response.headers["X-Trace-Id"] = inference.trace_id
        body = None if response.is_streamed or inference.payload is None else response.get_data()
        envelope.finish(response.status_code, body, response.mimetype == "application/json")
    return response


def _api_error(exc: ApiError) -> Response:
    """A known failure: TF Serving's `{"error": ...}` with its status."""
    status, payload, headers = api_error_answer(exc, g.get("request_id", ""))
    response = json_response(payload, status=status)
    response.headers.update(headers)
    return response


def _http_error(exc: HTTPException) -> Response:
    """Routing and protocol errors (404, 405, 413, ...) as JSON, never HTML."""
    return json_response({"error": exc.description or exc.name}, status=exc.code or 500)


def _unexpected_error(exc: Exception) -> Response:
    """A bug: log the traceback once with the request id, tell the client only the id."""
    status, payload = unexpected_error_answer(g.get("request_id", ""))
    return json_response(payload, status=status)
