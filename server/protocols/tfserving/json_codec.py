"""TensorFlow Serving's REST JSON: predict (row and columnar), classify and regress bodies."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from server.config import ModelConfig
from server.errors import InvalidArgument
from server.protocols.tfserving import examples as example_rules
from server.signature import DEFAULT_SIGNATURE, SignatureInfo
from server.tensors.arrays import to_array, utf8
from server.tensors.b64 import decode_b64, encode_b64, is_b64_value
from server.tensors.declared import check_rows


@dataclass(frozen=True)
class PredictRequest:
    """A decoded predict body: numpy inputs and whether the client used the row format."""

    signature_name: str
    inputs: dict[str, np.ndarray]
    row_format: bool


def request_object(body: Any) -> dict[str, Any]:
    """The body must be a JSON object."""
    if not isinstance(body, dict):
        raise InvalidArgument(f"request body must be a JSON object, got {type(body).__name__}")
    return body


def signature_name(body: dict[str, Any]) -> str:
    """`signature_name` or serving_default."""
    name = body.get("signature_name", DEFAULT_SIGNATURE)
    if not isinstance(name, str) or not name:
        raise InvalidArgument("signature_name must be a non-empty string")
    return name


def _columns_from_instances(instances: list[Any], signature: SignatureInfo) -> dict[str, list[Any]]:
    """Row format to one list per input; named inputs need an object per instance."""
    names = list(signature.inputs)
    named = all(isinstance(row, dict) and not is_b64_value(row) for row in instances)
    if len(names) == 1 and not named:
        return {names[0]: instances}
    if not named:
        raise InvalidArgument(
            f"signature takes named inputs {sorted(names)}: each instance must be an object keyed by input name"
        )
    keys = {frozenset(row) for row in instances}
    if len(keys) != 1:
        raise InvalidArgument("every instance must name the same inputs")
    return {name: [row[name] for row in instances] for name in instances[0]}


def decode_predict(body: Any, signature_lookup: Any, config: ModelConfig) -> PredictRequest:
    """Parse a predict body; `signature_lookup(name)` returns the SignatureInfo to decode against."""
    body = request_object(body)
    has_instances, has_inputs = "instances" in body, "inputs" in body
    if has_instances and has_inputs:
        raise InvalidArgument("request has both 'instances' and 'inputs'; send exactly one of them")
    if not has_instances and not has_inputs:
        raise InvalidArgument("request has neither 'instances' (row format) nor 'inputs' (columnar format)")
    unknown = sorted(set(body) - {"instances", "inputs", "signature_name"})
    if unknown:
        raise InvalidArgument(f"unknown field(s) in predict request: {unknown}")
    name = signature_name(body)
    signature: SignatureInfo = signature_lookup(name)
    if has_instances:
        instances = body["instances"]
        if not isinstance(instances, list):
            raise InvalidArgument("'instances' must be a list with one item per example")
        if not instances:
            raise InvalidArgument("empty batch: 'instances' is an empty list")
        check_rows(len(instances), config.max_request_rows)  # NOTE: before a row is decoded (a b64 image each)
        columns = _columns_from_instances(instances, signature)
    else:
        value = body["inputs"]
        names = list(signature.inputs)
        if isinstance(value, dict) and not is_b64_value(value):
            columns = value
        elif len(names) == 1:
            columns = {names[0]: value}
        else:
            raise InvalidArgument(f"signature takes named inputs {sorted(names)}: 'inputs' must be an object")
    arrays = {}
    for input_name, value in columns.items():
        info = signature.inputs.get(input_name)
        if info is None:
            raise InvalidArgument(f"unknown input {input_name!r}; signature {name!r} takes {sorted(signature.inputs)}")
        if isinstance(value, list):
            check_rows(len(value), config.max_request_rows)
        arrays[input_name] = to_array(value, info, config, batched=has_instances or isinstance(value, list))
    return PredictRequest(name, arrays, has_instances)


def _output_value(name: str, array: Any) -> Any:
    """numpy output (array or one row of it) to what JSON carries: bytes as b64 (for *_bytes) or text."""
    if isinstance(array, np.ndarray) and array.dtype != object:
        return array
    as_b64 = name.endswith("_bytes")

    def convert(item: Any) -> Any:
        if isinstance(item, np.ndarray):
            return [convert(x) for x in item]
        if isinstance(item, bytes):
            return encode_b64(item) if as_b64 else item.decode("utf-8", errors="replace")
        return item

    return convert(array)


def encode_predict(outputs: dict[str, np.ndarray], row_format: bool) -> dict[str, Any]:
    """TF Serving's predict response: output names left out when there is one output."""
    if row_format:
        if len(outputs) == 1:
            (name, array), = outputs.items()
            return {"predictions": _output_value(name, array)}
        names = list(outputs)
        batch = len(next(iter(outputs.values())))
        return {"predictions": [{n: _output_value(n, outputs[n][i]) for n in names} for i in range(batch)]}
    if len(outputs) == 1:
        (name, array), = outputs.items()
        return {"outputs": _output_value(name, array)}
    return {"outputs": {n: _output_value(n, a) for n, a in outputs.items()}}


