"""server.rpc.transport on a real grpc.aio server in this process: the receive deadline, the call caps, cancellation, junk."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import grpc
import numpy as np
import pytest
from tritonclient.grpc import (
    service_pb2 as open_inference_pb2,  # NOTE: the test process's V2 protos (one pool)
)

from server.models.executor import ModelExecutor
from server.models.flow import Wait
from server.rpc import transport


def wait_until(condition: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)

SERVICE = open_inference_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
LIVE = "/inference.GRPCInferenceService/ServerLive"


class Servicer:
    """ServerLive queues a job on a real model executor whose model waits until released; ServerReady answers at once.

    Large ServerLive messages (over INLINE_MAX_BYTES) run on the pool, small ones on the loop.
    """

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Semaphore(0)  # released once per batch the model begins
        self.batches = 0
        self.executor = ModelExecutor("gated", self.model, max_batch_size=1, max_batch_delay_s=0.0, max_queue_rows=100)
        self.executor.start()

    def model(self, signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.batches += 1
        self.started.release()
        self.release.wait(30)
        return {"live": inputs["x"]}

    def ServerLive(self, request: Any, context: transport.CallContext) -> Any:
        job = self.executor.submit("serving_default", {"x": np.ones((1, 1))}, 1, True)
        outputs = yield Wait(self.executor, job, 30.0)
        return open_inference_pb2.ServerLiveResponse(live=bool(outputs["live"][0, 0]))

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
        self.server = grpc.aio.server(options=[("grpc.max_receive_message_length", 8 << 20)])
        transport.register(self.server, SERVICE.full_name, transport.method_handlers(
            SERVICE, self.servicer, self.capacity, self.pool, lambda call, method, code, details: self.refused.append((method, code))))
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
    wait_until(lambda: running.capacity.receiving == 0, "its receiving slot to be given back")


def large_live_request() -> bytes:
    """A ServerLiveRequest over INLINE_MAX_BYTES (an unknown field of padding): served on the pool."""
    padding = b"p" * (transport.INLINE_MAX_BYTES + 1)
    size, varint = len(padding), b""
    while size >= 0x80:
        varint += bytes([size & 0x7F | 0x80])
        size >>= 7
    return b"\xfa\x07" + varint + bytes([size]) + padding  # field 127, length-delimited


@pytest.mark.parametrize("where", ["loop", "pool"])
def test_calls_past_the_cap_are_refused_at_once_and_a_cancelled_call_withdraws_its_queued_job(
        running: Running, where: str) -> None:
    message = b"" if where == "loop" else large_live_request()
    servicer = running.servicer
    with grpc.insecure_channel(f"127.0.0.1:{running.port}", options=[("grpc.max_send_message_length", 8 << 20)]) as channel:
        live = channel.unary_unary(LIVE, request_serializer=None, response_deserializer=None)
        first = live.future(message, timeout=30)
        assert servicer.started.acquire(timeout=10)  # the model runs the first call's job (and waits)
        queued = live.future(message, timeout=30)  # the second call's job waits in the executor's queue
        wait_until(lambda: servicer.executor.queued_rows == 1, "the second job to queue")
        with pytest.raises(grpc.RpcError) as caught:  # two calls at work: the cap
            live(message, timeout=10)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "limit of 2" in caught.value.details()
        queued.cancel()
        wait_until(lambda: servicer.executor.queued_rows == 0, "the cancelled call's job to leave the queue")
        servicer.release.set()
        assert open_inference_pb2.ServerLiveResponse.FromString(first.result(timeout=10)).live
        wait_until(lambda: running.capacity.working == 0, "both slots to be free")
        assert open_inference_pb2.ServerLiveResponse.FromString(live(message, timeout=10)).live
    assert servicer.batches == 2  # the first call and the last: the cancelled job never ran


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
