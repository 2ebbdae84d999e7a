"""tensorflow.serving.PredictionService and ModelService over gRPC: the REST API's semantics, protobuf tensors."""

from __future__ import annotations

import time
from typing import Any

import grpc
import numpy as np

from server.errors import ApiError, InvalidArgument, NotFound
from server.http import instrument
from server.http.codecs.declared import check_rows, check_shape
from server.http.codecs.images import decode_image
from server.http.codecs.tensors import check_names
from server.http.common import infer_steps, model_address, predict_steps
from server.rpc import messages, tensor_proto
from server.rpc.calls import Calls, timeout_for
from server.signature import METHOD_NAMES, SignatureInfo, TensorInfo
from server.telemetry.payloads import capture
from server.worker.flow import Steps
from server.worker.registry import ModelVersion

DEFAULT_SIGNATURE = "serving_default"
# TF Serving's ModelVersionStatus.State values
STATES = {"START": 10, "LOADING": 20, "AVAILABLE": 30, "UNLOADING": 40, "END": 50}
# tensorflow.error.Code values of the names REST's status JSON gives
ERROR_CODES = {"OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4, "NOT_FOUND": 5,
               "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8, "FAILED_PRECONDITION": 9,
               "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12, "INTERNAL": 13, "UNAVAILABLE": 14,
               "DATA_LOSS": 15, "UNAUTHENTICATED": 16}
PREDICTION_SERVICE = "tensorflow.serving.PredictionService"
MODEL_SERVICE = "tensorflow.serving.ModelService"


def model_name(spec: Any) -> str:
    """A ModelSpec's model name, checked as REST and V2 check theirs (`../x` is INVALID_ARGUMENT, not NOT_FOUND)."""
    if not spec.name:
        raise InvalidArgument("model_spec.name is empty")
    return model_address(spec.name, None)[0]


def resolve(calls: Calls, spec: Any) -> ModelVersion:
    """The version a ModelSpec addresses: version, version_label or the latest, as the REST paths do."""
    model = calls.registry.get(model_name(spec))
    choice = spec.WhichOneof("version_choice")  # version and version_label are a oneof
    return model.resolve(spec.version.value if choice == "version" else None,
                         spec.version_label if choice == "version_label" else None)


def decode_inputs(inputs: Any, signature: SignatureInfo, target: ModelVersion) -> dict[str, np.ndarray]:
    """A PredictRequest's tensors as numpy of the signature's dtypes; encoded images (DT_STRING) for an image input are decoded.

    NOTE: the dtype must be the signature's, as in TF Serving (REST's JSON numbers have no dtype,
    so REST casts them; a TensorProto says what it holds). Each tensor's name, dtype and declared
    shape (rank, fixed sizes, rows) are checked before it is built: a fill of one PNG over [250000]
    would otherwise decode 250,000 images. Batch sizes and finiteness are checked after, by the same
    validate_inputs REST uses.
    """
    check_names(inputs, signature)
    max_rows = target.config.max_request_rows
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
        arrays[name] = decode_images(array, info, target) if images else array
    return arrays


def decode_images(encoded: np.ndarray, info: TensorInfo, target: ModelVersion) -> np.ndarray:
    """A [N] DT_STRING tensor of encoded images (JPEG, PNG, ...) as the image input's batch, as REST's {"b64": ...} rows."""
    images = [decode_image(item, info, target.config) for item in encoded]
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


def fill_spec(spec: Any, target: ModelVersion, signature_name: str) -> None:
    """The response's model_spec: the version that answered."""
    spec.name = target.name
    spec.version.value = target.version
    spec.signature_name = signature_name


def signature_def(signature: SignatureInfo, proto: Any) -> None:
    """Fill a tensorflow.SignatureDef with a signature's tensors (names as TF Serving's REST metadata gives them)."""
    for kind, tensors in (("inputs", signature.inputs), ("outputs", signature.outputs)):
        for key, info in tensors.items():
            entry = getattr(proto, kind)[key]
            entry.name = info.name
            entry.dtype = tensor_proto.ENUMS.get(info.dtype, 0)
            if info.shape is None:
                entry.tensor_shape.unknown_rank = True
            else:
                for size in info.shape:
                    entry.tensor_shape.dim.add().size = -1 if size is None else size
    proto.method_name = METHOD_NAMES[signature.method]


