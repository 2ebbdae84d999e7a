"""GET /openapi.json: an OpenAPI 3 description of every endpoint (tested with schemathesis)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response

from server.http.request import json_response, registry

blueprint = Blueprint("openapi", __name__)

JSON = "application/json"
ERROR = {"$ref": "#/components/schemas/Error"}
ANY_JSON = {}  # any JSON value


def _content(schema: dict[str, Any]) -> dict[str, Any]:
    return {JSON: {"schema": schema}}


def _responses(ok: dict[str, Any], *errors: int, ok_status: str = "200") -> dict[str, Any]:
    """A 200 with `ok` and each error status with the {"error": ...} body."""
    responses = {ok_status: {"description": "OK", "content": _content(ok)}}
    for status in errors:
        responses[str(status)] = {"description": "error", "content": _content(ERROR)}
    return responses


NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}, "description": "model name"}
VERSION = {"name": "version", "in": "path", "required": True, "schema": {"type": "string"}, "description": "version number"}
LABEL = {"name": "label", "in": "path", "required": True, "schema": {"type": "string"}, "description": "version label"}
REQUEST_ID = {"name": "X-Request-Id", "in": "header", "required": False, "schema": {"type": "string"}}
LOOKUP_ERRORS = (400, 404, 405, 503)
INFER_ERRORS = (400, 404, 405, 413, 415, 503, 504)

SCHEMAS: dict[str, Any] = {
    "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
    "ModelVersionStatus": {
        "type": "object",
        "required": ["model_version_status"],
        "properties": {
            "model_version_status": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["version", "state", "status"],
                    "properties": {
                        "version": {"type": "string"},
                        "state": {"type": "string", "enum": ["UNKNOWN", "START", "LOADING", "AVAILABLE", "UNLOADING", "END"]},
                        "status": {
                            "type": "object",
                            "properties": {"error_code": {"type": "string"}, "error_message": {"type": "string"}},
                        },
                    },
                },
            }
        },
    },
    "ModelMetadata": {
        "type": "object",
        "required": ["model_spec", "metadata"],
        "properties": {"model_spec": {"type": "object"}, "metadata": {"type": "object"}},
    },
    "PredictRequest": {
        "type": "object",
        "properties": {"signature_name": {"type": "string"}, "instances": {"type": "array"}, "inputs": ANY_JSON},
    },
    "PredictResponse": {"type": "object", "properties": {"predictions": ANY_JSON, "outputs": ANY_JSON}},
    "ExamplesRequest": {
        "type": "object",
        "properties": {"signature_name": {"type": "string"}, "context": {"type": "object"}, "examples": {"type": "array", "items": {"type": "object"}}},
    },
    "ResultsResponse": {"type": "object", "required": ["results"], "properties": {"results": {"type": "array"}}},
    "Health": {"type": "object", "properties": {"status": {"type": "string"}, "models": {"type": "object"}}},
    "V2Tensor": {
        "type": "object",
        "required": ["name", "shape", "datatype"],
        "properties": {
            "name": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer"}},
            "datatype": {"type": "string"},
            "parameters": {"type": "object"},
            "data": ANY_JSON,
        },
    },
    "V2InferRequest": {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "id": {"type": "string"},
            "parameters": {"type": "object"},
            "inputs": {"type": "array", "items": {"$ref": "#/components/schemas/V2Tensor"}},
            "outputs": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}, "parameters": {"type": "object"}}}},
        },
    },
    "V2InferResponse": {
        "type": "object",
        "required": ["model_name", "outputs"],
        "properties": {
            "model_name": {"type": "string"},
            "model_version": {"type": "string"},
            "id": {"type": "string"},
            "outputs": {"type": "array", "items": {"$ref": "#/components/schemas/V2Tensor"}},
        },
    },
    "V2ModelMetadata": {
        "type": "object",
        "required": ["name", "versions", "platform", "inputs", "outputs"],
        "properties": {
            "name": {"type": "string"},
            "versions": {"type": "array", "items": {"type": "string"}},
            "platform": {"type": "string"},
            "inputs": {"type": "array", "items": {"$ref": "#/components/schemas/V2Tensor"}},
            "outputs": {"type": "array", "items": {"$ref": "#/components/schemas/V2Tensor"}},
        },
    },
    "V2Ready": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
    "V2RepositoryEntry": {"type": "object", "required": ["name", "version", "state", "reason"], "properties": {
        "name": {"type": "string"}, "version": {"type": "string"}, "state": {"type": "string"}, "reason": {"type": "string"}}},
    "V2Statistics": {"type": "object", "required": ["model_stats"], "properties": {"model_stats": {"type": "array", "items": {
        "type": "object", "required": ["name", "version", "inference_count", "execution_count", "inference_stats"]}}}},
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _tfserving_paths() -> dict[str, Any]:
    """/v1/models/...: status, metadata, predict, classify, regress, for latest, versions and labels."""
    paths: dict[str, Any] = {}
    addressing = {"": [NAME], "/versions/{version}": [NAME, VERSION], "/labels/{label}": [NAME, LABEL]}
    for suffix, parameters in addressing.items():
        base = "/v1/models/{name}" + suffix
        paths[base] = {"get": {"summary": "Model version status", "parameters": parameters + [REQUEST_ID],
                               "responses": _responses(_ref("ModelVersionStatus"), *LOOKUP_ERRORS)}}
        paths[base + "/metadata"] = {"get": {"summary": "Signature defs", "parameters": parameters,
                                             "responses": _responses(_ref("ModelMetadata"), *LOOKUP_ERRORS)}}
        paths[base + ":predict"] = {"post": {
            "summary": "Predict (row or columnar)", "parameters": parameters + [REQUEST_ID],
            "requestBody": {"required": True, "content": _content(_ref("PredictRequest"))},
            "responses": _responses(_ref("PredictResponse"), *INFER_ERRORS)}}
        for verb in ("classify", "regress"):
            paths[f"{base}:{verb}"] = {"post": {
                "summary": f"{verb.capitalize()} tf.Examples", "parameters": parameters,
                "requestBody": {"required": True, "content": _content(_ref("ExamplesRequest"))},
                "responses": _responses(_ref("ResultsResponse"), *INFER_ERRORS)}}
    return paths


def _v2_paths() -> dict[str, Any]:
    """/v2: server metadata, health, model metadata, readiness, infer."""
    paths: dict[str, Any] = {
        "/v2": {"get": {"summary": "Server metadata", "responses": _responses(
            {"type": "object", "required": ["name", "version", "extensions"]})}},
        "/v2/health/live": {"get": {"summary": "Liveness", "responses": _responses(_ref("V2Ready"))}},
        "/v2/health/ready": {"get": {"summary": "Readiness (400 when not ready)", "responses": {
            "200": {"description": "ready", "content": _content(_ref("V2Ready"))},
            "400": {"description": "not ready", "content": _content(_ref("V2Ready"))}}}},
    }
    admin = (400, 403, 413, 503, 504)
    paths["/v2/repository/index"] = {"post": {
        "summary": "Every model of the repository with its state (Triton's repository extension; admin)",
        "requestBody": {"required": False, "content": _content(
            {"type": "object", "properties": {"ready": {"type": "boolean"}}})},
        "responses": _responses({"type": "array", "items": _ref("V2RepositoryEntry")}, 400, 403, 413)}}
    for action, body in (("load", {"type": "object", "properties": {"parameters": {"type": "object", "properties": {
            "config": {"type": "string", "description": "a JSON ModelConfig: max_batch_size, dynamic_batching, "
                                                       "version_policy"}}}}}),
                         ("unload", {"type": "object"})):
        paths["/v2/repository/models/{name}/" + action] = {"post": {
            "summary": f"Explicit model control: {action} on every worker (FORKSERVE_MODEL_CONTROL=explicit; admin)",
            "parameters": [NAME], "requestBody": {"required": False, "content": _content(body)},
            "responses": _responses({"type": "object"}, *admin)}}
    paths["/v2/models/stats"] = {"get": {"summary": "Every served model version's statistics (Triton's extension)",
                                         "responses": _responses(_ref("V2Statistics"), 503)}}
    for suffix, parameters in {"": [NAME], "/versions/{version}": [NAME, VERSION]}.items():
        base = "/v2/models/{name}" + suffix
        paths[base] = {"get": {"summary": "Model metadata", "parameters": parameters,
                               "responses": _responses(_ref("V2ModelMetadata"), *LOOKUP_ERRORS)}}
        ready = _responses(_ref("V2Ready"), 404, 405)
        ready["400"] = {"description": "not ready", "content": _content({"type": "object"})}
        paths[base + "/ready"] = {"get": {"summary": "Model readiness", "parameters": parameters, "responses": ready}}
        paths[base + "/config"] = {"get": {"summary": "Model configuration (Triton's extension)", "parameters": parameters,
                                           "responses": _responses({"type": "object"}, *LOOKUP_ERRORS)}}
        paths[base + "/stats"] = {"get": {"summary": "Model statistics, every worker summed (Triton's extension)",
                                          "parameters": parameters,
                                          "responses": _responses(_ref("V2Statistics"), *LOOKUP_ERRORS)}}
        infer = _responses(_ref("V2InferResponse"), *INFER_ERRORS)
        infer["200"]["content"]["application/octet-stream"] = {"schema": {"type": "string", "format": "binary"}}
        paths[base + "/infer"] = {"post": {
            "summary": "Inference (JSON, or the binary tensor extension)", "parameters": parameters,
            "requestBody": {"required": True, "content": _content(_ref("V2InferRequest"))},
            "responses": infer}}
    return paths


def _handler_paths(handlers: dict[str, Any]) -> dict[str, Any]:
    """For each model whose serving version has a handler: its predict path with the handler's schemas."""
    paths: dict[str, Any] = {}
    for name, handler in sorted(handlers.items()):
        request = handler.request_schema if handler.request_schema is not None else {"type": "object"}
        response = handler.response_schema if handler.response_schema is not None else ANY_JSON
        said = "the handler's response" if handler.response_schema is not None else "free-form (the handler's response)"
        paths[f"/v1/models/{name}:predict"] = {"post": {
            "summary": f"Predict through model {name}'s handler", "parameters": [REQUEST_ID],
            "requestBody": {"required": True, "content": _content(request)},
            "responses": {"200": {"description": said, "content": _content(response)},
                          **{str(code): {"description": "error", "content": _content(ERROR)} for code in INFER_ERRORS}}}}
    return paths


