"""Open Inference Protocol V2 (KServe / Triton) under /v2: health, metadata, readiness, infer.

Views take care of HTTP (paths, status codes, the binary-extension headers) and delegate the
tensor formats to server.protocols.v2.json_codec and the rest to the dataplane (server.dataplane).
"""

from __future__ import annotations

import time

from flask import Blueprint, Response, current_app, g, request

from server.dataplane import envelope
from server.dataplane.inference import predict
from server.dataplane.models import (
    v2_model_config,
    v2_model_metadata,
    v2_model_ready,
    v2_server_metadata,
)
from server.dataplane.requests import model_address
from server.dataplane import repository
from server.dataplane.statistics import v2_statistics
from server.errors import ApiError, InvalidArgument
from server.models.flow import run_blocking
from server.tensors import jsonio
from server.http.request import (
    check_content_type,
    flask_request_timeout,
    json_response,
    registry,
    request_body,
)
from server.models.registry import ModelVersion
from server.protocols.v2 import json_codec
from server.settings import Settings
from server.telemetry import measure
from server.telemetry.payloads import capture

blueprint = Blueprint("v2", __name__)
BINARY_CONTENT_TYPES = frozenset({"application/octet-stream", "application/vnd.kserve-v2-binary"})


def _served(name: str, version: str | None) -> ModelVersion:
    """The version a V2 path addresses (latest available when none)."""
    name, number = model_address(name, version)
    return registry().get(name).resolve(number)


@blueprint.get("/v2")
def server_metadata() -> Response:
    """Server name, version and protocol extensions."""
    return json_response(v2_server_metadata(["binary_tensor_data"]))


@blueprint.get("/v2/health/live")
def live() -> Response:
    """200 while the worker runs."""
    return json_response({"live": True})


@blueprint.get("/v2/health/ready")
def ready() -> Response:
    """200 when the worker is ready as /readyz says; 400 otherwise (the protocol's "false")."""
    is_ready, models = registry().readiness()
    return json_response({"ready": is_ready, "models": models}, status=200 if is_ready else 400)


@blueprint.get("/v2/models/<name>")
@blueprint.get("/v2/models/<name>/versions/<version>")
def model_metadata(name: str, version: str | None = None) -> Response:
    """Name, versions, platform and the serving_default signature's tensors (-1 for any size)."""
    served = _served(name, version)
    return json_response(v2_model_metadata(registry(), served), version=served)


@blueprint.get("/v2/models/<name>/config")
@blueprint.get("/v2/models/<name>/versions/<version>/config")
def model_configuration(name: str, version: str | None = None) -> Response:
    """Triton's model configuration extension: the served version's tensors, batching and version policy."""
    served = _served(name, version)
    return json_response(v2_model_config(served), version=served)


@blueprint.get("/v2/models/<name>/ready")
@blueprint.get("/v2/models/<name>/versions/<version>/ready")
def model_ready(name: str, version: str | None = None) -> Response:
    """200 when the version can answer, 400 when it cannot (a malformed version too, as the protocol's "false")."""
    try:
        name, number = model_address(name, version)
    except ApiError as exc:
        return json_response({"ready": False, "error": exc.message}, status=400)
    ready, served, why = v2_model_ready(registry(), name, number)
    if served is None:
        return json_response({"ready": False, "error": why}, status=400)
    return json_response({"ready": ready}, version=served)


@blueprint.get("/v2/models/stats")
@blueprint.get("/v2/models/<name>/stats")
@blueprint.get("/v2/models/<name>/versions/<version>/stats")
def model_statistics(name: str | None = None, version: str | None = None) -> Response:
    """Triton's statistics extension: every served version's counts and times, summed over the workers."""
    number = model_address(name, version)[1] if name else None
    return json_response(v2_statistics(registry(), name, number))


def _settings() -> Settings:
    return current_app.extensions["forkserve.settings"]


def _optional_json() -> dict:
    """A repository call's JSON object body; an empty body is {}."""
    raw = request_body()
    if not raw.strip():
        return {}
    body = jsonio.loads(raw)  # NOTE: any Content-Type: tritonclient sends none with these calls
    if not isinstance(body, dict):
        raise InvalidArgument("the body must be a JSON object")
    return body


@blueprint.post("/v2/repository/index")
def repository_index() -> Response:
    """Triton's model repository extension: every model of the repository with its state (`ready`: the served ones)."""
    ready = _optional_json().get("ready", False)
    return json_response(repository.repository_index(registry(), _settings(), ready is True, request.remote_addr or ""))


@blueprint.post("/v2/repository/models/<name>/load")
def repository_load(name: str) -> Response:
    """Explicit model control: serve `name` on every worker (with `parameters.config` over its settings)."""
    config = repository.load_config_parameter(_optional_json().get("parameters"))
    run_blocking(repository.change(_settings(), "load", name, config, request.remote_addr or ""))
    return _changed()


@blueprint.post("/v2/repository/models/<name>/unload")
def repository_unload(name: str) -> Response:
    """Explicit model control: take `name` out of every worker."""
    _optional_json()
    run_blocking(repository.change(_settings(), "unload", name, None, request.remote_addr or ""))
    return _changed()


def _changed() -> Response:
    """A load's or unload's answer; from a retiring worker it closes the connection, so the next request reaches the new set."""
    response = json_response({})
    if repository.STOPPED_ACCEPTING.is_set():
        response.headers["Connection"] = "close"  # NOTE: honoured by server.compat's gunicorn Response
    return response


@blueprint.post("/v2/models/<name>/infer")
@blueprint.post("/v2/models/<name>/versions/<version>/infer")
def model_infer(name: str, version: str | None = None) -> Response:
    """JSON or binary-extension tensors in, the same out."""
    envelope.begin(name if name in registry().models else measure.UNKNOWN_MODEL, "v2_infer", g.get("request_id", ""),
                   carrier=request.environ)
    served = _served(name, version)
    envelope.serving(served)
    check_content_type(also=BINARY_CONTENT_TYPES)
    started = time.perf_counter()
    header, binary = json_codec.split_body(request_body(), request.headers.get(json_codec.HEADER_LENGTH))
    if capture.ON:
        capture.request_body(measure.current(), header)  # NOTE: binary-extension tensor bytes are not logged
    decoded = json_codec.decode_infer(header, binary, served.signature, served.config.max_request_rows)
    if capture.ON:
        capture.tensors(measure.current(), decoded.inputs)
    signature, outputs = predict(served, decoded.signature_name, decoded.inputs, started, flask_request_timeout(served))
    started = time.perf_counter()
    body, header_length = json_codec.encode_infer(decoded, outputs, signature, name, served.version)
    measure.stage("encode", time.perf_counter() - started)
    if header_length is None:
        response = Response(body, mimetype="application/json")
    else:
        response = Response(body, mimetype="application/octet-stream")
        response.headers[json_codec.HEADER_LENGTH] = str(header_length)
    response.headers["X-Model-Version"] = str(served.version)
    return response
