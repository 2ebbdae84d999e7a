"""server.rpc.transport on a real grpc.aio server in this process: the receive deadline, the call caps, cancellation, junk."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import grpc
import pytest

from server.rpc import transport
from server.rpc.protos import open_inference_pb2

SERVICE = open_inference_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
LIVE = "/inference.GRPCInferenceService/ServerLive"


class Servicer:
    """ServerLive waits until released (a call at work); ServerReady answers at once; every cancel is noted."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.cancelled = threading.Event()
        self.working = threading.Semaphore(0)

    def ServerLive(self, request: Any, context: transport.CallContext) -> Any:
        context.add_cancel_callback(self.cancelled.set)
        self.working.release()
        self.release.wait(30)
        return open_inference_pb2.ServerLiveResponse(live=context.is_active())

    def ServerReady(self, request: Any, context: transport.CallContext) -> Any:
        context.set_trailing_metadata((("x-answered", "ready"),))
        return open_inference_pb2.ServerReadyResponse(ready=True)

    def ModelReady(self, request: Any, context: transport.CallContext) -> Any:
        context.abort(grpc.StatusCode.NOT_FOUND, f"no model named {request.name!r}")


class Running:
    """An aio server on a loop thread of its own, serving `Servicer` through server.rpc.transport."""

    def __init__(self, max_working: int = 2, receive_timeout: float = 1.0) -> None:
        self.servicer = Servicer()
        self.capacity = transport.Capacity(max_receiving=16, max_working=max_working, receive_timeout=receive_timeout)
        self.refused: list[tuple[str, grpc.StatusCode]] = []
        self.pool = ThreadPoolExecutor(8)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)

    async def _start(self) -> int:
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers([transport.service_handler(
            SERVICE, self.servicer, self.capacity, self.pool, lambda call, method, code, details: self.refused.append((method, code)))])
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return port

    def stop(self) -> None:
        self.servicer.release.set()
        asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.pool.shutdown(wait=False)


@pytest.fixture()
def running() -> Iterator[Running]:
    instance = Running()
    yield instance
    instance.stop()


def call(running: Running, method: str, request: bytes = b"", timeout: float = 10) -> Any:
    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        return channel.unary_unary(method, request_serializer=None, response_deserializer=None).with_call(request, timeout=timeout)


def test_a_unary_call_is_answered_with_its_trailing_metadata(running: Running) -> None:
    answer, info = call(running, "/inference.GRPCInferenceService/ServerReady")
    assert open_inference_pb2.ServerReadyResponse.FromString(answer).ready
    assert ("x-answered", "ready") in info.trailing_metadata()


def test_an_abort_on_the_pool_thread_is_the_call_s_status(running: Running) -> None:
    request = open_inference_pb2.ModelReadyRequest(name="absent").SerializeToString()
    with pytest.raises(grpc.RpcError) as caught:
        call(running, "/inference.GRPCInferenceService/ModelReady", request)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND and "'absent'" in caught.value.details()


def test_bytes_that_are_not_the_message_are_invalid_argument_and_reported(running: Running) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        call(running, "/inference.GRPCInferenceService/ModelReady", b"\x0a\xff\xff\xff\x0f")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid inference.ModelReadyRequest message" in caught.value.details()
    assert running.refused == [("/inference.GRPCInferenceService/ModelReady", grpc.StatusCode.INVALID_ARGUMENT)]


def test_a_method_the_servicer_lacks_is_unimplemented(running: Running) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        call(running, "/inference.GRPCInferenceService/ModelInfer")
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_call_whose_message_never_comes_ends_at_the_receive_deadline(running: Running) -> None:
    release = threading.Event()

    def nothing() -> Iterator[bytes]:
        release.wait(30)
        return
        yield b""

    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        stalled = channel.stream_unary(LIVE, request_serializer=None, response_deserializer=None).future(nothing(), timeout=30)
        try:
            error = stalled.exception(timeout=10)
        finally:
            release.set()
    assert error is not None and error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "did not arrive within 1s" in error.details()
    assert running.capacity.receiving == 0  # its slot was given back


def test_calls_past_the_cap_are_refused_at_once_and_a_cancelled_call_keeps_its_slot_until_its_work_ends(
        running: Running) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        live = channel.unary_unary(LIVE, request_serializer=None, response_deserializer=None)
        first, second = live.future(b"", timeout=30), live.future(b"", timeout=30)
        assert running.servicer.working.acquire(timeout=10) and running.servicer.working.acquire(timeout=10)
        with pytest.raises(grpc.RpcError) as caught:
            live(b"", timeout=10)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "limit of 2" in caught.value.details()
        first.cancel()
        assert running.servicer.cancelled.wait(10)  # the work heard of it (a queued job would be withdrawn)
        with pytest.raises(grpc.RpcError) as caught:  # its pool thread still works: still no room
            live(b"", timeout=10)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        running.servicer.release.set()
        assert open_inference_pb2.ServerLiveResponse.FromString(second.result(timeout=10)).live
        answer = live(b"", timeout=10)  # both slots free again
        assert open_inference_pb2.ServerLiveResponse.FromString(answer).live


def test_a_cancel_callback_added_after_the_cancel_runs_at_once() -> None:
    context = transport.CallContext((), "ipv4:127.0.0.1:1", None)
    context.cancel()
    ran = []
    context.add_cancel_callback(lambda: ran.append(1))
    assert ran == [1] and not context.is_active()


def test_time_remaining_counts_down_from_the_client_s_deadline() -> None:
    assert transport.CallContext((), "", None).time_remaining() is None
    remaining = transport.CallContext((), "", 5.0).time_remaining()
    assert remaining is not None and 4.0 < remaining <= 5.0
    assert not transport.CallContext((), "", 0.0).is_active()
