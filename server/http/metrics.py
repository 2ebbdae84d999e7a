"""GET /metrics, and TF Serving's metrics path when set: every worker's metrics summed, from whichever worker answers."""

from __future__ import annotations

from flask import Blueprint, Flask, Response, current_app
from prometheus_client import CONTENT_TYPE_LATEST

from server.http.request import json_response
from server.telemetry import tfserving
from server.telemetry.buffer import BUFFER
from server.telemetry.files import collect, exposition

blueprint = Blueprint("metrics", __name__)


@blueprint.get("/metrics")
def metrics() -> Response:
    """Prometheus text exposition of forkserve's families; a broken metrics directory is a 503 here and nowhere else."""
    return _scrape(tfserving_too=False)


def tfserving_metrics() -> Response:
    """FORKSERVE_TFSERVING_METRICS_PATH: forkserve's families and TF Serving's, for its dashboards and alerts."""
    return _scrape(tfserving_too=True)


def add_tfserving_path(app: Flask, path: str) -> None:
    """Answer TF Serving's metrics path (its monitoring config's prometheus_config path) on this app."""
    app.add_url_rule(path, "tfserving_metrics", tfserving_metrics, methods=["GET"])


def _scrape(tfserving_too: bool) -> Response:
    """One scrape of the multiprocess directory, written as asked."""
    directory = current_app.extensions["forkserve.settings"].metrics_dir
    BUFFER.flush()  # this worker's own updates; the others' are at most one flush interval old
    try:
        merged = collect(directory)
    except (OSError, ValueError) as exc:
        return json_response({"error": f"metrics unavailable: {exc}"}, status=503)
    body = exposition(tfserving.forkserve_families(merged))
    if tfserving_too:
        body += tfserving.exposition(merged)
    return Response(body, content_type=CONTENT_TYPE_LATEST)
