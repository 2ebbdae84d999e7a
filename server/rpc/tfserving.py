"""tensorflow.serving.PredictionService and ModelService over gRPC: the REST API's semantics, protobuf tensors."""

from __future__ import annotations

import time
from typing import Any, Callable

import grpc
import numpy as np
from google.protobuf import text_format

from server.dataplane import envelope, repository
from server.dataplane.inference import examples_steps, multi_inference_steps
from server.dataplane.models import tfserving_statuses, tfserving_version
from server.dataplane.requests import model_address
from server.errors import InvalidArgument
from server.models.flow import Steps
from server.models.registry import ModelVersion
from server.models.signature_choice import (
    examples_signature,
    multi_inference_checked,
    predict_signature,
)
from server.protocols.tfserving import messages, proto_codec, tensor_proto
from server.protocols.tfserving.proto_codec import ERROR_CODES, STATES
from server.rpc.calls import Calls, predict_tensors, timeout_for
from server.settings import Settings
from server.telemetry import measure
from server.telemetry.payloads import capture

PREDICTION_SERVICE = "tensorflow.serving.PredictionService"
MODEL_SERVICE = "tensorflow.serving.ModelService"


def model_name(spec: Any) -> str:
    """A ModelSpec's model name, checked as REST and V2 check theirs (`../x` is INVALID_ARGUMENT, not NOT_FOUND)."""
    if not spec.name:
        raise InvalidArgument("ModelSpec has no name specified.")  # TF Serving's ServerCore::ServableRequestFromModelSpec
    return model_address(spec.name, None)[0]


def model_spec(request: Any) -> Any:
    """A request's model_spec, or TF Serving's INVALID_ARGUMENT "Missing ModelSpec" (classification_service.cc and others)."""
    if not request.HasField("model_spec"):
        raise InvalidArgument("Missing ModelSpec")
    return request.model_spec


def resolve(calls: Calls, spec: Any) -> ModelVersion:
    """The version a ModelSpec addresses: version, version_label or the latest, as the REST paths do."""
    model = calls.registry.get(model_name(spec))
    choice = spec.WhichOneof("version_choice")  # version and version_label are a oneof
    return tfserving_version(model, spec.version.value if choice == "version" else None,
                             spec.version_label if choice == "version_label" else None)


