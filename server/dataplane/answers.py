"""A failed request's answer on any transport: the status, the client's message, and the log line (tracebacks rate-limited)."""

from __future__ import annotations

import logging
import sys

from server.errors import ApiError, ResourceExhausted
from server.telemetry import measure
from server.telemetry.lines import LineLimit

log = logging.getLogger("forkserve.app")
TRACEBACK_LOG_LIMIT = LineLimit(per_second=5)


def api_error_answer(exc: ApiError, request_id: str) -> tuple[int, dict[str, str], dict[str, str]]:
    """A known failure: (status, TF Serving's `{"error": ...}`, extra headers)."""
    measure.note_error(exc)
    if exc.status >= 500:
        log.warning("request %s failed with %d: %s", request_id, exc.status, exc.message)
    retry = isinstance(exc, ResourceExhausted) or exc.status == 503
    return exc.status, {"error": exc.message}, {"Retry-After": "1"} if retry else {}


def log_unexpected(logger: logging.Logger, request_id: str) -> None:
    """A bug's traceback with the request id (call from an except block), at most TRACEBACK_LOG_LIMIT a second.

    NOTE: a request that trips the same bug each time must not fill the log (a full traceback a request),
    REST and gRPC alike: the rest are counted and the count logged with the next traceback let through.
    """
    suppressed = TRACEBACK_LOG_LIMIT.admit()
    if suppressed is None:
        return
    if suppressed:
        log.warning("%d more unexpected errors were not logged (at most %d tracebacks a second)",
                    suppressed, TRACEBACK_LOG_LIMIT.per_second)
    logger.exception("request %s: unexpected error", request_id)


def unexpected_error_answer(request_id: str) -> tuple[int, dict[str, str]]:
    """A bug (call from an except block): log the traceback (rate-limited) with the request id, tell the client only the id."""
    log_unexpected(log, request_id)
    error = sys.exc_info()[1]
    if error is not None:
        measure.note_error(error)
    return 500, {"error": f"internal error (request id {request_id})"}
