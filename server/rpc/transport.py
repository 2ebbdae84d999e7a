"""grpc.aio glue: a call waits for its message on the event loop, runs on a bounded pool, answers from the loop.

Runs in a worker only, on the listener's event loop thread (server.rpc.listener) except where a
docstring says "pool thread". Why asyncio: grpcio's sync server waits for a unary call's request
message on a pool thread, so 32 clients that open calls and never send their message held every
thread, health checks included. Here a call costs no thread until its message is in:

- every unary method is registered as client-streaming, so the handler starts before the message
  arrives and reads it with a deadline (a call that stalls is ended with DEADLINE_EXCEEDED);
- calls waiting for their message and calls at work are counted against caps; past them a call is
  refused at once with RESOURCE_EXHAUSTED, as REST's queues shed load;
- the message is parsed, served and its answer serialized on a pool thread (raw bytes in and out
  of grpcio: a message that is not valid protobuf is INVALID_ARGUMENT, not grpcio's INTERNAL);
- health checks never touch the pool (server.rpc.health), so no inference load can starve them.

NOTE: on the wire a unary call and a client-streaming call with one message are the same HTTP/2
stream; grpcio routes by method path only, so clients see no difference.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import grpc
from google.protobuf.message import DecodeError

log = logging.getLogger("forkserve.grpc")


class Aborted(Exception):
    """A pool thread's call.abort(): the status the loop then sends."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class CallContext:
    """What a servicer method sees of its call, on a pool thread: the parts of grpc.ServicerContext forkserve uses.

    NOTE: grpc.aio's own context is the event loop's; its abort is a coroutine. This one is read on
    the pool thread from values the loop captured, and abort raises Aborted for the loop to send.
    """

    def __init__(self, metadata: tuple[tuple[str, Any], ...], peer: str, time_remaining: float | None) -> None:
        self._metadata = metadata
        self._peer = peer
        self._deadline = None if time_remaining is None else time.monotonic() + time_remaining
        self.trailing: tuple[tuple[str, str], ...] = ()
        self.code = grpc.StatusCode.OK
        self.details = ""
        self._cancelled = False
        self._on_cancel: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def time_remaining(self) -> float | None:
        """Seconds left before the client's deadline, None when it set none."""
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.trailing = tuple(metadata)

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)

    def is_active(self) -> bool:
        """False once the client cancelled the call or its deadline passed."""
        return not self._cancelled and (self._deadline is None or time.monotonic() < self._deadline)

    def add_cancel_callback(self, callback: Callable[[], None]) -> None:
        """Run `callback` when the client cancels (at once when it has already): how a call stops its queued work."""
        with self._lock:
            if not self._cancelled:
                self._on_cancel.append(callback)
                return
        callback()

    def cancel(self) -> None:
        """Loop thread: the client went away; run the callbacks (each one's failure is logged, not raised)."""
        with self._lock:
            self._cancelled = True
            callbacks, self._on_cancel = self._on_cancel, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("gRPC: a cancel callback failed")


@dataclass
class Outcome:
    """What a pool thread hands back: the serialized answer, or the status to abort with."""

    answer: bytes = b""
    code: grpc.StatusCode = grpc.StatusCode.OK
    details: str = ""
    trailing: tuple[tuple[str, str], ...] = ()


Behavior = Callable[[Any, CallContext], Any]  # a servicer method: (request message, context) -> response message
Refuse = Callable[[CallContext, str, grpc.StatusCode, str], None]  # access-logs a call refused before its method ran


@dataclass
class Capacity:
    """The worker's gRPC admission: calls waiting for their message, calls at work (loop thread only: no lock).

    NOTE: a call at work is counted until its pool thread returns, not until its client leaves: a
    client that cancels must not free a slot its work still holds.
    """

    max_receiving: int
    max_working: int
    receive_timeout: float
    receiving: int = 0
    working: int = 0
    refused: dict[str, int] = field(default_factory=dict)

    def refuse(self, why: str) -> None:
        self.refused[why] = self.refused.get(why, 0) + 1