def serialized_examples(given: Any, signature: SignatureInfo, method: str, max_rows: int) -> np.ndarray:
    """A Classify/Regress request's `input` as serialized tf.Examples (context features merged), for a `method` signature.

    NOTE: the examples are counted against max_rows before one is serialized.
    """
    if signature.method != method:
        raise InvalidArgument(f"signature {signature.name!r} is a {signature.method} signature, not {method}; "
                              f"call {signature.method.capitalize()} or pick another signature_name")
    if list(signature.inputs) != ["inputs"] or signature.inputs["inputs"].dtype != "string":
        raise InvalidArgument(f"signature {signature.name!r} does not take serialized tf.Examples")
    kind = given.WhichOneof("kind")
    if kind == "example_list":
        check_rows(len(given.example_list.examples), max_rows)
        examples = [e.SerializeToString() for e in given.example_list.examples]
    elif kind == "example_list_with_context":
        # NOTE: TF Serving's own merge: the context's bytes, then the example's; protobuf parses the
        # concatenation as one message, in which an example's feature replaces the context's.
        with_context = given.example_list_with_context
        check_rows(len(with_context.examples), max_rows)
        context_bytes = with_context.context.SerializeToString()
        examples = [context_bytes + e.SerializeToString() for e in with_context.examples]
    else:
        raise InvalidArgument("input has no examples: set example_list or example_list_with_context")
    if not examples:
        raise InvalidArgument("input holds no examples")
    serialized = np.empty(len(examples), dtype=object)
    serialized[:] = examples
    return serialized


def regression_values(outputs: dict[str, np.ndarray], rows: int) -> list[float]:
    """A regress signature's one value per example, or InvalidArgument."""
    values = outputs.get("outputs")
    if values is None or np.asarray(values).size != rows:
        raise InvalidArgument("regression signature must give one 'outputs' value per example")
    return np.asarray(values).reshape(rows).tolist()


