"""What every REST view shares: the request's body and content type, its deadline header, JSON answers (Flask)."""

from __future__ import annotations

import socket
import ssl
import struct
import time
from typing import Any

from flask import Response, current_app, request
from werkzeug.exceptions import ClientDisconnected, RequestEntityTooLarge

from server.dataplane.requests import request_timeout
from server.errors import ApiError
from server.models.registry import ModelRegistry, ModelVersion
from server.telemetry import measure
from server.tensors import jsonio

# curl -d sends form-urlencoded and TF Serving's docs use it, so that (and none) also means JSON.
JSON_CONTENT_TYPES = frozenset({"", "application/json", "application/x-www-form-urlencoded", "text/plain"})


def is_json_type(mimetype: str, also: frozenset[str] = frozenset()) -> bool:
    """Whether a body of this media type (no parameters, lower case) is read as JSON."""
    return mimetype in JSON_CONTENT_TYPES or mimetype in also or mimetype.endswith("+json")


def registry() -> ModelRegistry:
    """This worker's models."""
    return current_app.extensions["forkserve"]


def check_content_type(also: frozenset[str] = frozenset()) -> None:
    """415 unless the body is JSON (or one of `also`)."""
    mimetype = request.mimetype or ""
    if not is_json_type(mimetype, also):
        wanted = " or ".join(["application/json", *sorted(also)])
        raise ApiError(f"unsupported Content-Type {mimetype!r}; send {wanted}", status=415)


def request_body() -> bytes:
    """The whole request body: 413 over the size limit (chunked bodies too), 408 when the client stalls."""
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    limit_client_silence(request.environ, current_app.extensions["forkserve.settings"].client_timeout)
    try:
        if request.content_length is None and "wsgi.input_terminated" in request.environ:
            # NOTE: werkzeug stops a chunked body at the limit without an error (the JSON parser then
            # saw a truncated document); read one byte past it to tell "exactly the limit" from "more".
            data = request.environ["wsgi.input"].read(limit + 1)
            if len(data) > limit:
                raise RequestEntityTooLarge()
            return data
        data = request.get_data(cache=False)
        if request.content_length is not None and len(data) < request.content_length:
            raise ClientDisconnected()  # NOTE: werkzeug returns a short body as it is; it would parse as JSON
        return data
    except (OSError, ClientDisconnected):  # the receive timeout set above (werkzeug wraps it), or a reset
        raise ApiError("the client stopped sending the request body", status=408) from None


def limit_client_silence(environ: dict[str, Any], seconds: float) -> None:
    """Bound how long this connection's reads and writes may wait for the client (gunicorn's socket).

    NOTE: gthread reads a body with blocking calls and no timeout: one client stalled mid-body
    held a request thread, and a retiring worker, until graceful_timeout and then gunicorn's kill.
    SO_RCVTIMEO / SO_SNDTIMEO survive gunicorn's setblocking(True) calls.
    """
    sock = environ.get("gunicorn.socket")
    if sock is None:
        return
    if isinstance(sock, ssl.SSLSocket):
        # NOTE: TLS (server.tls): a blocking SSLSocket retries its read after SO_RCVTIMEO's EAGAIN (CPython's
        # _ssl loops on SSL_ERROR_WANT_READ), so only its own timeout ends the wait; gthread's setblocking(True)
        # before the connection's next request clears it.
        sock.settimeout(seconds)
        return
    value = struct.pack("ll", int(seconds), int((seconds % 1) * 1_000_000))
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
    except OSError:
        pass


def read_json() -> Any:
    """The request body parsed as JSON; 415 for another content type, 413 over the size limit."""
    check_content_type()
    return jsonio.loads(request_body())


def encode_json(payload: Any, timed: bool) -> bytes:
    """A JSON body; `timed`: its time is the request's encode stage."""
    started = time.perf_counter()
    body = jsonio.dumps(payload)
    if timed:
        measure.stage("encode", time.perf_counter() - started)
    return body


def json_response(payload: Any, status: int = 200, version: ModelVersion | None = None) -> Response:
    """A JSON response, with the version that answered in X-Model-Version."""
    response = Response(encode_json(payload, timed=version is not None), status=status, mimetype="application/json")
    if version is not None:
        response.headers["X-Model-Version"] = str(version.version)
    return response


def flask_request_timeout(version: ModelVersion) -> float:
    """The deadline (server.dataplane.requests.request_timeout) of the request Flask is answering."""
    return request_timeout(version, request.headers.get("X-Request-Timeout"))
