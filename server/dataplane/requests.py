"""What identifies a request and bounds it, on every transport: request ids, model addresses, deadlines."""

from __future__ import annotations

import itertools
import os
import re

from server.errors import ApiError, InvalidArgument
from server.models.registry import ModelVersion
from server.repository import is_model_name, parse_version

REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # NOTE: used with fullmatch (`$` accepts a trailing "\n")


class RequestIds:
    """Unique request ids without a system call each: a random prefix per process and a counter.

    NOTE: uuid4() reads os.urandom per request, a measurable part of an MLP request's Python
    (bench/results/code-notes.md#request-ids). The prefix is drawn again in each forked worker, so workers never share one.
    """

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._counter = itertools.count()

    def new(self) -> str:
        return f"{self._prefix}{next(self._counter):016x}"


REQUEST_IDS = RequestIds()


def request_id_for(given: str) -> str:
    """The caller's X-Request-Id when it is sane, else a new one."""
    return given if given and REQUEST_ID_RE.fullmatch(given) else REQUEST_IDS.new()


def model_address(name: str, version: str | None) -> tuple[str, int | None]:
    """A model name and optional version from a URL, validated like repository directories."""
    if not is_model_name(name):
        raise InvalidArgument(f"invalid model name {name!r}")
    if version is None:
        return name, None
    number = parse_version(version)
    if number is None:
        raise InvalidArgument(f"model version must be a positive integer, got {version!r}")
    return name, number


def request_timeout(served: ModelVersion, header: str | None) -> float:
    """Seconds this request may wait: the model's deadline, shortened by the X-Request-Timeout header's value."""
    limit = served.config.request_timeout_s
    if header is None:
        return limit
    try:
        asked = float(header)
    except ValueError:
        asked = float("nan")
    if not asked > 0 or asked == float("inf"):
        raise ApiError(f"X-Request-Timeout must be a positive number of seconds, got {header!r}", status=400)
    return min(limit, asked)


def call_timeout(served: ModelVersion, remaining: float | None) -> float:
    """Seconds a gRPC call may wait: the model's deadline, shortened by the client's deadline (`remaining`, None: none)."""
    limit = served.config.request_timeout_s
    return limit if remaining is None else max(0.0, min(limit, remaining))