FEATURE_KINDS = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}
INT64_MIN, INT64_MAX, UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
DEBUG_STRING_BYTES = 256  # TF Serving's kMaxJsonDebugStringBytes


def _json_type(value: Any) -> str:
    """A JSON value's type as TF Serving's JsonTypeString names it."""
    if value is None or isinstance(value, bool):
        return str(value).replace("None", "Null")
    return {dict: "Object", list: "Array", str: "String"}.get(type(value), "Number")


def _debug_string(value: Any) -> str:
    """A JSON value compact and cut near 256 bytes, as TF Serving's JsonValueToDebugString quotes a request."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    return text[:DEBUG_STRING_BYTES]


def _add_value(value: Any, name: str, feature: Any) -> None:
    """One JSON value onto a tf.train.Feature, its kind set by the first value (TF Serving's AddValueToFeature)."""
    if isinstance(value, bool):
        kind, item = "int64_list", int(value)
    elif isinstance(value, str):
        kind, item = "bytes_list", utf8(value, name)
    elif is_b64_value(value):
        kind, item = "bytes_list", decode_b64(value["b64"])
    elif isinstance(value, float) or (isinstance(value, int) and not INT64_MIN <= value <= UINT64_MAX):
        kind, item = "float_list", float(value)  # NOTE: rapidjson reads an integer past uint64 as a double
    elif isinstance(value, int):
        if value > INT64_MAX:
            raise InvalidArgument(f"Feature: {name} has uint64_t element. Only int64_t is supported.")
        kind, item = "int64_list", value
    else:
        raise InvalidArgument(f"Feature: {name} has element with unexpected JSON type: {_json_type(value)}")
    current = feature.WhichOneof("kind")
    if current not in (None, kind):
        raise InvalidArgument(f"Unexpected element type in feature: {name} expecting type: {FEATURE_KINDS[current]}")
    getattr(feature, kind).value.append(item)


def _example(value: Any, example_pb2: Any) -> Any:
    """A JSON object of features (a value or a list of values each) as a tf.Example (TF Serving's MakeExampleFromJsonObject)."""
    if not isinstance(value, dict):
        raise InvalidArgument(f"Example must be JSON object but got JSON {_json_type(value)}")
    example = example_pb2.Example()
    for name, content in value.items():
        feature = example.features.feature[name]
        for item in content if isinstance(content, list) else [content]:
            _add_value(item, name, feature)
    return example


def decode_examples(body: Any, max_rows: int) -> tuple[str, np.ndarray]:
    """classify/regress body to serialized tf.Examples, at most `max_rows`: TF Serving's FillClassifyRegressRequestFromJson.

    The context's bytes go before each example's, as TF Serving feeds example_list_with_context.
    """
    # NOTE: runs in a worker, where TensorFlow is already loaded; the protobuf class is all we use.
    from tensorflow.core.example import example_pb2

    body = request_object(body)
    unknown = sorted(set(body) - {"examples", "context", "signature_name"})
    if unknown:
        raise InvalidArgument(f"unknown field(s) in request: {unknown}")
    name = body.get("signature_name", "")
    if not isinstance(name, str):
        raise InvalidArgument(f"JSON Value: {_debug_string(body)} not formatted correctly. "
                              "'signature_name' key must be a string value.")
    context = _example(body["context"], example_pb2).SerializeToString() if "context" in body else b""
    if "examples" not in body:  # NOTE: TF Serving's words, "classify" for :regress too
        raise InvalidArgument(f"JSON Value: {_debug_string(body)} When method is classify, key 'examples' is expected "
                              "and was not found")
    examples = body["examples"]
    if not isinstance(examples, list):
        raise InvalidArgument(f"JSON Value: {_debug_string(body)} Expecting 'examples' value to be an list/array")
    if not examples:
        raise InvalidArgument(f"JSON Value: {_debug_string(body)} 'examples' value is an empty array")
    check_rows(len(examples), max_rows)
    serialized = np.empty(len(examples), dtype=object)
    serialized[:] = [context + _example(example, example_pb2).SerializeToString() for example in examples]
    return name or DEFAULT_SIGNATURE, serialized


def encode_classify(outputs: dict[str, np.ndarray], batch: int) -> dict[str, Any]:
    """`results`: per example a list of [label, score] pairs, as TF Serving writes them ("" and 0 for what is missing)."""
    return {"results": [[["" if label is None else label, 0.0 if score is None else score] for label, score in pairs]
                        for pairs in example_rules.classifications(outputs, batch)]}


def encode_regress(outputs: dict[str, np.ndarray], batch: int) -> dict[str, Any]:
    """`results`: one value per example."""
    return {"results": example_rules.regressions(outputs, batch)}
