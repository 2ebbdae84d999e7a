"""This worker's grpcio servers: created after the models are warm, stopped with the worker (GOAWAY, then a grace).

Runs in a worker only (server.worker.hooks starts it, server.worker.gthread stops it). Every worker
binds the same FORKSERVE_GRPC_BIND with SO_REUSEPORT (grpcio's default on Linux); the kernel spreads
new connections over the listening sockets, and the master has made sure no other process holds
the port. Each worker runs SHARDS servers on it, sharing one thread pool and the health state, so
that it can move some of its connections to other workers (server.rpc.balance).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from server import connection_board
from server.rpc import balance, tfserving, v2
from server.rpc.calls import Calls
from server.settings import Settings
from server.worker.registry import ModelRegistry

log = logging.getLogger("forkserve.grpc")


SHARDS = 4  # grpcio servers per worker: the unit a worker's balancer moves is a quarter of its connections
BALANCE_INTERVAL = 0.5  # seconds between a worker's looks at the board
COOLDOWN = balance.WINDOW + 1.0  # after a shed, until every worker's count shows where the clients went
REPLACE_AFTER = 0.2  # a stopped shard's successor listens this much later: its clients reconnect elsewhere first


class Shard:
    """One grpcio server with every service, on the shared port, and the connections that carry its calls."""

    def __init__(self, server: grpc.Server, peers: balance.ActivePeers) -> None:
        self.server = server
        self.peers = peers


class GrpcListener:
    """SHARDS grpcio servers with TF Serving's services, V2's, health and reflection; a balancer thread."""

    def __init__(self, registry: ModelRegistry, settings: Settings, access_line: Callable[[str], None] | None,
                 slot: int | None = None) -> None:
        self.registry = registry
        self.settings = settings
        self.calls = Calls(registry, access_line)
        self.health = health.HealthServicer(experimental_non_blocking=True)
        self.slot = slot  # this worker's slot on server.connection_board (None: no balancing)
        self.shards: list[Shard] = []
        self.draining: list[threading.Event] = []  # shards stopped by the balancer, calls still in flight
        self.sheds = 0
        self.stopped: threading.Event | None = None
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=settings.threads, thread_name_prefix="forkserve-grpc")
        self._balancer: threading.Thread | None = None

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
        """Bind and serve every shard; raises RuntimeError naming the address when the port cannot be bound."""
        try:
            for _ in range(SHARDS):
                self.shards.append(self._new_shard())
        except RuntimeError:
            for shard in self.shards:  # NOTE: a worker that reports not ready must not serve gRPC on part of its shards
                shard.server.stop(0)
            self.shards.clear()
            raise
        self.set_health()
        if self.slot is not None and connection_board.GRPC_BOARD is not None:
            self._balancer = threading.Thread(target=self._balance, name="forkserve-grpc-balance", daemon=True)
            self._balancer.start()

    def _new_shard(self) -> Shard:
        """One more server on the port, started."""
        peers = balance.ActivePeers()
        server = grpc.server(self._executor, options=self.options(), interceptors=(peers,),
                             maximum_concurrent_rpcs=max(2, self.settings.threads * 8 // SHARDS))
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
        return Shard(server, peers)

    def set_health(self) -> None:
        """grpc.health.v1: the server ("") as /readyz says, each model SERVING while a version of it serves."""
        ready, report = self.registry.readiness()
        serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
        self.health.set("", serving if ready else not_serving)
        for name, entry in report.items():
            self.health.set(name, serving if entry["serving"] else not_serving)

    def _balance(self) -> None:
        """Balancer thread: publish this worker's active connections; above the bound, shed one shard's."""
        board, slot = connection_board.GRPC_BOARD, self.slot
        assert board is not None and slot is not None
        quiet_until = 0.0
        while self.stopped is None:
            time.sleep(BALANCE_INTERVAL)
            with self._lock:
                if self.stopped is not None:
                    break
                per_shard = [shard.peers.active() for shard in self.shards]
                board.publish(slot, sum(per_shard))
                counts = board.counts()
                limit = balance.bound(counts)
                if limit is None or sum(per_shard) <= limit or time.monotonic() < quiet_until:
                    continue
                share = -(-sum(counts) // len(counts))
                index = balance.pick_shard(per_shard, sum(per_shard) - share, len(counts))
                if index is None:
                    continue
                shed = self.shards.pop(index)
                self.draining.append(shed.server.stop(self.settings.grpc_max_connection_age_grace))
                self.sheds += 1
            log.info("gRPC: %d active connections here, %s on the board (bound %d): GOAWAY to %d of them",
                     sum(per_shard), counts, limit, per_shard[index])
            time.sleep(REPLACE_AFTER)
            with self._lock:
                if self.stopped is not None:
                    break
                try:
                    self.shards.append(self._new_shard())
                except RuntimeError as exc:  # NOTE: the other shards keep serving; the worker runs with one fewer
                    log.error("gRPC: a replacement server could not start: %s", exc)
            quiet_until = time.monotonic() + COOLDOWN

    def stop(self, grace: float) -> threading.Event:
        """Stop accepting, send GOAWAY, give calls in flight `grace` seconds; the event is set when all are done."""
        with self._lock:
            if self.stopped is None:
                self.health.enter_graceful_shutdown()
                if self.slot is not None and connection_board.GRPC_BOARD is not None:
                    connection_board.GRPC_BOARD.release(self.slot)
                events = [shard.server.stop(grace) for shard in self.shards] + self.draining
                self.stopped = _all_set(events)
        return self.stopped


def _all_set(events: list[threading.Event]) -> threading.Event:
    """An event set once every one of `events` is."""
    done = threading.Event()
    if all(event.is_set() for event in events):
        done.set()
        return done

    def wait() -> None:
        for event in events:
            event.wait()
        done.set()

    threading.Thread(target=wait, name="forkserve-grpc-stopped", daemon=True).start()
    return done
