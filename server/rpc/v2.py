"""inference.GRPCInferenceService (Open Inference Protocol V2): health, metadata, ModelInfer and Triton's extensions over gRPC."""

from __future__ import annotations

import time
from typing import Any

import grpc
from google.protobuf import json_format

from server.dataplane import envelope
from server.dataplane.models import v2_model_config, v2_model_metadata, v2_model_ready, v2_server_metadata
from server.dataplane.requests import model_address
from server.dataplane import repository
from server.dataplane.statistics import v2_statistics
from server.models.flow import Steps, detached
from server.models.registry import ModelVersion
from server.protocols.v2 import messages, proto_codec
from server.rpc.calls import Calls, predict_tensors
from server.settings import Settings
from server.telemetry import measure

SERVICE = "inference.GRPCInferenceService"
STATISTICS_TIMEOUT = 30.0  # seconds a statistics call may wait for the metric files


class InferenceService:
    """The protocol's core calls and Triton's configuration, statistics and repository extensions (others: UNIMPLEMENTED)."""

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

    def ModelConfig(self, request: Any, context: grpc.ServicerContext) -> Any:
        def work() -> tuple[Any, ModelVersion]:
            served = self._served(request.name, request.version)
            config = json_format.ParseDict(v2_model_config(served), self.messages.ModelConfig())
            return self.messages.ModelConfigResponse(config=config), served

        return self.calls.run(context, f"/{SERVICE}/ModelConfig", work, self.messages.ModelConfigResponse())

    def ModelStatistics(self, request: Any, context: grpc.ServicerContext) -> Any:
        def work() -> Steps[tuple[Any, None]]:
            number = model_address(request.name, request.version or None)[1] if request.name else None
            # NOTE: off the event loop: reading the metric files waits for the master's folding of a dead worker's
            found = yield from detached(lambda: v2_statistics(self.calls.registry, request.name, number), STATISTICS_TIMEOUT)
            return json_format.ParseDict(found, self.messages.ModelStatisticsResponse()), None

        return self.calls.run(context, f"/{SERVICE}/ModelStatistics", work, self.messages.ModelStatisticsResponse())

    def RepositoryIndex(self, request: Any, context: grpc.ServicerContext) -> Any:
        def work() -> tuple[Any, None]:
            entries = repository.repository_index(self.calls.registry, Settings.current(), request.ready, context.peer())
            return self.messages.RepositoryIndexResponse(models=entries), None

        return self.calls.run(context, f"/{SERVICE}/RepositoryIndex", work, self.messages.RepositoryIndexResponse())

    def RepositoryModelLoad(self, request: Any, context: grpc.ServicerContext) -> Any:
        def work() -> Steps[tuple[Any, None]]:
            parameters = {key: getattr(value, value.WhichOneof("parameter_choice") or "string_param")
                          for key, value in request.parameters.items()}
            config = repository.load_config_parameter(parameters)
            yield from repository.change(Settings.current(), "load", request.model_name, config, context.peer())
            return self.messages.RepositoryModelLoadResponse(), None

        return self.calls.run(context, f"/{SERVICE}/RepositoryModelLoad", work, self.messages.RepositoryModelLoadResponse())

    def RepositoryModelUnload(self, request: Any, context: grpc.ServicerContext) -> Any:
        def work() -> Steps[tuple[Any, None]]:
            yield from repository.change(Settings.current(), "unload", request.model_name, None, context.peer())
            return self.messages.RepositoryModelUnloadResponse(), None

        return self.calls.run(context, f"/{SERVICE}/RepositoryModelUnload", work,
                              self.messages.RepositoryModelUnloadResponse())

    def ModelInfer(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = self.messages.ModelInferResponse()

        def work() -> Steps[tuple[Any, ModelVersion]]:
            served = self._served(request.model_name, request.model_version)
            envelope.serving(served)
            started = time.perf_counter()
            signature = served.signature(proto_codec.signature_name(request))
            inputs = proto_codec.decode_inputs(request, signature, served.config.max_request_rows)
            wanted = proto_codec.requested_outputs(request, signature)
            outputs = yield from predict_tensors(served, signature.name, inputs, wanted, started, context)
            started = time.perf_counter()
            proto_codec.encode_response(request, response, served.name, served.version, signature, outputs, wanted)
            measure.stage("encode", time.perf_counter() - started)
            return response, served

        return self.calls.run(context, f"/{SERVICE}/ModelInfer", work, response, "v2_infer", request.model_name)


def services(calls: Calls) -> list[tuple[Any, Any]]:
    """(service descriptor, servicer) of the V2 service (server.rpc.transport registers it)."""
    protos = messages.protos()
    return [(protos.DESCRIPTOR.services_by_name["GRPCInferenceService"], InferenceService(calls))]
