"""grpc.health.v1.Health for Kubernetes' gRPC probe: the server ("") as /readyz says, each model by its name.

Runs on the listener's event loop (server.rpc.listener), never on the pool that inference calls
use: a worker whose every pool thread is busy, or whose call slots are all taken, still answers
its probes. No state is kept per service name: a Watch on a name nobody serves costs its own
stream, and nothing once the stream ends (grpc_health's servicer kept an entry per name for ever).
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import grpc
from grpc_health.v1 import health_pb2

from server.models.registry import ModelRegistry
from server.rpc.transport import Capacity, first_message

SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
MAX_REQUEST_BYTES = 1024  # a HealthCheckRequest names a model: parsed on the loop, so a few bytes only
WATCH_INTERVAL = 1.0  # seconds between a Watch stream's looks at the registry
MAX_WATCHES = 64  # Watch streams at once per worker; more are refused (RESOURCE_EXHAUSTED)


class ModelHealth:
    """Check answers from the registry at call time; Watch sends each change, polling; NOT_SERVING once stopping."""

    def __init__(self, registry: ModelRegistry, capacity: Capacity) -> None:
        self.registry = registry
        self.capacity = capacity
        self.stopping = False
        self.watches = 0
        self._changed: asyncio.Event | None = None  # created on the loop (start)

    def start(self) -> None:
        """Loop thread: ready to serve."""
        self._changed = asyncio.Event()

    def enter_graceful_shutdown(self) -> None:
        """Loop thread: every name NOT_SERVING from now on; Watch streams hear it at once."""
        self.stopping = True
        if self._changed is not None:
            self._changed.set()

    def statuses(self) -> dict[str, int]:
        """"" (the worker) and every model the registry reports, SERVING while a version of it serves."""
        ready, report = self.registry.readiness()
        return {"": SERVING if ready else NOT_SERVING,
                **{name: SERVING if entry["serving"] else NOT_SERVING for name, entry in report.items()}}

    def status_of(self, service: str) -> int | None:
        """One name's status now (None: no such name)."""
        if self.stopping:
            return NOT_SERVING
        return self.statuses().get(service)

    async def _request(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
        """The HealthCheckRequest, within the receive deadline and MAX_REQUEST_BYTES."""
        raw = await first_message(requests, context, self.capacity, counted=False)
        if len(raw) > MAX_REQUEST_BYTES:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"a HealthCheckRequest over {MAX_REQUEST_BYTES} bytes")
        try:
            return health_pb2.HealthCheckRequest.FromString(raw)
        except Exception:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the request is not a valid grpc.health.v1.HealthCheckRequest")

    async def check(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
        request = await self._request(requests, context)
        status = self.status_of(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no model named {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status).SerializeToString()

    async def watch(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """The status now, then each change (SERVICE_UNKNOWN while no such name), until the client leaves."""
        request = await self._request(requests, context)
        if self.watches >= MAX_WATCHES:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"too many Watch streams here ({MAX_WATCHES})")
        self.watches += 1
        try:
            sent = None
            while True:
                status = self.status_of(request.service)
                status = SERVICE_UNKNOWN if status is None else status
                if status != sent:
                    yield health_pb2.HealthCheckResponse(status=status).SerializeToString()
                    sent = status
                assert self._changed is not None
                try:
                    await asyncio.wait_for(self._changed.wait(), WATCH_INTERVAL)  # NOTE: no shield: a timed-out wait must go
                except asyncio.TimeoutError:
                    pass
        finally:
            self.watches -= 1

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        """Check and Watch, both reading their message with the receive deadline."""
        return {"Check": grpc.stream_unary_rpc_method_handler(self.check),
                "Watch": grpc.stream_stream_rpc_method_handler(self.watch)}
