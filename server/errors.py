"""Errors that reach the client as `{"error": "..."}` with TF Serving's status mapping."""

from __future__ import annotations


class ApiError(Exception):
    """A request failed for a reason the client should read; `status` is the HTTP code."""

    status = 500
    quotes_user_code = False  # the message is a handler's text, which may quote the request (kept out of traces)

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class InvalidArgument(ApiError):
    """INVALID_ARGUMENT: the request does not fit the model (400)."""

    status = 400


class FailedPrecondition(ApiError):
    """FAILED_PRECONDITION over gRPC; 400 over REST, as TF Serving maps it (a failed version is VersionFailed)."""

    status = 400


class NotFound(ApiError):
    """NOT_FOUND: no such model, version, label or signature (404)."""

    status = 404


class Unavailable(ApiError):
    """UNAVAILABLE: the model exists but cannot answer now (503)."""

    status = 503


class VersionFailed(Unavailable):
    """A version that failed to load or was failed by a rollout: 503 over REST, FAILED_PRECONDITION over gRPC."""


class Unknown(ApiError):
    """UNKNOWN: it failed where TF Serving reports the underlying error as is (500), e.g. a model that did not load."""

    status = 500


class ResourceExhausted(ApiError):
    """RESOURCE_EXHAUSTED: the model's queue is full (429 in TF Serving; 503 + Retry-After here)."""

    status = 503


class Cancelled(ApiError):
    """CANCELLED: the client gave up on the call and its job was abandoned (499, as nginx logs a closed request)."""

    status = 499


class DeadlineExceeded(ApiError):
    """DEADLINE_EXCEEDED: the request waited past its deadline (504)."""

    status = 504
