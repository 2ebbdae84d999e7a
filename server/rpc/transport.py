"""grpc.aio glue: a call waits for its message on the event loop, is admitted or refused, runs its flow, answers.

Runs in a worker only, on the listener's event loop thread (server.rpc.listener) except where a
docstring says "pool thread". Why asyncio: grpcio's sync server waits for a unary call's request
message on a pool thread, so 32 clients that open calls and never send their message held every
thread, health checks included. Here a call holds no thread while it waits, for anything:

- every unary method is registered as client-streaming, so the handler starts before the message
  arrives and reads it with a deadline (a call that stalls is ended with DEADLINE_EXCEEDED);
- calls waiting for their message and calls at work are counted against caps; past them a call is
  refused at once with RESOURCE_EXHAUSTED, as REST's queues shed load;
- the message comes as raw bytes and is parsed here (a message that is not valid protobuf is
  INVALID_ARGUMENT, not grpcio's INTERNAL); the servicer's flow (server.models.flow) then runs on
  the loop and awaits the model's executor: no thread hop per call. A message over
  INLINE_MAX_BYTES, whose decoding would hold the loop, runs its flow on a pool thread instead;
- health checks never wait behind the pool (server.rpc.health): no inference load starves them.

NOTE: on the wire a unary call and a client-streaming call with one message are the same HTTP/2
stream; grpcio routes by method path only, so clients see no difference.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import CancelledError as FutureCancelled
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Generator, TypeVar

import grpc
from google.protobuf.message import DecodeError

from server.models.flow import Steps, Wait, run_blocking
from server.models.reply import ReplyTimeout
from server.telemetry import metrics

log = logging.getLogger("forkserve.grpc")
T = TypeVar("T")


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
        return not self._cancelled and not self.deadline_passed()

    def deadline_passed(self) -> bool:
        """Whether the client's deadline has come (grpc-core then cancels the call: a deadline, not a client that left)."""
        return self._deadline is not None and time.monotonic() >= self._deadline - DEADLINE_SLACK

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


Behavior = Callable[[Any, CallContext], Any]  # a servicer method: (request message, context) -> a flow of its answer
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

    @staticmethod
    def refuse(why: str) -> None:
        """One more call refused for `why` (forkserve_grpc_refused_calls_total)."""
        metrics.record(lambda: metrics.GRPC_REFUSED_CALLS.labels(why).inc())


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
    task = asyncio.current_task()
    assert task is not None
    late = _Late(task)
    # NOTE: one timer handle (C in uvloop), not asyncio.timeout or wait_for: those cost a tenth of a small call's CPU
    timer = asyncio.get_running_loop().call_later(capacity.receive_timeout, late.expire)
    try:
        return await requests.__anext__()
    except asyncio.CancelledError:
        if not late.expired:
            raise  # the client cancelled
        task.uncancel()
        capacity.refuse("receive_timeout")
        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                            f"the request message did not arrive within {capacity.receive_timeout:g}s")
    except StopAsyncIteration:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no request message")
    finally:
        timer.cancel()
        if counted:
            capacity.receiving -= 1
    raise AssertionError("unreachable: abort raises")


class _Late:
    """A call's receive deadline: cancels the call's task when it passes, and says so."""

    __slots__ = ("task", "expired")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.expired = False

    def expire(self) -> None:
        self.expired = True
        self.task.cancel()


def parse(request_type: Any, raw: bytes) -> Any:
    """A request message from its bytes; Aborted(INVALID_ARGUMENT) when they are not one."""
    try:
        return request_type.FromString(raw)
    except (DecodeError, RuntimeWarning, ValueError) as exc:  # NOTE: upb raises DecodeError; bad UTF-8 in a string field too
        raise Aborted(grpc.StatusCode.INVALID_ARGUMENT,
                      f"the request is not a valid {request_type.DESCRIPTOR.full_name} message: {exc}") from None


