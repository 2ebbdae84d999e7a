"""Open Inference Protocol V2 (KServe / Triton) under /v2: health, metadata, readiness, infer.

Views take care of HTTP (paths, status codes, the binary-extension headers) and delegate the
tensor formats to server.http.codecs.v2 and inference to the model's executor.
"""

from __future__ import annotations

import time

from flask import Blueprint, Response, g, request

from server.errors import ApiError
from server.http import instrument
from server.http.codecs import v2
from server.http.common import (
    check_content_type,
    flask_request_timeout,
    json_response,
    model_address,
    predict,
    registry,
    request_body,
)
from server.telemetry.payloads import capture
from server.worker.registry import AVAILABLE, ModelVersion

blueprint = Blueprint("v2", __name__)
SERVER_VERSION = "0.1.0"
BINARY_CONTENT_TYPES = frozenset({"application/octet-stream", "application/vnd.kserve-v2-binary"})


def _target(name: str, version: str | None) -> ModelVersion:
    """The version a V2 path addresses (latest available when none)."""
    name, number = model_address(name, version)
    return registry().get(name).resolve(number)


@blueprint.get("/v2")
def server_metadata() -> Response:
    """Server name, version and protocol extensions."""
    return json_response({"name": "forkserve", "version": SERVER_VERSION, "extensions": ["binary_tensor_data"]})


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
    target = _target(name, version)
    signature = target.signature("serving_default") if "serving_default" in target.servable.signatures else next(
        iter(target.servable.signatures.values())
    )
    model = registry().get(name)
    return json_response(
        {
            "name": name,
            "versions": [str(v.version) for v in model.available()],
            "platform": target.servable.platform,
            "inputs": [v2.tensor_metadata(t) for t in signature.inputs.values()],
            "outputs": [v2.tensor_metadata(t) for t in signature.outputs.values()],
        },
        version=target,
    )


@blueprint.get("/v2/models/<name>/ready")
@blueprint.get("/v2/models/<name>/versions/<version>/ready")
def model_ready(name: str, version: str | None = None) -> Response:
    """200 when the version can answer, 400 when it cannot."""
    try:
        target = _target(name, version)
    except ApiError as exc:
        if exc.status == 404:
            raise
        return json_response({"ready": False, "error": exc.message}, status=400)
    return json_response({"ready": target.state == AVAILABLE}, version=target)


@blueprint.post("/v2/models/<name>/infer")
@blueprint.post("/v2/models/<name>/versions/<version>/infer")
def model_infer(name: str, version: str | None = None) -> Response:
    """JSON or binary-extension tensors in, the same out."""
    instrument.begin(name if name in registry().models else instrument.UNKNOWN_MODEL, "v2_infer", g.get("request_id", ""))
    target = _target(name, version)
    instrument.set_version(target.version)
    if capture.ON:
        capture.sample(instrument.current(), target)
    check_content_type(also=BINARY_CONTENT_TYPES)
    started = time.perf_counter()
    header, binary = v2.split_body(request_body(), request.headers.get(v2.HEADER_LENGTH))
    if capture.ON:
        capture.request_body(instrument.current(), header)  # NOTE: binary-extension tensor bytes are not logged
    decoded = v2.decode_infer(header, binary, target.signature, target.config.max_request_rows)
    if capture.ON:
        capture.tensors(instrument.current(), decoded.inputs)
    signature, outputs = predict(target, decoded.signature_name, decoded.inputs, started, flask_request_timeout(target))
    started = time.perf_counter()
    body, header_length = v2.encode_infer(decoded, outputs, signature, name, target.version)
    instrument.stage("encode", time.perf_counter() - started)
    if header_length is None:
        response = Response(body, mimetype="application/json")
    else:
        response = Response(body, mimetype="application/octet-stream")
        response.headers[v2.HEADER_LENGTH] = str(header_length)
    response.headers["X-Model-Version"] = str(target.version)
    return response
