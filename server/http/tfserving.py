"""TensorFlow Serving's REST API under /v1/models: status, metadata, predict, classify, regress.

Views take care of the HTTP-specific things (path, method, status code, JSON bodies) and call the
dataplane (server.dataplane) for the rest.
"""

from __future__ import annotations

import re
import time
from typing import Any

from flask import Blueprint, Response, g, request
from google.protobuf import json_format

from server.dataplane import envelope
from server.dataplane.handler_flow import predict_with_handler
from server.dataplane.inference import examples, tfserving_predict
from server.dataplane.models import tfserving_statuses, tfserving_version
from server.dataplane.requests import model_address
from server.errors import ApiError, NotFound
from server.http.request import (
    flask_request_timeout,
    json_response,
    read_json,
    registry,
)
from server.models.registry import ModelVersion
from server.protocols.tfserving import json_codec, messages, proto_codec
from server.telemetry import measure
from server.telemetry.payloads import capture

blueprint = Blueprint("tfserving", __name__)

PATH_RE = re.compile(  # NOTE: used with fullmatch (a final `$` with re.match accepts a trailing "\n")
    r"(?P<name>[^/:]+)"
    r"(?:/versions/(?P<version>[^/:]+)|/labels/(?P<label>[^/:]+))?"
    r"(?:(?P<metadata>/metadata)|:(?P<verb>[A-Za-z]+))?/?"
)
VERBS = ("predict", "classify", "regress")


def _verb_of(rest: str) -> str:
    """The API label of a POST path, even a malformed one: predict, classify, regress or other."""
    verb = rest.rsplit(":", 1)[-1].lower() if ":" in rest else ""
    return verb if verb in VERBS else "other"


def _parse_path(rest: str) -> tuple[str, int | None, str | None, str]:
    """`name[/versions/N|/labels/L][/metadata|:verb]` -> (name, version, label, action)."""
    match = PATH_RE.fullmatch(rest)
    if not match:
        raise NotFound(f"malformed request path /v1/models/{rest}")
    name, version = model_address(match["name"], match["version"])
    action = "metadata" if match["metadata"] else (match["verb"] or "status").lower()
    if action not in ("status", "metadata") + VERBS:
        raise NotFound(f"unknown method :{match['verb']}; expected one of {', '.join(VERBS)}")
    return name, version, match["label"], action


@blueprint.route("/v1/models/<path:rest>", methods=["GET", "POST"])
def models(rest: str) -> Response:
    """Dispatch on the path's shape: GET for status and metadata, POST for the verbs."""
    if request.method == "POST":  # counted even when the path is refused below
        envelope.begin(measure.UNKNOWN_MODEL, f"tfserving_{_verb_of(rest)}", g.get("request_id", ""), carrier=request.environ)
    name, version, label, action = _parse_path(rest)
    wants_post = action in VERBS
    if (request.method == "POST") != wants_post:
        raise ApiError(f"{request.method} is not allowed for {action}; use {'POST' if wants_post else 'GET'}", status=405)
    if wants_post and name in registry().models:
        measure.set_model(name)
    if action == "status":
        return json_response({"model_version_status": tfserving_statuses(registry(), name, version, label)})
    served = tfserving_version(registry().get(name), version, label)
    if action == "metadata":
        return json_response(_metadata(served), version=served)
    envelope.serving(served)
    body = read_json()
    if action == "predict" and served.handler is not None:
        if capture.ON:
            capture.handler_body(measure.current(), body)
        return json_response(predict_with_handler(served, body, flask_request_timeout(served)), version=served)
    if capture.ON:
        capture.request_body(measure.current(), body)
    if action == "predict":
        return json_response(tfserving_predict(served, body, flask_request_timeout(served)), version=served)
    return json_response(_classify_or_regress(served, body, action), version=served)


def _metadata(served: ModelVersion) -> dict[str, Any]:
    """GetModelMetadata's JSON: the model spec and every signature def (and the handler, when there is one)."""
    signature_map = messages.apis().get_model_metadata_pb2.SignatureDefMap()
    proto_codec.signature_def_map(served.servable.signature_defs, signature_map)
    # TF Serving's ToJsonString options: field names as in the .proto, fields without presence printed when empty
    signatures = json_format.MessageToDict(signature_map, preserving_proto_field_name=True,
                                           always_print_fields_with_no_presence=True)
    metadata: dict[str, Any] = {"signature_def": signatures}
    if served.handler is not None:
        metadata["handler"] = served.handler.describe()
    return {
        "model_spec": {"name": served.name, "signature_name": "", "version": str(served.version)},
        "metadata": metadata,
    }


def _classify_or_regress(served: ModelVersion, body: Any, method: str) -> dict[str, Any]:
    """tf.Example requests for a signature that takes them (TF Serving's rule: its tensors' keys, not its method_name)."""
    started = time.perf_counter()
    signature_name, serialized = json_codec.decode_examples(body, served.config.max_request_rows)
    _, outputs = examples(served, signature_name, serialized, method, started, flask_request_timeout(served))
    if method == "classify":
        return json_codec.encode_classify(outputs, len(serialized))
    return json_codec.encode_regress(outputs, len(serialized))
