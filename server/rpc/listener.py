"""This worker's grpcio server: created after the models are warm, stopped with the worker (GOAWAY, then a grace).

Runs in a worker only (server.worker.hooks starts it, server.worker.gthread stops it). Every worker
binds the same FORKSERVE_GRPC_BIND with SO_REUSEPORT (grpcio's default on Linux); the kernel spreads
new connections over them, and the master has made sure no other process holds the port.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from server.rpc import tfserving, v2
from server.rpc.calls import Calls
from server.rpc.health import ModelHealth
from server.settings import Settings
from server.worker.registry import ModelRegistry

log = logging.getLogger("forkserve.grpc")


class GrpcListener:
    """One grpcio server with TF Serving's services, V2's, health and reflection."""

    def __init__(self, registry: ModelRegistry, settings: Settings, access_line: Callable[[str], None] | None) -> None:
        self.registry = registry
        self.settings = settings
        self.calls = Calls(registry, access_line)
        self.health = ModelHealth(registry)
        self.server: grpc.Server | None = None
        self.stopped: threading.Event | None = None

    def options(self) -> list[tuple[str, int]]:
        """Channel arguments: REST's body limit for messages, SO_REUSEPORT, and a maximum connection age."""
        options = [
            ("grpc.max_receive_message_length", self.settings.max_body_bytes),
            ("grpc.max_send_message_length", self.settings.max_body_bytes),
            ("grpc.so_reuseport", 1),
        ]
        age = self.settings.grpc_max_connection_age
        if age > 0:
            # NOTE: HTTP/2 channels are long-lived, so a client stays on the worker it first reached.
            # Past this age the worker sends GOAWAY and the client reconnects, hashed anew over the workers.
            options += [("grpc.max_connection_age_ms", int(age * 1000)),
                        ("grpc.max_connection_age_grace_ms", int(self.settings.grpc_max_connection_age_grace * 1000))]
        return options

    def start(self) -> None:
        """Bind and serve; raises RuntimeError naming the address when the port cannot be bound."""
        server = grpc.server(ThreadPoolExecutor(max_workers=self.settings.threads, thread_name_prefix="forkserve-grpc"),
                             options=self.options(), maximum_concurrent_rpcs=self.settings.threads * 8)
        names = tfserving.add_to_server(self.calls, server) + v2.add_to_server(self.calls, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        names.append(health_pb2.DESCRIPTOR.services_by_name["Health"].full_name)
        reflection.enable_server_reflection(names + [reflection.SERVICE_NAME], server)
        try:
            port = server.add_insecure_port(self.settings.grpc_bind)
        except RuntimeError as exc:
            raise RuntimeError(f"cannot listen for gRPC on {self.settings.grpc_bind}: {exc}") from None
        if not port:
            raise RuntimeError(f"cannot listen for gRPC on {self.settings.grpc_bind}")
        server.start()
        self.server = server
        self.health.refresh()

    def stop(self, grace: float) -> threading.Event:
        """Stop accepting, send GOAWAY, give calls in flight `grace` seconds; the event is set when all are done."""
        if self.stopped is None:
            self.health.enter_graceful_shutdown()
            self.stopped = self.server.stop(grace) if self.server is not None else _set_event()
        return self.stopped


def _set_event() -> threading.Event:
    event = threading.Event()
    event.set()
    return event
