"""TF Serving's rules for Classify, Regress and MultiInference on tf.Example signatures, with its messages; no TensorFlow.

Matched against tensorflow_serving/servables/tensorflow/classifier.cc, regressor.cc and
multi_inference.cc. TF Serving runs --enable_signature_method_name_check=false by default: a
signature is classified or regressed by its tensors' keys, whatever its method_name (TF2
SavedModels label every signature tensorflow/serving/predict).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from server.errors import ApiError, InvalidArgument
from server.signature import DEFAULT_SIGNATURE, METHOD_NAMES, SignatureInfo, TensorInfo

CLASSIFY, REGRESS = METHOD_NAMES["classify"], METHOD_NAMES["regress"]
NUMPY_DTYPE_NAMES = {"float32": "DT_FLOAT", "float64": "DT_DOUBLE", "float16": "DT_HALF", "int32": "DT_INT32",
                     "int64": "DT_INT64", "object": "DT_STRING", "bool": "DT_BOOL"}


def debug_string(signature: SignatureInfo) -> str:
    """The SignatureDef in protobuf text format, as TF Serving's SignatureDef::DebugString() quotes it."""
    lines: list[str] = []
    for kind, tensors in (("inputs", signature.inputs), ("outputs", signature.outputs)):
        for key in sorted(tensors):
            lines += [f"{kind} {{", f'  key: "{key}"', "  value {", *_tensor_lines(tensors[key], "    "), "  }", "}"]
    if signature.tfserving_method_name:
        lines.append(f'method_name: "{signature.tfserving_method_name}"')
    return "".join(line + "\n" for line in lines)


def _tensor_lines(info: TensorInfo, indent: str) -> list[str]:
    """A TensorInfo's fields in text format (proto3: fields at their default are left out)."""
    lines = [f'name: "{info.tensor_name}"'] if info.tensor_name else []
    if info.tf_dtype != "DT_INVALID":
        lines.append(f"dtype: {info.tf_dtype}")
    shape: list[str] = []
    for size in info.shape or ():
        size = -1 if size is None else size
        shape += ["  dim {", f"    size: {size}", "  }"] if size else ["  dim {", "  }"]
    if info.shape is None:
        shape.append("  unknown_rank: true")
    if shape:
        lines += ["tensor_shape {", *shape, "}"]
    return [indent + line for line in lines]


def check_takes_examples(signature: SignatureInfo, method: str) -> None:
    """PreProcessClassification / PreProcessRegression: one input `inputs`, the outputs the method reads; InvalidArgument."""
    if len(signature.inputs) != 1:
        raise InvalidArgument("Expected one input Tensor.")
    if method == "classify" and len(signature.outputs) not in (1, 2):
        raise InvalidArgument(f"Expected one or two output Tensors, found {len(signature.outputs)}")
    if method == "regress" and len(signature.outputs) != 1:
        raise InvalidArgument("Expected one output Tensor.")
    kind = "classification" if method == "classify" else "regression"
    if "inputs" not in signature.inputs:
        raise InvalidArgument(f"No {kind} inputs found in SignatureDef: {debug_string(signature)}")
    if method == "classify" and not {"classes", "scores"} & set(signature.outputs):
        raise InvalidArgument('Expected classification signature outputs to contain at least one of "classes" or '
                              f'"scores". Signature was: {debug_string(signature)}')
    if method == "regress" and "outputs" not in signature.outputs:
        raise InvalidArgument(f"No regression outputs found in SignatureDef: {debug_string(signature)}")
    # NOTE: TF Serving does not check the input's dtype; its session refuses the strings. Refused here first.
    if signature.inputs["inputs"].dtype != "string":
        raise InvalidArgument(f"signature {signature.name!r} takes {signature.inputs['inputs'].tf_dtype} in 'inputs', "
                              "not serialized tf.Examples (DT_STRING)")


def examples_signature(signature_defs: Mapping[str, SignatureInfo], name: str, method: str) -> SignatureInfo:
    """GetClassificationSignatureDef / GetRegressionSignatureDef: the signature named (serving_default when none), checked."""
    key = name or DEFAULT_SIGNATURE
    if key not in signature_defs:
        raise InvalidArgument(f"No signature was found with the name: {key}")
    check_takes_examples(signature_defs[key], method)
    return signature_defs[key]