DEADLINE_SLACK = 0.01  # seconds: grpc-core's deadline timer and ours are not the same clock
INLINE_MAX_BYTES = 1 << 20  # a message up to this size is served on the loop; a larger one on the pool


def parse_or_refuse(request_type: Any, method: str, refuse: Refuse, raw: bytes, call: CallContext) -> Any:
    """The request message, or an Outcome refusing the call (access-logged)."""
    try:
        return parse(request_type, raw)
    except Aborted as exc:
        refuse(call, method, exc.code, exc.details)
        return Outcome(code=exc.code, details=exc.details)


def answered(response: Any, call: CallContext) -> Outcome:
    """The outcome of a servicer method that returned `response`."""
    answer = response.SerializeToString() if call.code == grpc.StatusCode.OK else b""
    return Outcome(answer, call.code, call.details, call.trailing)


def failed(exc: BaseException, method: str, call: CallContext) -> Outcome:
    """The outcome of a call whose servicer method raised: its abort, or (a bug past Calls.run's mapping) INTERNAL."""
    if isinstance(exc, Aborted):
        return Outcome(code=exc.code, details=exc.details, trailing=call.trailing)
    log.error("gRPC %s: unexpected error outside the method", method, exc_info=exc)
    return Outcome(code=grpc.StatusCode.INTERNAL, details="internal error", trailing=call.trailing)


def serve_on_pool(behavior: Behavior, request_type: Any, method: str, refuse: Refuse,
                  raw: bytes, call: CallContext) -> Outcome:
    """Pool thread: parse, run the servicer's flow on this thread, serialize its answer; every failure becomes a status."""
    request = parse_or_refuse(request_type, method, refuse, raw, call)
    if isinstance(request, Outcome):
        return request
    try:
        result = behavior(request, call)
        if isinstance(result, Generator):
            result = run_blocking(result, on_wait=lambda wait: call.add_cancel_callback(wait.abandon))
        return answered(result, call)
    except BaseException as exc:  # NOTE: SystemExit too: it costs this call only
        return failed(exc, method, call)


async def serve_on_loop(behavior: Behavior, request_type: Any, method: str, refuse: Refuse,
                        raw: bytes, call: CallContext) -> Outcome:
    """Loop thread: serve_on_pool's twin, awaiting the model instead of blocking a thread."""
    request = parse_or_refuse(request_type, method, refuse, raw, call)
    if isinstance(request, Outcome):
        return request
    try:
        result = behavior(request, call)
        if isinstance(result, Generator):
            result = await drive(result, call.deadline_passed)
        return answered(result, call)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # NOTE: as serve_on_pool's
        return failed(exc, method, call)


async def drive(steps: Steps[T], deadline_passed: Callable[[], bool] = lambda: False) -> T:
    """Loop thread: run_blocking's twin: await each wait of a flow; a cancelled call withdraws its job and ends the flow.

    A cancel at the client's deadline ends the flow as its own timeout would (DEADLINE_EXCEEDED, counted as such).
    """
    try:
        wait = next(steps)
        while True:
            try:
                value = await reply_of(wait)
            except asyncio.CancelledError:  # the client left, or its deadline came: record that, then the task ends
                wait.abandon()
                _end_cancelled(steps, ReplyTimeout if deadline_passed() else FutureCancelled)
                raise
            except (ReplyTimeout, FutureCancelled, Exception) as exc:
                wait = steps.throw(exc)
            else:
                wait = steps.send(value)
    except StopIteration as done:
        return done.value


def _end_cancelled(steps: Steps[Any], why: type[BaseException]) -> None:
    """Throw the cancel (or the timeout) into a flow until it ends (any job it still queues is withdrawn at once)."""
    while True:
        try:
            wait = steps.throw(why())
        except (StopIteration, Aborted, FutureCancelled, ReplyTimeout):
            return
        wait.abandon()