class PredictionService:
    """Predict, Classify, Regress and GetModelMetadata; MultiInference is not offered."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.apis = messages.tfserving()

    def Predict(self, request: Any, context: grpc.ServicerContext) -> Any:
        """TF Serving's Predict; a model with a handler is called without it (tensors in, tensors out, as V2)."""
        response = self.apis.predict_pb2.PredictResponse()

        def work() -> Steps[tuple[Any, ModelVersion]]:
            target = resolve(self.calls, request.model_spec)
            instrument.set_version(target.version)
            if capture.ON:
                capture.sample(instrument.current(), target)
            started = time.perf_counter()
            signature = target.signature(request.model_spec.signature_name or DEFAULT_SIGNATURE)
            wanted = output_names(request.output_filter, signature)
            inputs = decode_inputs(request.inputs, signature, target)
            if capture.ON:
                capture.grpc_inputs(instrument.current(), inputs)
            _, outputs = yield from predict_steps(target, signature.name, inputs, started, timeout_for(context, target))
            if capture.ON:
                capture.grpc_outputs(instrument.current(), outputs, wanted)
            started = time.perf_counter()
            for name in wanted or outputs:
                tensor_proto.from_array(outputs[name], response.outputs[name], name)
            fill_spec(response.model_spec, target, signature.name)
            instrument.stage("encode", time.perf_counter() - started)
            return response, target

        return self.calls.run(context, f"/{PREDICTION_SERVICE}/Predict", work, response, "tfserving_predict",
                              request.model_spec.name)

    def _examples(self, request: Any, target: ModelVersion, method: str, context: grpc.ServicerContext
                  ) -> Steps[tuple[SignatureInfo, dict[str, np.ndarray], int]]:
        """Serialized tf.Examples of a Classify/Regress request (context features merged), run on its signature."""
        started = time.perf_counter()
        signature = target.signature(request.model_spec.signature_name or DEFAULT_SIGNATURE)
        serialized = serialized_examples(request.input, signature, method, target.config.max_request_rows)
        instrument.stage("decode", time.perf_counter() - started)
        outputs = yield from infer_steps(target, signature.name, {"inputs": serialized}, len(serialized),
                                         signature.batchable, timeout_for(context, target))
        return signature, outputs, len(serialized)

    def Classify(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = self.apis.classification_pb2.ClassificationResponse()

        def work() -> Steps[tuple[Any, ModelVersion]]:
            target = resolve(self.calls, request.model_spec)
            instrument.set_version(target.version)
            signature, outputs, rows = yield from self._examples(request, target, "classify", context)
            scores, classes = outputs.get("scores"), outputs.get("classes")
            for i in range(rows):
                row_scores = [] if scores is None else np.asarray(scores[i]).reshape(-1).tolist()
                row_classes = [] if classes is None else np.asarray(classes[i]).reshape(-1).tolist()
                result = response.result.classifications.add()
                for j in range(max(len(row_scores), len(row_classes))):
                    entry = result.classes.add()
                    if j < len(row_classes):
                        label = row_classes[j]
                        entry.label = label.decode("utf-8", "replace") if isinstance(label, bytes) else str(label)
                    if j < len(row_scores):
                        entry.score = row_scores[j]
            fill_spec(response.model_spec, target, signature.name)
            return response, target

        return self.calls.run(context, f"/{PREDICTION_SERVICE}/Classify", work, response, "tfserving_classify",
                              request.model_spec.name)

    def Regress(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = self.apis.regression_pb2.RegressionResponse()

        def work() -> Steps[tuple[Any, ModelVersion]]:
            target = resolve(self.calls, request.model_spec)
            instrument.set_version(target.version)
            signature, outputs, rows = yield from self._examples(request, target, "regress", context)
            for value in regression_values(outputs, rows):
                response.result.regressions.add().value = value
            fill_spec(response.model_spec, target, signature.name)
            return response, target

        return self.calls.run(context, f"/{PREDICTION_SERVICE}/Regress", work, response, "tfserving_regress",
                              request.model_spec.name)

    def MultiInference(self, request: Any, context: grpc.ServicerContext) -> Any:
        def work() -> tuple[Any, None]:
            raise ApiError("MultiInference is not implemented by forkserve; call Classify or Regress", status=501)

        return self.calls.run(context, f"/{PREDICTION_SERVICE}/MultiInference", work, None)

    def GetModelMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = self.apis.get_model_metadata_pb2.GetModelMetadataResponse()

        def work() -> tuple[Any, ModelVersion]:
            fields = list(request.metadata_field)
            if not fields:
                raise InvalidArgument("GetModelMetadataRequest must specify at least one metadata_field: 'signature_def'")
            for field in fields:
                if field != "signature_def":
                    raise InvalidArgument(f"metadata field {field!r} is not supported; the one field is 'signature_def'")
            target = resolve(self.calls, request.model_spec)
            signature_map = self.apis.get_model_metadata_pb2.SignatureDefMap()
            for name, signature in sorted(target.servable.signatures.items()):
                signature_def(signature, signature_map.signature_def[name])
            response.metadata["signature_def"].Pack(signature_map)
            fill_spec(response.model_spec, target, "")
            response.model_spec.ClearField("signature_name")
            return response, target

        return self.calls.run(context, f"/{PREDICTION_SERVICE}/GetModelMetadata", work, response)


class ModelService:
    """GetModelStatus; HandleReloadConfigRequest is `publish`'s job here."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.apis = messages.tfserving()

    def GetModelStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = self.apis.get_model_status_pb2.GetModelStatusResponse()

        def work() -> tuple[Any, None]:
            spec = request.model_spec
            model = self.calls.registry.get(model_name(spec))
            choice = spec.WhichOneof("version_choice")
            version = spec.version.value if choice == "version" else None
            if choice == "version_label":
                version = model.resolve(None, spec.version_label).version
            statuses = self.calls.registry.statuses(spec.name)
            if version is not None:
                statuses = [s for s in statuses if s["version"] == str(version)]
                if not statuses:
                    raise NotFound(f"Servable not found for request: Specific({spec.name}, {version})")
            if not statuses:
                raise NotFound(f"Servable not found for request: Latest({spec.name})")
            for status in statuses:
                entry = response.model_version_status.add()
                entry.version = int(status["version"])
                entry.state = STATES.get(status["state"], 0)
                entry.status.error_code = ERROR_CODES.get(status["status"]["error_code"], ERROR_CODES["UNKNOWN"])
                entry.status.error_message = status["status"]["error_message"]
            return response, None

        return self.calls.run(context, f"/{MODEL_SERVICE}/GetModelStatus", work, response)

    def HandleReloadConfigRequest(self, request: Any, context: grpc.ServicerContext) -> Any:
        def work() -> tuple[Any, None]:
            raise ApiError("forkserve does not reload its configuration over gRPC: put a new version in place with "
                           "`python -m server publish` (or edit conf/models.toml), and the workers roll over to it", status=501)

        return self.calls.run(context, f"/{MODEL_SERVICE}/HandleReloadConfigRequest", work, None)


def services(calls: Calls) -> list[tuple[Any, Any]]:
    """(service descriptor, servicer) of PredictionService and ModelService (server.rpc.transport registers them)."""
    apis = messages.tfserving()
    return [(apis.prediction_service_pb2.DESCRIPTOR.services_by_name["PredictionService"], PredictionService(calls)),
            (apis.model_service_pb2.DESCRIPTOR.services_by_name["ModelService"], ModelService(calls))]
