"""What every gRPC method shares: request ids, deadlines, metrics, the access log, and errors as status codes."""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import CancelledError
from dataclasses import dataclass
from typing import Any, Callable, Generator

import grpc
import numpy as np
import orjson

from server.dataplane import envelope
from server.dataplane.answers import log_unexpected
from server.dataplane.inference import predict_steps
from server.dataplane.requests import call_timeout, request_id_for
from server.errors import (
    ApiError,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unknown,
    VersionFailed,
)
from server.models.flow import Steps
from server.models.registry import ModelRegistry, ModelVersion
from server.telemetry import measure, metrics
from server.telemetry.payloads import capture

log = logging.getLogger("forkserve.grpc")
WORKER_PID = str(os.getpid())  # this worker's pid, for x-forkserve-worker


def _take_this_process_pid() -> None:
    """In a worker forked after this module was imported (the zygote imports it): its own pid, not the zygote's."""
    global WORKER_PID
    WORKER_PID = str(os.getpid())


os.register_at_fork(after_in_child=_take_this_process_pid)

# The HTTP status REST answers for a failure -> the gRPC status for the same failure.
STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND, 408: grpc.StatusCode.DEADLINE_EXCEEDED,
    403: grpc.StatusCode.PERMISSION_DENIED, 413: grpc.StatusCode.RESOURCE_EXHAUSTED, 501: grpc.StatusCode.UNIMPLEMENTED, 503: grpc.StatusCode.UNAVAILABLE,
    499: grpc.StatusCode.CANCELLED, 504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
# ...and back, for a status the servicer sets itself (UNIMPLEMENTED methods)
HTTP_STATUSES = {grpc.StatusCode.OK: 200, grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.UNIMPLEMENTED: 501, grpc.StatusCode.INTERNAL: 500,
                 grpc.StatusCode.CANCELLED: 499}

Work = Callable[[], Any]  # () -> (message, the version that served it), or a flow (server.models.flow) that returns them
CLIENT_CLOSED = 499  # nginx's status for a request its client gave up: a cancelled call in metrics and access lines


def status_code(exc: ApiError) -> grpc.StatusCode:
    """The gRPC status of a known failure (TF Serving's own mapping: a failed version is FAILED_PRECONDITION)."""
    if isinstance(exc, (VersionFailed, FailedPrecondition)):
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(exc, Unknown):
        return grpc.StatusCode.UNKNOWN
    if isinstance(exc, Cancelled):
        return grpc.StatusCode.CANCELLED
    if isinstance(exc, ResourceExhausted):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, DeadlineExceeded):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if isinstance(exc, NotFound):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, InvalidArgument):
        return grpc.StatusCode.INVALID_ARGUMENT
    if exc.status >= 500:
        return STATUS_CODES.get(exc.status, grpc.StatusCode.INTERNAL)
    return STATUS_CODES.get(exc.status, grpc.StatusCode.INVALID_ARGUMENT)


def timeout_for(context: grpc.ServicerContext, served: ModelVersion) -> float:
    """Seconds this call may wait: the model's deadline, shortened by the client's gRPC deadline."""
    return call_timeout(served, context.time_remaining())


def predict_tensors(served: ModelVersion, signature_name: str, inputs: dict[str, np.ndarray], wanted: list[str],
                    started: float, context: grpc.ServicerContext) -> Steps[dict[str, np.ndarray]]:
    """A call's decoded tensors through the dataplane's predict flow, its payloads captured as tensors (`wanted`: outputs asked)."""
    if capture.ON:
        capture.grpc_inputs(measure.current(), inputs)
    _, outputs = yield from predict_steps(served, signature_name, inputs, started, timeout_for(context, served))
    if capture.ON:
        capture.grpc_outputs(measure.current(), outputs, wanted)
    return outputs


def metadata_value(context: grpc.ServicerContext, key: str) -> str:
    """One request metadata value ("" when absent)."""
    for name, value in context.invocation_metadata():
        if name == key:
            return value if isinstance(value, str) else ""
    return ""


