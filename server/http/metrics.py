"""GET /metrics: every worker's metrics summed, from whichever worker answers."""

from __future__ import annotations

from flask import Blueprint, Response, current_app
from prometheus_client import CONTENT_TYPE_LATEST

from server.http.request import json_response
from server.telemetry.buffer import BUFFER
from server.telemetry.files import scrape

blueprint = Blueprint("metrics", __name__)


@blueprint.get("/metrics")
def metrics() -> Response:
    """Prometheus text exposition; a broken metrics directory is a 503 here and nowhere else."""
    directory = current_app.extensions["forkserve.settings"].metrics_dir
    BUFFER.flush()  # this worker's own updates; the others' are at most one flush interval old
    try:
        body = scrape(directory)
    except (OSError, ValueError) as exc:
        return json_response({"error": f"metrics unavailable: {exc}"}, status=503)
    return Response(body, content_type=CONTENT_TYPE_LATEST)