class PredictionService:
    """Predict, Classify, Regress, MultiInference and GetModelMetadata."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.apis = messages.apis()

    def Predict(self, request: Any, context: grpc.ServicerContext) -> Any:
        """TF Serving's Predict; a model with a handler is called without it (tensors in, tensors out, as V2)."""
        response = self.apis.predict_pb2.PredictResponse()

        def work() -> Steps[tuple[Any, ModelVersion]]:
            served = resolve(self.calls, model_spec(request))
            envelope.serving(served)
            started = time.perf_counter()
            signature = predict_signature(served, request.model_spec.signature_name)
            wanted = proto_codec.output_names(request.output_filter, signature)
            inputs = proto_codec.decode_inputs(request.inputs, signature, served.config)
            outputs = yield from predict_tensors(served, signature.name, inputs, wanted, started, context)
            started = time.perf_counter()
            for name in wanted or outputs:
                tensor_proto.from_array(outputs[name], response.outputs[name], name)
            proto_codec.fill_spec(response.model_spec, served.name, served.version, signature.name)
            measure.stage("encode", time.perf_counter() - started)
            return response, served

        return self.calls.run(context, f"/{PREDICTION_SERVICE}/Predict", work, response, "tfserving_predict",
                              request.model_spec.name)

    def _examples(self, request: Any, method: str, context: grpc.ServicerContext
                  ) -> Steps[tuple[ModelVersion, str, dict[str, np.ndarray], int]]:
        """A Classify/Regress request's tf.Examples (context features merged) run on its signature, by the dataplane.

        In TF Serving's order (classifier.cc, regressor.cc): the servable, the signature, then the input.
        """
        served = resolve(self.calls, model_spec(request))
        envelope.serving(served)
        started = time.perf_counter()
        signature = examples_signature(served, request.model_spec.signature_name, method)
        serialized = proto_codec.serialized_examples(request.input, served.config.max_request_rows)
        if capture.ON:
            capture.grpc_inputs(measure.current(), {"inputs": serialized})
        outputs = yield from examples_steps(served, signature, serialized, started, timeout_for(context, served))
        if capture.ON:
            capture.grpc_outputs(measure.current(), outputs, [])
        return served, signature.name, outputs, len(serialized)

    def Classify(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._answer_examples(request, context, "classify", self.apis.classification_pb2.ClassificationResponse(),
                                     proto_codec.fill_classifications)

    def Regress(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._answer_examples(request, context, "regress", self.apis.regression_pb2.RegressionResponse(),
                                     proto_codec.fill_regressions)

    def _answer_examples(self, request: Any, context: grpc.ServicerContext, method: str, response: Any,
                         fill: Callable[[Any, dict[str, np.ndarray], int], None]) -> Any:
        """Classify or Regress: the examples through the dataplane, the result filled by `fill`."""
        def work() -> Steps[tuple[Any, ModelVersion]]:
            served, signature_name, outputs, rows = yield from self._examples(request, method, context)
            fill(response.result, outputs, rows)
            proto_codec.fill_spec(response.model_spec, served.name, served.version, signature_name)
            return response, served

        return self.calls.run(context, f"/{PREDICTION_SERVICE}/{method.capitalize()}", work, response, f"tfserving_{method}",
                              request.model_spec.name)

    def MultiInference(self, request: Any, context: grpc.ServicerContext) -> Any:
        """TF Serving's MultiInference: classify/regress tasks of one model on one input (multi_inference.cc's checks)."""
        response = self.apis.inference_pb2.MultiInferenceResponse()

        def work() -> Steps[tuple[Any, ModelVersion]]:
            # multi_inference_helper.cc: the first task's model_spec picks the servable (none: an empty spec)
            first = request.tasks[0].model_spec if request.tasks else self.apis.model_pb2.ModelSpec()
            served = resolve(self.calls, first)
            envelope.serving(served)
            started = time.perf_counter()
            tasks = multi_inference_checked(served, request.tasks)
            serialized = proto_codec.serialized_examples(request.input, served.config.max_request_rows)
            if capture.ON:
                capture.grpc_inputs(measure.current(), {"inputs": serialized})
            results = yield from multi_inference_steps(served, tasks, serialized, started, timeout_for(context, served))
            if capture.ON:  # each task's outputs under "<signature>/<output>"
                capture.grpc_outputs(measure.current(), {f"{signature.name}/{key}": array for (signature, _), outputs
                                                         in zip(tasks, results) for key, array in outputs.items()}, [])
            for task, (signature, method), outputs in zip(request.tasks, tasks, results):
                result = response.results.add()
                fill = proto_codec.fill_classifications if method == "classify" else proto_codec.fill_regressions
                fill(result.classification_result if method == "classify" else result.regression_result, outputs,
                     len(serialized))
                proto_codec.fill_spec(result.model_spec, task.model_spec.name, served.version, signature.name)
            return response, served

        name = request.tasks[0].model_spec.name if request.tasks else ""
        return self.calls.run(context, f"/{PREDICTION_SERVICE}/MultiInference", work, response,
                              "tfserving_multi_inference", name)

    def GetModelMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = self.apis.get_model_metadata_pb2.GetModelMetadataResponse()

        def work() -> tuple[Any, ModelVersion]:
            spec = model_spec(request)  # TF Serving's order and words (get_model_metadata_impl.cc)
            fields = list(request.metadata_field)
            if not fields:
                raise InvalidArgument("GetModelMetadataRequest must specify at least one metadata_field")
            for field in fields:
                if field != "signature_def":
                    raise InvalidArgument(f"Metadata field {field} is not supported")
            served = resolve(self.calls, spec)
            signature_map = self.apis.get_model_metadata_pb2.SignatureDefMap()
            proto_codec.signature_def_map(served.servable.signature_defs, signature_map)
            response.metadata["signature_def"].Pack(signature_map)
            proto_codec.fill_spec(response.model_spec, served.name, served.version, "")
            response.model_spec.ClearField("signature_name")
            return response, served

        return self.calls.run(context, f"/{PREDICTION_SERVICE}/GetModelMetadata", work, response)


class ModelService:
    """GetModelStatus, and HandleReloadConfigRequest on a server started with TF Serving's model configuration."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.apis = messages.apis()

    def GetModelStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = self.apis.get_model_status_pb2.GetModelStatusResponse()

        def work() -> tuple[Any, None]:
            spec = request.model_spec
            choice = spec.WhichOneof("version_choice")
            statuses = tfserving_statuses(self.calls.registry, model_name(spec),
                                          spec.version.value if choice == "version" else None,
                                          spec.version_label if choice == "version_label" else None)
            for status in statuses:
                entry = response.model_version_status.add()
                entry.version = int(status["version"])
                entry.state = STATES.get(status["state"], 0)
                entry.status.error_code = ERROR_CODES.get(status["status"]["error_code"], ERROR_CODES["UNKNOWN"])
                entry.status.error_message = status["status"]["error_message"]
            return response, None

        return self.calls.run(context, f"/{MODEL_SERVICE}/GetModelStatus", work, response)

    def HandleReloadConfigRequest(self, request: Any, context: grpc.ServicerContext) -> Any:
        """The ModelServerConfig replaces the served set through the readiness-gated rollout (server.dataplane.repository)."""
        response = self.apis.model_management_pb2.ReloadConfigResponse()

        def work() -> Steps[tuple[Any, None]]:
            text = text_format.MessageToString(request.config)
            yield from repository.reload_config(Settings.current(), text, context.peer())
            response.status.error_code = 0
            return response, None

        return self.calls.run(context, f"/{MODEL_SERVICE}/HandleReloadConfigRequest", work, response)


def services(calls: Calls) -> list[tuple[Any, Any]]:
    """(service descriptor, servicer) of PredictionService and ModelService (server.rpc.transport registers them)."""
    apis = messages.apis()
    return [(apis.prediction_service_pb2.DESCRIPTOR.services_by_name["PredictionService"], PredictionService(calls)),
            (apis.model_service_pb2.DESCRIPTOR.services_by_name["ModelService"], ModelService(calls))]