@dataclass(frozen=True)
class Calls:
    """Runs a servicer's work for one RPC and answers it: the registry, and where access lines go."""

    registry: ModelRegistry
    access_line: Callable[[str], None] | None = None

    def run(self, context: grpc.ServicerContext, method: str, work: Work, empty: Any,
            api: str = "", model: str = "") -> Steps[Any]:
        """Answer one RPC with `work()`'s message, or with the status its failure maps to: a flow (server.models.flow).

        `api` names an inference call (counted and timed as REST's are, protocol="grpc"); `model` is
        the model it addresses. `work` returns (message, served version), or is a flow of its own that
        does. Anything it raises costs this call only; a failure ends the flow with Aborted.
        """
        started = time.perf_counter()
        request_id = request_id_for(metadata_value(context, "x-request-id"))
        if api:
            envelope.begin(model if model in self.registry.models else measure.UNKNOWN_MODEL, api, request_id, "grpc",
                           carrier=context, method=method)
        inference = measure.current() if api else None
        trace_id = inference.trace_id if inference is not None else ""
        served: ModelVersion | None = None
        code, details, http_status = grpc.StatusCode.OK, "", 200
        response = empty
        try:
            result = work()
            if isinstance(result, Generator):
                result = yield from result
            response, served = result
        except ApiError as exc:
            measure.note_error(exc)
            code, details, http_status = status_code(exc), exc.message, exc.status
            if http_status >= 500:
                log.warning("request %s failed with %s: %s", request_id, code.name, details)
            if code == grpc.StatusCode.INTERNAL:  # NOTE: clients log the details, rarely the trailing metadata
                details = f"{details} (request id {request_id})"
        except (CancelledError, GeneratorExit) as exc:  # the client left while its job waited (server.models.flow)
            code, details, http_status = grpc.StatusCode.CANCELLED, "the client cancelled the call", CLIENT_CLOSED
            if isinstance(exc, GeneratorExit):
                raise
        except Exception as exc:  # NOTE: a bug must cost this call only; the client is told the request id, the log has the rest
            measure.note_error(exc)
            log_unexpected(log, request_id)
            code, details, http_status = grpc.StatusCode.INTERNAL, f"internal error (request id {request_id})", 500
        finally:
            if api:
                measure.note_grpc_status(code.value[0])
                sampled = measure.current()
                answer = None
                if sampled is not None and sampled.payload is not None:
                    ok = code == grpc.StatusCode.OK
                    answer = (sampled.payload.outputs if ok else orjson.dumps({"error": details})) or b"null"
                envelope.finish(http_status, answer, True)
                envelope.release()
        trailing = [("x-request-id", request_id), ("x-forkserve-worker", WORKER_PID)]  # which worker answered (balance, rollouts)
        if served is not None:
            trailing.append(("x-model-version", str(served.version)))
        if trace_id:
            trailing.append(("x-trace-id", trace_id))
        context.set_trailing_metadata(tuple(trailing))
        if self.access_line is not None:
            self._log(context, method, code, http_status, response if code == grpc.StatusCode.OK else None,
                      started, request_id, served, trace_id)
        if code != grpc.StatusCode.OK:
            context.abort(code, details)
        return response

    def refuse(self, context: grpc.ServicerContext, method: str, code: grpc.StatusCode, details: str) -> None:
        """A call refused before its method ran (its message is not the method's type): counted, and an access line."""
        metrics.record(lambda: metrics.GRPC_REFUSED_CALLS.labels("invalid_message").inc())
        if self.access_line is not None:
            self._log(context, method, code, HTTP_STATUSES.get(code, 400), None, time.perf_counter(),
                      request_id_for(metadata_value(context, "x-request-id")), None)

    def _log(self, context: grpc.ServicerContext, method: str, code: grpc.StatusCode, http_status: int, response: Any,
             started: float, request_id: str, served: ModelVersion | None, trace_id: str = "") -> None:
        """One access-log line, in REST's shape, with the gRPC status at its end."""
        peer = context.peer()  # "ipv4:127.0.0.1:5000", "ipv6:[::1]:5000"
        host = peer.split(":", 1)[-1].rsplit(":", 1)[0].strip("[]") if peer else "-"
        size = response.ByteSize() if response is not None else 0
        milliseconds = int((time.perf_counter() - started) * 1000)
        assert self.access_line is not None
        self.access_line(f'{host} "POST {method} HTTP/2" {http_status} {size} {milliseconds}ms '
                         f"rid={request_id} version={served.version if served else '-'} grpc={code.name}"
                         + (f" trace={trace_id}" if trace_id else ""))
