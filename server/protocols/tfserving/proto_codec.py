"""TF Serving's protobuf wire form: PredictRequest tensors in, model specs, signature defs and tf.Examples out; no grpc."""

from __future__ import annotations

from typing import Any

import numpy as np

from server.config import ModelConfig
from server.errors import InvalidArgument
from server.protocols.tfserving import examples, tensor_proto
from server.signature import SignatureInfo, TensorInfo
from server.tensors.declared import check_rows, check_shape
from server.tensors.images import decode_image
from server.tensors.validate import check_names

# TF Serving's ModelVersionStatus.State values
STATES = {"START": 10, "LOADING": 20, "AVAILABLE": 30, "UNLOADING": 40, "END": 50}
# tensorflow.error.Code values of the names REST's status JSON gives
ERROR_CODES = {"OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4, "NOT_FOUND": 5,
               "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8, "FAILED_PRECONDITION": 9,
               "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12, "INTERNAL": 13, "UNAVAILABLE": 14,
               "DATA_LOSS": 15, "UNAUTHENTICATED": 16}


def decode_inputs(inputs: Any, signature: SignatureInfo, config: ModelConfig) -> dict[str, np.ndarray]:
    """A PredictRequest's tensors as numpy of the signature's dtypes; encoded images (DT_STRING) for an image input are decoded.

    NOTE: the dtype must be the signature's, as in TF Serving (REST's JSON numbers have no dtype,
    so REST casts them; a TensorProto says what it holds). Each tensor's name, dtype and declared
    shape (rank, fixed sizes, rows) are checked before it is built: a fill of one PNG over [250000]
    would otherwise decode 250,000 images. Batch sizes and finiteness are checked after, by the same
    validate_inputs REST uses.
    """
    check_names(inputs, signature)
    max_rows = config.max_request_rows
    arrays = {}
    for name, proto in inputs.items():
        info = signature.inputs[name]
        dtype, shape = tensor_proto.dtype_of(proto, name), tensor_proto.shape_of(proto, name)
        images = dtype == "string" and info.is_image
        if images:
            if len(shape) != 1:
                raise InvalidArgument(f"input {name!r} takes images: send encoded images as a DT_STRING tensor of shape "
                                      f"[N] (one image per row), not {list(shape)}")
            check_rows(shape[0], max_rows)
        elif dtype != info.dtype:
            raise InvalidArgument(f"input {name!r} is {tensor_proto.dtype_name(proto.dtype)}; signature "
                                  f"{signature.name!r} takes {tensor_proto.TF_NAMES.get(info.dtype, info.dtype)}")
        else:
            check_shape(name, shape, info, max_rows)
        array = tensor_proto.to_array(proto, name)
        arrays[name] = decode_images(array, info, config) if images else array
    return arrays


def decode_images(encoded: np.ndarray, info: TensorInfo, config: ModelConfig) -> np.ndarray:
    """A [N] DT_STRING tensor of encoded images (JPEG, PNG, ...) as the image input's batch, as REST's {"b64": ...} rows."""
    images = [decode_image(item, info, config) for item in encoded]
    if len(images) == 1:  # the usual request: one image; a view, not a copy of its pixels
        return images[0][np.newaxis]
    return np.stack(images) if images else np.zeros((0, *info.shape[1:]), dtype=info.dtype)  # type: ignore[misc]


def output_names(output_filter: Any, signature: SignatureInfo) -> list[str]:
    """The outputs a PredictRequest asks for (empty: all), each a signature output, none twice (TF Serving's rule)."""
    wanted = list(output_filter)
    for name in wanted:
        if name not in signature.outputs:
            raise InvalidArgument(f"output_filter names {name!r}; signature {signature.name!r} gives "
                                  f"{sorted(signature.outputs)}")
    if len(set(wanted)) != len(wanted):
        raise InvalidArgument(f"output_filter names an output twice: {wanted}")
    return wanted


def fill_spec(spec: Any, name: str, version: int, signature_name: str) -> None:
    """The response's model_spec: the version that answered."""
    spec.name = name
    spec.version.value = version
    spec.signature_name = signature_name


def signature_def_map(signatures: dict[str, SignatureInfo], proto: Any) -> None:
    """Fill a tensorflow.serving.SignatureDefMap: every SignatureDef, as TF Serving's GetModelMetadata copies them."""
    for name, signature in sorted(signatures.items()):
        signature_def(signature, proto.signature_def[name])


def signature_def(signature: SignatureInfo, proto: Any) -> None:
    """Fill a tensorflow.SignatureDef: the SavedModel's own when known, else built from the signature's tensors."""
    if signature.definition is not None:
        proto.MergeFromString(signature.definition)
        return
    for kind, tensors in (("inputs", signature.inputs), ("outputs", signature.outputs)):
        for key, info in tensors.items():
            entry = getattr(proto, kind)[key]
            entry.name = info.tensor_name
            entry.dtype = entry.DESCRIPTOR.fields_by_name["dtype"].enum_type.values_by_name[info.tf_dtype].number
            if info.shape is None:
                entry.tensor_shape.unknown_rank = True
            else:
                for size in info.shape:
                    entry.tensor_shape.dim.add().size = -1 if size is None else size
    proto.method_name = signature.tfserving_method_name


def serialized_examples(given: Any, max_rows: int) -> np.ndarray:
    """A Classify/Regress request's `input` as serialized tf.Examples (context features merged).

    NOTE: the examples are counted against max_rows before one is serialized.
    """
    kind = given.WhichOneof("kind")
    if kind == "example_list":
        check_rows(len(given.example_list.examples), max_rows)
        serialized_list = [e.SerializeToString() for e in given.example_list.examples]
    elif kind == "example_list_with_context":
        # NOTE: TF Serving's own merge: the context's bytes, then the example's; protobuf parses the
        # concatenation as one message, in which an example's feature replaces the context's.
        with_context = given.example_list_with_context
        check_rows(len(with_context.examples), max_rows)
        context_bytes = with_context.context.SerializeToString()
        serialized_list = [context_bytes + e.SerializeToString() for e in with_context.examples]
    else:
        raise InvalidArgument("Input is empty.")  # TF Serving's InputToSerializedExampleTensor (util.cc)
    if not serialized_list:
        raise InvalidArgument("Input is empty.")
    serialized = np.empty(len(serialized_list), dtype=object)
    serialized[:] = serialized_list
    return serialized


def fill_classifications(result: Any, outputs: dict[str, np.ndarray], rows: int) -> None:
    """A ClassificationResult: per example its classes' labels and scores, checked as TF Serving checks them."""
    for pairs in examples.classifications(outputs, rows):
        classification = result.classifications.add()
        for label, score in pairs:
            entry = classification.classes.add()
            if label is not None:
                entry.label = label
            if score is not None:
                entry.score = score


def fill_regressions(result: Any, outputs: dict[str, np.ndarray], rows: int) -> None:
    """A RegressionResult: one value per example, checked as TF Serving checks it."""
    for value in examples.regressions(outputs, rows):
        result.regressions.add().value = value
