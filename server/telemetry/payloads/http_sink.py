"""CloudEvents in binary mode, as KServe's payload logger sends them: one POST for the request, one for the response."""

from __future__ import annotations

import socket

from server.telemetry.bounded_http import BoundedSession
from server.telemetry.payloads.record import Record

REQUEST_TYPE = "org.kubeflow.serving.inference.request"
RESPONSE_TYPE = "org.kubeflow.serving.inference.response"
TIMEOUT = (1.0, 2.0)  # connect, read: an event holds the writer thread 3 s at most in all (bounded_http), never a request


class ReceiverFailed(OSError):
    """The receiver answered an error status."""


class HttpSink:
    """POSTs each record's two events to `url` with one bounded session (the writer thread's): a few KB of each
    answer read, redirects never followed (a 3xx is a failed write), 3 s per event at most."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.source = f"http://{socket.gethostname()}/forkserve"
        self.session = BoundedSession()

    def write(self, record: Record) -> None:
        """Both events; requests' errors and an error status propagate to the writer, which counts them."""
        s = record.sampled
        base = {
            "ce-specversion": "1.0", "ce-id": s.request_id, "ce-source": self.source, "ce-time": record.time,
            "ce-inferenceservicename": s.model, "ce-modelversion": s.version, "ce-endpoint": s.api,
            "Content-Type": "application/json",
        }
        if s.trace_id:
            base["ce-traceid"] = s.trace_id
        self._post({**base, "ce-type": REQUEST_TYPE}, record.inputs if record.inputs is not None else b"null")
        outputs = record.outputs
        if outputs is None:
            outputs = b"null" if record.error is None else record.sampled.body
        self._post({**base, "ce-type": RESPONSE_TYPE, "ce-statuscode": str(s.status)}, outputs)

    def _post(self, headers: dict[str, str], body: bytes) -> None:
        response = self.session.post(self.url, data=body, headers=headers, timeout=TIMEOUT)
        if response.status_code >= 300:
            raise ReceiverFailed(f"{self.url} answered {response.status_code}")

    def abort(self) -> None:
        """End the event being sent now (a stopping worker); the write fails."""
        self.session.abort()

    def close(self) -> None:
        self.session.close()
