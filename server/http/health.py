"""Liveness and readiness of this worker."""

from __future__ import annotations

from flask import Blueprint, Response

from server.http.request import json_response, registry

blueprint = Blueprint("health", __name__)


@blueprint.get("/healthz")
def healthz() -> Response:
    """Liveness: the worker answers HTTP."""
    return json_response({"status": "alive"})


@blueprint.get("/readyz")
def readyz() -> Response:
    """Readiness: 200 once loading is over and some model serves (strict: every model); each model's state and failures in the body."""
    ready, models = registry().readiness()
    body = {"status": "ready" if ready else "not ready", "models": models}
    if registry().listener_problem:
        body["grpc"] = registry().listener_problem
    return json_response(body, status=200 if ready else 503)
