"""server.rpc.health on a real grpc.aio server in this process: Check, Watch, shutdown, and no state kept per name."""

from __future__ import annotations

import asyncio
import gc
import threading
import tracemalloc
from typing import Any, Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from server.rpc import transport
from server.rpc.health import MAX_REQUEST_BYTES, ModelHealth
from server.rpc.health import SERVICE as HEALTH_SERVICE

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class Registry:
    """What ModelHealth reads of a worker's registry: readiness() (a worker that serves `mlp` and not `broken`)."""

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        return True, {"mlp": {"serving": [1]}, "broken": {"serving": []}}


class Running:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        capacity = transport.Capacity(max_receiving=16, max_working=2, receive_timeout=1.0)
        self.health = ModelHealth(Registry(), capacity)  # type: ignore[arg-type]
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = health_pb2_grpc.HealthStub(self.channel)

    async def _start(self) -> int:
        self.health.start()
        self.server = grpc.aio.server()
        transport.register(self.server, HEALTH_SERVICE, self.health.handlers())
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return port

    def stop(self) -> None:
        self.channel.close()
        asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture()
def running() -> Iterator[Running]:
    instance = Running()
    yield instance
    instance.stop()


@pytest.mark.parametrize("service,status", [("", SERVING), ("mlp", SERVING), ("broken", NOT_SERVING)])
def test_check_answers_from_the_registry(running: Running, service: str, status: int) -> None:
    assert running.stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status == status


def test_check_of_an_unknown_name_is_not_found_and_an_oversized_request_invalid(running: Running) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        running.stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as caught:
        running.stub.Check(health_pb2.HealthCheckRequest(service="x" * MAX_REQUEST_BYTES), timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_watch_sends_the_status_then_not_serving_at_once_when_the_worker_stops(running: Running) -> None:
    stream = running.stub.Watch(health_pb2.HealthCheckRequest(service="mlp"), timeout=10)
    assert next(stream).status == SERVING
    running.loop.call_soon_threadsafe(running.health.enter_graceful_shutdown)
    assert next(stream).status == NOT_SERVING
    stream.cancel()


def test_watches_on_names_nobody_serves_leave_nothing_behind(running: Running) -> None:
    """grpc_health's servicer kept an entry per watched name for ever: 400 names of 900 bytes, 360 KB never freed."""

    def watch_once(number: int) -> None:
        stream = running.stub.Watch(health_pb2.HealthCheckRequest(service=f"{number:04d}" + "n" * 896), timeout=10)
        assert next(stream).status == SERVICE_UNKNOWN
        stream.cancel()

    for number in range(20):  # warm up what grpcio allocates once
        watch_once(number)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for number in range(20, 420):
            watch_once(number)
        for _ in range(2):  # the cancelled streams' ends, and their async generators' closing (at collection)
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0.2), running.loop).result(10)
            gc.collect()
        grown = sum(stat.size_diff for stat in tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
    assert grown < 100_000, grown
    assert running.health.watches == 0
