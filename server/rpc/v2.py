"""inference.GRPCInferenceService (Open Inference Protocol V2): health, metadata and ModelInfer over gRPC."""

from __future__ import annotations

import time
from typing import Any

import grpc

from server.errors import ApiError, InvalidArgument
from server.http import instrument
from server.http.codecs.v2 import tensor_metadata, v2_datatype
from server.http.common import model_address, predict_steps
from server.http.v2 import SERVER_VERSION
from server.rpc import messages, v2_tensors
from server.rpc.calls import Calls, timeout_for
from server.telemetry.payloads import capture
from server.worker.flow import Steps
from server.worker.registry import AVAILABLE, ModelVersion

SERVICE = "inference.GRPCInferenceService"


class InferenceService:
    """The protocol's six core calls; Triton's extensions answer UNIMPLEMENTED (no method registered)."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.messages, _ = messages.v2()

    def _target(self, name: str, version: str) -> ModelVersion:
        name, number = model_address(name, version or None)
        return self.calls.registry.get(name).resolve(number)

    def ServerLive(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self.calls.run(context, f"/{SERVICE}/ServerLive",
                              lambda: (self.messages.ServerLiveResponse(live=True), None), self.messages.ServerLiveResponse())

    def ServerReady(self, request: Any, context: grpc.ServicerContext) -> Any:
        def work() -> tuple[Any, None]:
            ready, _ = self.calls.registry.readiness()
            return self.messages.ServerReadyResponse(ready=ready), None

        return self.calls.run(context, f"/{SERVICE}/ServerReady", work, self.messages.ServerReadyResponse())

    def ModelReady(self, request: Any, context: grpc.ServicerContext) -> Any:
        def work() -> tuple[Any, ModelVersion | None]:
            try:
                target = self._target(request.name, request.version)
            except ApiError as exc:
                if exc.status in (400, 404):  # no such model, or a name or version no model can have
                    raise
                return self.messages.ModelReadyResponse(ready=False), None
            return self.messages.ModelReadyResponse(ready=target.state == AVAILABLE), target

        return self.calls.run(context, f"/{SERVICE}/ModelReady", work, self.messages.ModelReadyResponse())

    def ServerMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = self.messages.ServerMetadataResponse(name="forkserve", version=SERVER_VERSION, extensions=[])
        return self.calls.run(context, f"/{SERVICE}/ServerMetadata", lambda: (response, None), response)

    def ModelMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
        def work() -> tuple[Any, ModelVersion]:
            target = self._target(request.name, request.version)
            signatures = target.servable.signatures
            signature = signatures.get("serving_default") or next(iter(signatures.values()))
            response = self.messages.ModelMetadataResponse(
                name=target.name,
                versions=[str(v.version) for v in self.calls.registry.get(target.name).available()],
                platform=target.servable.platform,
            )
            for kind, tensors in (("inputs", signature.inputs), ("outputs", signature.outputs)):
                for info in tensors.values():
                    getattr(response, kind).add(**tensor_metadata(info))
            return response, target

        return self.calls.run(context, f"/{SERVICE}/ModelMetadata", work, self.messages.ModelMetadataResponse())

    def ModelInfer(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = self.messages.ModelInferResponse()

        def work() -> Steps[tuple[Any, ModelVersion]]:
            target = self._target(request.model_name, request.model_version)
            instrument.set_version(target.version)
            if capture.ON:
                capture.sample(instrument.current(), target)
            started = time.perf_counter()
            parameters = request.parameters
            signature_name = (parameters["signature_name"].string_param if "signature_name" in parameters
                              else "serving_default")
            signature = target.signature(signature_name)
            raw = list(request.raw_input_contents)
            if raw and len(raw) != len(request.inputs):
                raise InvalidArgument(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs; send one per input")
            inputs = {}
            for index, tensor in enumerate(request.inputs):
                info = signature.inputs.get(tensor.name)
                if info is None:
                    raise InvalidArgument(f"unknown input {tensor.name!r}; the model takes {sorted(signature.inputs)}")
                if tensor.name in inputs:
                    raise InvalidArgument(f"input {tensor.name!r} is given twice")
                inputs[tensor.name] = v2_tensors.to_array(tensor, raw[index] if raw else None, info,
                                                          target.config.max_request_rows)
            if not inputs:
                raise InvalidArgument("'inputs' is empty: send at least one input tensor")
            wanted = [output.name for output in request.outputs]
            for index, name in enumerate(wanted):
                if name not in signature.outputs:
                    raise InvalidArgument(f"unknown output {name!r}; the model gives {sorted(signature.outputs)}")
                if name in wanted[:index]:
                    raise InvalidArgument(f"output {name!r} is requested twice")
            if capture.ON:
                capture.grpc_inputs(instrument.current(), inputs)
            _, outputs = yield from predict_steps(target, signature.name, inputs, started, timeout_for(context, target))
            if capture.ON:
                capture.grpc_outputs(instrument.current(), outputs, wanted)
            started = time.perf_counter()
            response.model_name = target.name
            response.model_version = str(target.version)
            response.id = request.id
            answered = []
            for name in wanted or list(outputs):
                array = outputs[name]
                info = signature.outputs.get(name)
                datatype = v2_datatype(info.dtype if info else ("string" if array.dtype == object else array.dtype.name))
                answered.append((name, datatype, array))
            # NOTE: raw outputs when the inputs came raw (as MLServer answers), when asked, and when one output's
            # datatype has no typed field (FP16): the protocol forbids mixing contents and raw_output_contents.
            as_raw = (bool(raw) or (parameters["binary_data_output"].bool_param if "binary_data_output" in parameters
                                    else False)
                      or not all(v2_tensors.has_contents_field(datatype) for _, datatype, _ in answered))
            for name, datatype, array in answered:
                tensor = response.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
                if as_raw:
                    response.raw_output_contents.append(v2_tensors.raw_bytes(array))
                else:
                    v2_tensors.fill_contents(array, datatype, tensor.contents)
            instrument.stage("encode", time.perf_counter() - started)
            return response, target

        return self.calls.run(context, f"/{SERVICE}/ModelInfer", work, response, "v2_infer", request.model_name)


def services(calls: Calls) -> list[tuple[Any, Any]]:
    """(service descriptor, servicer) of the V2 service (server.rpc.transport registers it)."""
    protos, _ = messages.v2()
    return [(protos.DESCRIPTOR.services_by_name["GRPCInferenceService"], InferenceService(calls))]
