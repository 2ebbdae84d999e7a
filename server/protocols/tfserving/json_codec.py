"""TensorFlow Serving's REST JSON: predict (row and columnar), classify and regress bodies."""

from __future__ import annotations

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


def _feature(value: Any, feature_pb2: Any) -> Any:
    """One JSON feature value (scalar or list) to a tf.train.Feature."""
    values = value if isinstance(value, list) else [value]
    feature = feature_pb2.Feature()
    if all(isinstance(v, bool) for v in values) or not values:
        if values:
            raise InvalidArgument("tf.Example features cannot be booleans")
        return feature
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        try:
            feature.int64_list.value.extend(values)
        except ValueError as exc:
            raise InvalidArgument(f"int64 feature out of range: {exc}") from None
    elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        feature.float_list.value.extend(float(v) for v in values)
    elif all(isinstance(v, str) or is_b64_value(v) for v in values):
        feature.bytes_list.value.extend(
            decode_b64(v["b64"]) if is_b64_value(v) else utf8(v, "feature") for v in values
        )
    else:
        raise InvalidArgument(f"feature values must be all numbers or all strings, got {values[:4]!r}")
    return feature


def decode_examples(body: Any, max_rows: int) -> tuple[str, np.ndarray]:
    """classify/regress body (`examples` + optional `context`) to serialized tf.Examples, at most `max_rows` of them."""
    # NOTE: runs in a worker, where TensorFlow is already loaded; the protobuf class is all we use.
    from tensorflow.core.example import example_pb2, feature_pb2

    body = request_object(body)
    unknown = sorted(set(body) - {"examples", "context", "signature_name"})
    if unknown:
        raise InvalidArgument(f"unknown field(s) in request: {unknown}")
    examples = body.get("examples")
    if not isinstance(examples, list) or not examples:
        raise InvalidArgument("'examples' must be a non-empty list of objects")
    check_rows(len(examples), max_rows)
    context = body.get("context", {})
    if not isinstance(context, dict):
        raise InvalidArgument("'context' must be an object")
    serialized = []
    for example in examples:
        if not isinstance(example, dict):
            raise InvalidArgument("each example must be an object of feature name to value")
        message = example_pb2.Example()
        for key, value in {**context, **example}.items():
            message.features.feature[key].CopyFrom(_feature(value, feature_pb2))
        serialized.append(message.SerializeToString())
    return signature_name(body), np.array(serialized, dtype=object)


def encode_classify(outputs: dict[str, np.ndarray], batch: int) -> dict[str, Any]:
    """`results`: per example a list of [label, score] pairs, as TF Serving writes them ("" and 0 for what is missing)."""
    return {"results": [[["" if label is None else label, 0.0 if score is None else score] for label, score in pairs]
                        for pairs in example_rules.classifications(outputs, batch)]}


def encode_regress(outputs: dict[str, np.ndarray], batch: int) -> dict[str, Any]:
    """`results`: one value per example."""
    return {"results": example_rules.regressions(outputs, batch)}