async def reply_of(wait: Wait) -> Any:
    """Loop thread: the job's outputs (or its failure), without a thread: the executor wakes the loop once it replies."""
    loop = asyncio.get_running_loop()
    replied = loop.create_future()
    reply = wait.job.future
    reply.on_done(lambda: loop.call_soon_threadsafe(_settle, replied, None))
    # NOTE: a timer handle, not asyncio.timeout: that costs a context manager and a task reschedule per call
    timer = loop.call_later(wait.timeout, _settle, replied, ReplyTimeout())
    try:
        await replied
    finally:
        timer.cancel()
    return reply.result(0)


def _settle(replied: asyncio.Future[None], error: BaseException | None) -> None:
    """Loop thread: the reply came (error None), or its time ran out (ReplyTimeout), whichever is first."""
    if replied.done():
        return
    if error is None:
        replied.set_result(None)
    else:
        replied.set_exception(error)


def unary(behavior: Behavior, request_type: Any, method: str, capacity: Capacity, pool: ThreadPoolExecutor,
          refuse: Refuse, noted: Callable[[str], None] | None = None) -> grpc.RpcMethodHandler:
    """A unary method's handler: its message within the deadline, admission, its flow on the loop (or the pool), the answer."""

    async def handle(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
        raw = await first_message(requests, context, capacity)
        if capacity.working >= capacity.max_working:
            capacity.refuse("busy")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"this worker is at its limit of {capacity.max_working} gRPC calls at once; retry")
        peer = context.peer()
        if noted is not None:
            noted(peer)
        call = CallContext(context.invocation_metadata() or (), peer, context.time_remaining())
        capacity.working += 1
        if len(raw) <= INLINE_MAX_BYTES:
            try:
                outcome = await serve_on_loop(behavior, request_type, method, refuse, raw, call)
            finally:
                capacity.working -= 1
        else:  # NOTE: decoding a large message would hold the loop (every call's I/O, the health checks): a pool thread
            loop = asyncio.get_running_loop()
            outcome_of: asyncio.Future[Outcome] = loop.create_future()
            pool.submit(_serve_and_hand_back, loop, outcome_of, capacity, behavior, request_type, method, refuse, raw, call)
            try:
                outcome = await outcome_of
            except asyncio.CancelledError:  # the client cancelled: withdraw its queued job (at its deadline the flow times out)
                if not call.deadline_passed():
                    call.cancel()
                raise
        if outcome.trailing:
            context.set_trailing_metadata(outcome.trailing)
        if outcome.code != grpc.StatusCode.OK:
            await context.abort(outcome.code, outcome.details)
        return outcome.answer

    return grpc.stream_unary_rpc_method_handler(handle)


def _serve_and_hand_back(loop: asyncio.AbstractEventLoop, outcome_of: asyncio.Future[Outcome], capacity: Capacity,
                         *work: Any) -> None:
    """Pool thread: serve the call, then wake the loop once with its outcome (one self-pipe write per call)."""
    outcome = serve_on_pool(*work)
    loop.call_soon_threadsafe(_hand_back, outcome_of, capacity, outcome)


def _hand_back(outcome_of: asyncio.Future[Outcome], capacity: Capacity, outcome: Outcome) -> None:
    """Loop thread: the call's slot is free again; its handler gets the outcome (unless the client left)."""
    capacity.working -= 1
    if not outcome_of.done():
        outcome_of.set_result(outcome)


def method_handlers(service: Any, servicer: Any, capacity: Capacity, pool: ThreadPoolExecutor, refuse: Refuse,
                    noted: Callable[[str], None] | None = None) -> dict[str, grpc.RpcMethodHandler]:
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
    return handlers


def register(server: grpc.aio.Server, service_name: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
    """Register a service's handlers as pre-registered methods (matched by grpc-core, not by a Python lookup per call)."""
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service_name, handlers)])
    server.add_registered_method_handlers(service_name, handlers)