def spec(handlers: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole document; `handlers` (model name -> its serving version's handler) add their own predict paths."""
    paths = {
        "/healthz": {"get": {"summary": "Liveness", "responses": _responses(_ref("Health"))}},
        "/readyz": {"get": {"summary": "Readiness of this worker", "responses": {
            "200": {"description": "ready", "content": _content(_ref("Health"))},
            "503": {"description": "loading or failed", "content": _content(_ref("Health"))}}}},
        "/metrics": {"get": {"summary": "Prometheus metrics of every worker", "responses": {
            "200": {"description": "text exposition", "content": {"text/plain": {"schema": {"type": "string"}}}},
            "503": {"description": "metrics unavailable", "content": _content(ERROR)}}}},
        "/openapi.json": {"get": {"summary": "This document", "responses": _responses({"type": "object"})}},
        **_tfserving_paths(),
        **_v2_paths(),
        **_handler_paths(handlers or {}),
    }
    return {
        "openapi": "3.0.3",
        "info": {"title": "forkserve", "version": "0.1.0",
                 "description": "TensorFlow Serving REST API and Open Inference Protocol V2 for Keras/TensorFlow models."},
        "paths": paths,
        "components": {"schemas": SCHEMAS},
    }


@blueprint.get("/openapi.json")
def openapi() -> Response:
    """The OpenAPI document, with the handler models this worker serves."""
    handlers = {}
    for name, model in registry().models.items():
        serving = model.available()
        if serving and serving[0].handler is not None:
            handlers[name] = serving[0].handler
    return json_response(spec(handlers))