async def first_message(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext, capacity: Capacity,
                        counted: bool = True) -> bytes:
    """The call's one request message, within the receive deadline; aborts the call when it does not come.

    `counted`: the call holds a receiving slot while it waits (health checks do not).
    """
    if counted:
        if capacity.receiving >= capacity.max_receiving:
            capacity.refuse("receiving")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"too many calls waiting for their request message here ({capacity.max_receiving})")
        capacity.receiving += 1
    try:
        return await asyncio.wait_for(requests.__anext__(), capacity.receive_timeout)
    except asyncio.TimeoutError:
        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                            f"the request message did not arrive within {capacity.receive_timeout:g}s")
    except StopAsyncIteration:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no request message")
    finally:
        if counted:
            capacity.receiving -= 1
    raise AssertionError("unreachable: abort raises")


def parse(request_type: Any, raw: bytes) -> Any:
    """A request message from its bytes; Aborted(INVALID_ARGUMENT) when they are not one."""
    try:
        return request_type.FromString(raw)
    except (DecodeError, RuntimeWarning, ValueError) as exc:  # NOTE: upb raises DecodeError; bad UTF-8 in a string field too
        raise Aborted(grpc.StatusCode.INVALID_ARGUMENT,
                      f"the request is not a valid {request_type.DESCRIPTOR.full_name} message: {exc}") from None


def serve_on_pool(behavior: Behavior, request_type: Any, method: str, refuse: Refuse,
                  raw: bytes, call: CallContext) -> Outcome:
    """Pool thread: parse, run the servicer method, serialize its answer; every failure becomes a status."""
    try:
        request = parse(request_type, raw)
    except Aborted as exc:
        refuse(call, method, exc.code, exc.details)
        return Outcome(code=exc.code, details=exc.details)
    try:
        response = behavior(request, call)
        answer = response.SerializeToString() if call.code == grpc.StatusCode.OK else b""
        return Outcome(answer, call.code, call.details, call.trailing)
    except Aborted as exc:
        return Outcome(code=exc.code, details=exc.details, trailing=call.trailing)
    except BaseException:  # NOTE: Calls.run maps every failure of a method already; this is a bug past it (SystemExit too)
        log.exception("gRPC %s: unexpected error outside the method", method)
        return Outcome(code=grpc.StatusCode.INTERNAL, details="internal error", trailing=call.trailing)


def unary(behavior: Behavior, request_type: Any, method: str, capacity: Capacity, pool: ThreadPoolExecutor,
          refuse: Refuse, noted: Callable[[str], None] | None = None) -> grpc.RpcMethodHandler:
    """A unary method's handler: message with a deadline, admission, the work on `pool`, the answer from the loop."""

    async def handle(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
        raw = await first_message(requests, context, capacity)
        if capacity.working >= capacity.max_working:
            capacity.refuse("working")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"this worker is at its limit of {capacity.max_working} gRPC calls at once; retry")
        if noted is not None:
            noted(context.peer())
        call = CallContext(context.invocation_metadata() or (), context.peer(), context.time_remaining())
        capacity.working += 1
        loop = asyncio.get_running_loop()
        work = pool.submit(serve_on_pool, behavior, request_type, method, refuse, raw, call)
        work.add_done_callback(lambda _: loop.call_soon_threadsafe(_worked, capacity))
        try:
            outcome = await asyncio.wrap_future(work)
        except asyncio.CancelledError:  # the client cancelled, or its deadline passed: stop what can still be stopped
            call.cancel()
            raise
        if outcome.trailing:
            context.set_trailing_metadata(outcome.trailing)
        if outcome.code != grpc.StatusCode.OK:
            await context.abort(outcome.code, outcome.details)
        return outcome.answer

    return grpc.stream_unary_rpc_method_handler(handle)


def _worked(capacity: Capacity) -> None:
    """Loop thread: a pool thread finished its call."""
    capacity.working -= 1


def service_handler(service: Any, servicer: Any, capacity: Capacity, pool: ThreadPoolExecutor, refuse: Refuse,
                    noted: Callable[[str], None] | None = None) -> grpc.GenericRpcHandler:
    """Every unary method of a protobuf service descriptor that `servicer` implements; other methods stay UNIMPLEMENTED."""
    from google.protobuf import message_factory

    handlers = {}
    for method in service.methods:
        behavior = getattr(servicer, method.name, None)
        if behavior is None or method.client_streaming or method.server_streaming:
            continue
        path = f"/{service.full_name}/{method.name}"
        request_type = message_factory.GetMessageClass(method.input_type)
        handlers[method.name] = unary(behavior, request_type, path, capacity, pool, refuse, noted)
    return grpc.method_handlers_generic_handler(service.full_name, handlers)