def multi_inference_tasks(tasks: list[tuple[str, str, str]], signature_defs: Mapping[str, SignatureInfo]
                          ) -> list[tuple[SignatureInfo, str]]:
    """A MultiInferenceRequest's (model name, signature name, method_name) tasks as (signature, method), by TF Serving's checks."""
    model = ""
    seen: set[str] = set()
    checked = []
    for task_model, signature_name, method_name in tasks:
        if not task_model:
            raise InvalidArgument("Found ModelSpec with an empty model name.")
        if model and task_model != model:
            raise InvalidArgument("All ModelSpecs in a MultiInferenceRequest must access the same model name.")
        model = task_model
        key = signature_name or DEFAULT_SIGNATURE
        if key in seen:
            raise InvalidArgument(f"Duplicate evaluation of signature: {key}")
        seen.add(key)
        if key not in signature_defs:
            raise InvalidArgument(f"Requested signature not found in model graph: {key}")
        method = {CLASSIFY: "classify", REGRESS: "regress"}.get(method_name)
        if method is None:
            raise ApiError(f"Unsupported signature method_name: {method_name}", status=501)  # UNIMPLEMENTED
        check_takes_examples(signature_defs[key], method)
        checked.append((signature_defs[key], method))
    return checked


def _shape(array: np.ndarray) -> str:
    """A shape as TensorShape::DebugString() prints it: [2,1]."""
    return "[" + ",".join(str(d) for d in array.shape) + "]"


def _dtype(array: np.ndarray) -> str:
    """An output's dtype as DataType_Name() prints it."""
    return NUMPY_DTYPE_NAMES.get("object" if array.dtype.kind in "OSU" else array.dtype.name, array.dtype.name)


def classifications(outputs: Mapping[str, np.ndarray], rows: int) -> list[list[tuple[str | None, float | None]]]:
    """PostProcessClassificationResult: per example its (label, score) pairs, either None when the signature lacks it."""
    checked = {}
    for key, dtype in (("classes", "DT_STRING"), ("scores", "DT_FLOAT")):
        if key not in outputs:
            continue
        array = np.asarray(outputs[key])
        if array.ndim != 2:
            raise InvalidArgument(f"Expected Tensor shape: [batch_size num_classes] but got {_shape(array)}")
        if _dtype(array) != dtype:
            raise InvalidArgument(f"Expected {key} Tensor of {dtype}. Got: {_dtype(array)}")
        if array.shape[0] != rows:
            raise InvalidArgument(f"Expected {key} output batch size of {rows}. Got: {array.shape[0]}")
        checked[key] = array
    classes, scores = checked.get("classes"), checked.get("scores")
    if classes is not None and scores is not None and classes.shape[1] != scores.shape[1]:
        raise InvalidArgument("Tensors class and score should match in dim_size(1). "
                              f"Got {classes.shape[1]} vs. {scores.shape[1]}")
    count = next((a.shape[1] for a in (classes, scores) if a is not None), 0)
    labels = [[None] * count for _ in range(rows)] if classes is None else [
        [c.decode("utf-8", "replace") if isinstance(c, bytes) else str(c) for c in row] for row in classes.tolist()]
    values = [[None] * count for _ in range(rows)] if scores is None else scores.tolist()
    return [list(zip(labels[i], values[i])) for i in range(rows)]


def regressions(outputs: Mapping[str, np.ndarray], rows: int) -> list[float]:
    """PostProcessRegressionResult: one float per example from `outputs` of shape [N] or [N, 1]."""
    if "outputs" not in outputs:
        raise InvalidArgument("Could not find output tensor 'outputs'")
    array = np.asarray(outputs["outputs"])
    if not (array.ndim == 1 or (array.ndim == 2 and array.shape[1] == 1)):
        raise InvalidArgument("Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got "
                              f"{_shape(array)}")
    if array.shape[0] != rows:
        raise InvalidArgument(f"Input batch size did not match output batch size: {rows} vs. {array.shape[0]}")
    if _dtype(array) != "DT_FLOAT":
        raise InvalidArgument(f"Expected output Tensor of DT_FLOAT.  Got: {_dtype(array)}")
    return array.reshape(rows).tolist()
