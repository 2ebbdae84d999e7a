"""inference.GRPCInferenceService (Open Inference Protocol V2): health, metadata and ModelInfer over gRPC."""

from __future__ import annotations

import time
from typing import Any

import grpc

from server.dataplane import envelope
from server.dataplane.models import v2_model_metadata, v2_model_ready, v2_server_metadata
from server.dataplane.requests import model_address
from server.errors import InvalidArgument
from server.models.flow import Steps
from server.models.registry import ModelVersion
from server.protocols.v2 import messages, proto_codec
from server.protocols.v2.json_codec import v2_datatype
from server.rpc.calls import Calls, predict_tensors
from server.signature import DEFAULT_SIGNATURE
from server.telemetry import measure

SERVICE = "inference.GRPCInferenceService"


class InferenceService:
    """The protocol's six core calls; Triton's extensions answer UNIMPLEMENTED (no method registered)."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.messages = messages.protos()

    def _served(self, name: str, version: str) -> ModelVersion:
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
            ready, served, _ = v2_model_ready(self.calls.registry, *model_address(request.name, request.version or None))
            return self.messages.ModelReadyResponse(ready=ready), served

        return self.calls.run(context, f"/{SERVICE}/ModelReady", work, self.messages.ModelReadyResponse())

    def ServerMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = self.messages.ServerMetadataResponse(**v2_server_metadata([]))
        return self.calls.run(context, f"/{SERVICE}/ServerMetadata", lambda: (response, None), response)

    def ModelMetadata(self, request: Any, context: grpc.ServicerContext) -> Any:
        def work() -> tuple[Any, ModelVersion]:
            served = self._served(request.name, request.version)
            return self.messages.ModelMetadataResponse(**v2_model_metadata(self.calls.registry, served)), served

        return self.calls.run(context, f"/{SERVICE}/ModelMetadata", work, self.messages.ModelMetadataResponse())

    def ModelInfer(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = self.messages.ModelInferResponse()

        def work() -> Steps[tuple[Any, ModelVersion]]:
            served = self._served(request.model_name, request.model_version)
            envelope.serving(served)
            started = time.perf_counter()
            parameters = request.parameters
            signature_name = (parameters["signature_name"].string_param if "signature_name" in parameters
                              else DEFAULT_SIGNATURE)
            signature = served.signature(signature_name)
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
                inputs[tensor.name] = proto_codec.to_array(tensor, raw[index] if raw else None, info,
                                                          served.config.max_request_rows)
            if not inputs:
                raise InvalidArgument("'inputs' is empty: send at least one input tensor")
            wanted = [output.name for output in request.outputs]
            for index, name in enumerate(wanted):
                if name not in signature.outputs:
                    raise InvalidArgument(f"unknown output {name!r}; the model gives {sorted(signature.outputs)}")
                if name in wanted[:index]:
                    raise InvalidArgument(f"output {name!r} is requested twice")
            outputs = yield from predict_tensors(served, signature.name, inputs, wanted, started, context)
            started = time.perf_counter()
            response.model_name = served.name
            response.model_version = str(served.version)
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
                      or not all(proto_codec.has_contents_field(datatype) for _, datatype, _ in answered))
            for name, datatype, array in answered:
                tensor = response.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
                if as_raw:
                    response.raw_output_contents.append(proto_codec.raw_bytes(array))
                else:
                    proto_codec.fill_contents(array, datatype, tensor.contents)
            measure.stage("encode", time.perf_counter() - started)
            return response, served

        return self.calls.run(context, f"/{SERVICE}/ModelInfer", work, response, "v2_infer", request.model_name)


def services(calls: Calls) -> list[tuple[Any, Any]]:
    """(service descriptor, servicer) of the V2 service (server.rpc.transport registers it)."""
    protos = messages.protos()
    return [(protos.DESCRIPTOR.services_by_name["GRPCInferenceService"], InferenceService(calls))]
