"""This worker's grpc.aio servers: created after the models are warm, on an event loop thread; stopped with the worker.

Runs in a worker only (server.worker.hooks starts it, server.worker.gthread stops it). Every worker
binds the same FORKSERVE_GRPC_BIND with SO_REUSEPORT (grpcio's default on Linux); the kernel spreads
new connections over the listening sockets, and the master owns the port for this instance
(server.master.grpc_port). Each worker runs up to SHARDS servers on it, on one event loop, sharing
one thread pool, the call caps and the health state, so that it can stop listening on part of them
(server.rpc.balance). How a call is admitted and run: server.rpc.transport.

NOTE: grpcio's stop() is not lossless under load: grpc-core cancels the calls that arrived but were
not yet handed to a handler (clients see CANCELLED, grpc/grpc#41785). A worker therefore leaves in
two steps: it stops listening (server.rpc.sockets.pause), lets max_connection_age's graceful GOAWAY
move every client to other workers, and only then stops its servers, with no connection left.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import grpc
import uvloop
from grpc_reflection.v1alpha import reflection

from server import connection_board
from server.models.registry import ModelRegistry
from server.rpc import balance, sockets, tfserving, tls, transport, v2
from server.rpc.calls import Calls
from server.rpc.health import SERVICE as HEALTH_SERVICE
from server.rpc.health import ModelHealth
from server.settings import Settings, split_address
from server.telemetry import metrics

log = logging.getLogger("forkserve.grpc")


SHARDS = 4  # grpcio servers per worker, each with its own listening socket: a worker's weight in the kernel's spread
BALANCE_INTERVAL = 0.5  # seconds between a worker's looks at the board
COOLDOWN = 1.0  # seconds between two changes of a worker's listening shards
START_TIMEOUT = 60.0  # seconds start() waits for the loop to bind and start every shard
MAX_RECEIVING = 1024  # calls that may wait for their message at once (each holds what HTTP/2 flow control let it send)


class Shard:
    """One grpcio server with every service on the shared port: its listening sockets, the connections that carry calls."""

    def __init__(self, server: grpc.aio.Server, peers: balance.ActivePeers, fds: set[int]) -> None:
        self.server = server
        self.peers = peers
        self.fds = fds
        self.paused_at: float | None = None  # when it stopped listening; it serves its connections until they leave


class GrpcListener:
    """Up to SHARDS grpc.aio servers with TF Serving's services, V2's, health and reflection, on one event loop thread."""

    def __init__(self, registry: ModelRegistry, settings: Settings, access_line: Callable[[str], None] | None,
                 slot: int | None = None) -> None:
        self.registry = registry
        self.settings = settings
        self.calls = Calls(registry, access_line)
        working = settings.grpc_max_calls or 2 * settings.threads
        self.capacity = transport.Capacity(max_receiving=MAX_RECEIVING, max_working=working,
                                           receive_timeout=settings.client_timeout)
        self.health = ModelHealth(registry, self.capacity)
        for reason in metrics.GRPC_REFUSAL_REASONS:  # at 0 from the start, so rate() sees the first refusal
            metrics.record(lambda reason=reason: metrics.GRPC_REFUSED_CALLS.labels(reason))
        self.slot = slot  # this worker's slot on server.connection_board (None: no balancing)
        self.port = split_address(settings.grpc_bind)[1]
        self.shards: list[Shard] = []
        self.stopping: list[asyncio.Future[Any]] = []  # paused shards' stop(), calls still finishing
        self.stopped = threading.Event()  # set once every call has finished after stop()
        self._stop_claimed = threading.Lock()  # taken once, without blocking, by the first stop()
        self._pool = ThreadPoolExecutor(max_workers=settings.threads, thread_name_prefix="forkserve-grpc")
        # NOTE: uvloop, not asyncio's own loop: its loop machinery is C; measured 10-20 % less worker CPU per call (bench.grpc_ab)
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="forkserve-grpc-loop", daemon=True)
        self.balancing = slot is not None and connection_board.GRPC_BOARD is not None
        self.credentials = tls.server_credentials(settings)  # None: plaintext (h2c)

    @property
    def stopping_now(self) -> bool:
        return self._stop_claimed.locked()

    def call_grace(self) -> float:
        """Seconds a call may still run on a connection told to leave (its GOAWAY, a paused shard's stop).

        NOTE: the connection closes then, calls still on it or not: the grace covers the longest call a
        model allows (request_timeout_s), or such calls would fail over gRPC only, and a load, unload or
        HandleReloadConfigRequest, which waits for a whole rollout.
        """
        longest = max((m.config.request_timeout_s for m in self.registry.models.values()), default=0.0)
        if self.settings.model_control == "explicit" or self.settings.tfserving:
            longest = max(longest, self.settings.repository_timeout)
        return max(self.settings.grpc_max_connection_age_grace, longest + 5.0)

    def options(self) -> list[tuple[str, int]]:
        """Channel arguments: REST's body limit for requests, SO_REUSEPORT, and a maximum connection age.

        NOTE: answers are not limited, as REST's are not (a client's own receive limit, 4 MiB by default in grpcio, applies).
        """
        options = [
            ("grpc.max_receive_message_length", self.settings.max_body_bytes),
            ("grpc.so_reuseport", 1),
        ]
        age = self.settings.grpc_max_connection_age
        if age > 0:
            # NOTE: HTTP/2 channels are long-lived, so a client stays on the worker it first reached.
            # Past this age the worker sends GOAWAY (twice, with a ping between: no call is lost) and
            # the client reconnects at its next call, to a socket that listens.
            options += [("grpc.max_connection_age_ms", int(age * 1000)),
                        ("grpc.max_connection_age_grace_ms", int(self.call_grace() * 1000))]
        return options

    def _run_loop(self) -> None:
        """Loop thread: the event loop every shard, call and health check runs on, for the worker's life."""
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> None:
        """Bind and serve every shard; raises RuntimeError naming the address when the port cannot be bound."""
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(self._start(), self.loop)
        try:
            started.result(START_TIMEOUT)
        except BaseException:
            started.cancel()
            self.loop.call_soon_threadsafe(self.loop.stop)
            raise

    async def _start(self) -> None:
        self.health.start()
        try:
            for _ in range(SHARDS):
                shard = await self._new_shard()
                self.shards.append(shard)
                if self.stopping_now:  # NOTE: a stop that came while the shards started must not find one listening
                    await self._pause(shard, time.monotonic())
        except BaseException:
            for shard in self.shards:  # NOTE: a worker that reports not ready must not serve gRPC on part of its shards
                await shard.server.stop(0)
            self.shards.clear()
            raise
        if self.balancing:
            self.loop.create_task(self._balance())

    def _services(self) -> list[tuple[Any, Any]]:
        """(service descriptor, servicer) of every inference and status service."""
        return tfserving.services(self.calls) + v2.services(self.calls)

    async def _new_shard(self) -> Shard:
        """Loop thread: one more server listening on the port, started."""
        peers = balance.ActivePeers()
        server = grpc.aio.server(options=self.options())
        noted = peers.note if self.balancing else None
        services = self._services()
        for service, servicer in services:
            transport.register(server, service.full_name, transport.method_handlers(
                service, servicer, self.capacity, self._pool, self.calls.refuse, noted))
        transport.register(server, HEALTH_SERVICE, self.health.handlers())
        names = [service.full_name for service, _ in services] + [HEALTH_SERVICE, reflection.SERVICE_NAME]
        reflection.enable_server_reflection(names, server)
        before = sockets.listening(self.port)
        try:
            if self.credentials is not None:
                port = server.add_secure_port(self.settings.grpc_bind, self.credentials)
            else:
                port = server.add_insecure_port(self.settings.grpc_bind)
        except RuntimeError as exc:
            raise RuntimeError(f"cannot listen for gRPC on {self.settings.grpc_bind}: {exc}") from None
        if not port:
            raise RuntimeError(f"cannot listen for gRPC on {self.settings.grpc_bind}")
        await server.start()
        return Shard(server, peers, sockets.listening(self.port) - before)

    def listening(self) -> list[Shard]:
        """The shards still listening."""
        return [shard for shard in self.shards if shard.paused_at is None]

    async def _balance(self) -> None:
        """Loop thread: publish this worker's active connections; listen on fewer shards above the bound, more below.

        NOTE: a paused shard keeps serving its connections; each leaves at its max_connection_age and
        reconnects to a listening socket, now less likely one of this worker's. A worker always keeps
        one shard listening, so some socket of the group always accepts.
        """
        board, slot = connection_board.GRPC_BOARD, self.slot
        assert board is not None and slot is not None
        changed = 0.0
        while not self.stopping_now:
            await asyncio.sleep(BALANCE_INTERVAL)
            try:
                changed = await self._balance_once(board, slot, changed)
            except Exception:  # NOTE: a surprise (/proc unreadable) costs one look, not balancing for the worker's life
                log.exception("gRPC: balancing failed once")

    async def _balance_once(self, board: connection_board.ConnectionBoard, slot: int, changed: float) -> float:
        """One look at the board: publish, pause or add a shard, stop paused shards whose connections have all left."""
        if self.stopping_now:
            return changed
        now = time.monotonic()
        active = sum(shard.peers.active() for shard in self.shards)
        board.publish(slot, active)
        counts = board.counts()
        limit = balance.bound(counts)
        listening = self.listening()
        if limit is not None and now - changed > COOLDOWN:
            if active > limit and len(listening) > 1:
                await self._pause(listening[-1], now)
                changed = now
                log.info("gRPC: %d active connections here, %s on the board (bound %d): "
                         "stopped listening on one socket of %d", active, counts, limit, len(listening))
            elif (active <= sum(counts) // len(counts) or active == 0) and len(listening) < SHARDS:
                await self._add_shard()
                changed = now
        elif limit is None and len(listening) < SHARDS and now - changed > COOLDOWN:
            await self._add_shard()
            changed = now
        self.stopping = [stop for stop in self.stopping if not stop.done()]
        # NOTE: a stop cancels calls just arriving (grpc/grpc#41785): a paused shard stops only once every
        # connection it held has had its GOAWAY (one connection age, +10 % jitter) and none carried a call since.
        settled = self.settings.grpc_max_connection_age * 1.1 + 1.0
        for shard in [s for s in self.shards if s.paused_at is not None and now - s.paused_at > settled]:
            if shard.peers.active() == 0:
                self.shards.remove(shard)
                self.stopping.append(asyncio.ensure_future(shard.server.stop(self.call_grace())))
        return changed

    async def _pause(self, shard: Shard, now: float) -> None:
        """Stop listening on `shard`'s sockets once what is queued on them is accepted; it serves its connections until they leave."""
        shard.paused_at = now
        await sockets.pause(shard.fds)

    async def _add_shard(self) -> None:
        """One more shard listening (its log says why when the port refuses it)."""
        try:
            shard = await self._new_shard()
        except RuntimeError as exc:  # NOTE: the listening shards keep serving; this worker just weighs less
            log.error("gRPC: another server on the port could not start: %s", exc)
            return
        self.shards.append(shard)
        if self.stopping_now:  # NOTE: stop() came while it started: it must not listen through the drain
            await self._pause(shard, time.monotonic())

    def stop(self, grace: float) -> threading.Event:
        """Stop listening at once; once the clients have moved (max_connection_age), stop the servers with `grace`.

        The event is set when every call has finished, within `grace` seconds.
        NOTE: signal handlers call this on the main thread, so it never blocks: the first call claims
        the stop without waiting and hands it to the loop; any later call (a second signal arriving
        inside the first) returns the same event at once.
        """
        if not self._stop_claimed.acquire(blocking=False):
            return self.stopped
        if not self._thread.is_alive():
            self.stopped.set()
            return self.stopped
        try:
            self.loop.call_soon_threadsafe(self._begin_stop, grace)
        except RuntimeError:  # the loop is closed: nothing serves
            self.stopped.set()
        return self.stopped

    def _begin_stop(self, grace: float) -> None:
        """Loop thread: NOT_SERVING, out of the board, every listening socket paused, then the drain."""
        self.health.enter_graceful_shutdown()
        if self.slot is not None and connection_board.GRPC_BOARD is not None:
            connection_board.GRPC_BOARD.release(self.slot)
        self.loop.create_task(self._drain(grace, self.listening()))

    async def _drain(self, grace: float, listening: list[Shard]) -> None:
        """Loop thread: stop listening, wait for the connections to leave (at most one connection age, within `grace`), then stop."""
        started = time.monotonic()
        try:
            await asyncio.gather(*(self._pause(shard, started) for shard in listening))
            age = self.settings.grpc_max_connection_age
            drain = min(grace, age * 1.1 + 1.0) if age > 0 and grace > 0 else 0.0  # NOTE: grpc-core jitters the age by +-10 %
            while time.monotonic() - started < drain and sockets.connections(self.port) > 0:
                await asyncio.sleep(0.05)
        except Exception:  # NOTE: /proc unreadable: stop now rather than never (the event must be set)
            log.exception("gRPC: waiting for the connections to leave failed")
        finally:
            remaining = max(0.0, grace - (time.monotonic() - started))
            try:
                await asyncio.gather(*(shard.server.stop(remaining) for shard in self.shards), *self.stopping,
                                     return_exceptions=True)
            finally:
                self.stopped.set()
