"""grpc.health.v1.Health for Kubernetes' gRPC probe: the server ("") as /readyz says, each model by its name."""

from __future__ import annotations

from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2

from server.worker.registry import ModelRegistry

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class ModelHealth(health.HealthServicer):
    """Check answers from the registry at call time; Watch streams the statuses Check and shutdown set."""

    def __init__(self, registry: ModelRegistry) -> None:
        super().__init__(experimental_non_blocking=True)
        self.registry = registry

    def statuses(self) -> dict[str, int]:
        """"" (the worker) and every model the registry reports, SERVING while a version of it serves."""
        ready, report = self.registry.readiness()
        return {"": SERVING if ready else NOT_SERVING,
                **{name: SERVING if entry["serving"] else NOT_SERVING for name, entry in report.items()}}

    def refresh(self) -> dict[str, int]:
        """The current statuses, also set on the base servicer (Watch streams hear of changes)."""
        statuses = self.statuses()
        for service, status in statuses.items():
            if self._server_status.get(service) != status:
                self.set(service, status)
        return statuses

    def Check(self, request: Any, context: grpc.ServicerContext) -> Any:
        if self._gracefully_shutting_down:  # NOTE: the worker is stopping: every name NOT_SERVING, whatever loaded
            return health_pb2.HealthCheckResponse(status=NOT_SERVING)
        status = self.refresh().get(request.service)
        if status is None:
            context.set_code(grpc.StatusCode.NOT_FOUND)
            context.set_details(f"no model named {request.service!r}")
            return health_pb2.HealthCheckResponse()
        return health_pb2.HealthCheckResponse(status=status)
