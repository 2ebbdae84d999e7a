"""TensorFlow Serving's REST API under /v1/models: status, metadata, predict, classify, regress.

Views take care of the HTTP-specific things (path, method, status code) and delegate the
formats to server.http.codecs and the inference to the model's executor.
"""

from __future__ import annotations

import re
import time
from typing import Any

from flask import Blueprint, Response, g, request

from server.errors import ApiError, InvalidArgument, NotFound
from server.http import instrument
from server.http.codecs import tfserving
from server.http.common import (
    flask_request_timeout,
    infer,
    json_response,
    model_address,
    read_json,
    registry,
    tfserving_predict,
)
from server.http.handled import predict_with_handler
from server.telemetry.payloads import capture
from server.worker.registry import ModelVersion

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
        instrument.begin(instrument.UNKNOWN_MODEL, f"tfserving_{_verb_of(rest)}", g.get("request_id", ""))
    name, version, label, action = _parse_path(rest)
    wants_post = action in VERBS
    if (request.method == "POST") != wants_post:
        raise ApiError(f"{request.method} is not allowed for {action}; use {'POST' if wants_post else 'GET'}", status=405)
    if wants_post and name in registry().models:
        instrument.set_model(name)
    model = registry().get(name)
    if action == "status":
        statuses = registry().statuses(name)
        if label is not None:
            version = model.resolve(version, label).version
        if version is not None:
            statuses = [s for s in statuses if s["version"] == str(version)]
            if not statuses:
                raise NotFound(f"Servable not found for request: Specific({name}, {version})")
        if not statuses:
            raise NotFound(f"Servable not found for request: Latest({name})")
        return json_response({"model_version_status": statuses})
    target = model.resolve(version, label)
    if action == "metadata":
        return json_response(_metadata(target), version=target)
    instrument.set_version(target.version)
    if capture.ON:
        capture.sample(instrument.current(), target)
    body = read_json()
    if action == "predict" and target.handler is not None:
        if capture.ON:
            capture.handler_body(instrument.current(), body)
        return json_response(predict_with_handler(target, body), version=target)
    if capture.ON:
        capture.request_body(instrument.current(), body)
    if action == "predict":
        return json_response(tfserving_predict(target, body, flask_request_timeout(target)), version=target)
    return json_response(_classify_or_regress(target, body, action), version=target)


def _metadata(target: ModelVersion) -> dict[str, Any]:
    """GetModelMetadata's JSON: the model spec and every signature def (and the handler, when there is one)."""
    signatures = {k: v.tfserving_metadata() for k, v in sorted(target.servable.signatures.items())}
    metadata: dict[str, Any] = {"signature_def": {"signature_def": signatures}}
    if target.handler is not None:
        metadata["handler"] = target.handler.describe()
    return {
        "model_spec": {"name": target.name, "signature_name": "", "version": str(target.version)},
        "metadata": metadata,
    }


def _classify_or_regress(target: ModelVersion, body: Any, method: str) -> dict[str, Any]:
    """tf.Example requests for signatures whose method is classify or regress."""
    started = time.perf_counter()
    signature_name, serialized = tfserving.decode_examples(body, target.config.max_request_rows)
    signature = target.signature(signature_name)
    if signature.method != method:
        raise InvalidArgument(
            f"signature {signature_name!r} is a {signature.method} signature, not {method}; "
            f"use :{signature.method} or pick another signature_name"
        )
    if list(signature.inputs) != ["inputs"] or signature.inputs["inputs"].dtype != "string":
        raise InvalidArgument(f"signature {signature_name!r} does not take serialized tf.Examples")
    rows = len(serialized)
    if capture.ON:
        capture.tensors(instrument.current(), {"inputs": serialized})
    instrument.stage("decode", time.perf_counter() - started)
    outputs = infer(target, signature.name, {"inputs": serialized}, rows, signature.batchable, flask_request_timeout(target))
    if method == "classify":
        return tfserving.encode_classify(outputs, rows)
    return tfserving.encode_regress(outputs, rows)
