"""A request's envelope, written once for every transport: begin, the version that serves it, the answer recorded, release.

The Flask hooks (server.http.app), the predict fast path (server.http.fast_predict) and every gRPC
call (server.rpc.calls) go through these, so each API is measured, traced and payload-logged the
same way. Runs on the thread (or, for gRPC, the event loop) that answers the request.
"""

from __future__ import annotations

from server.models.registry import ModelVersion
from server.telemetry import measure
from server.telemetry.payloads import capture

begin = measure.begin
release = measure.release


def serving(served: ModelVersion) -> None:
    """The version that answers this request: its label on the metrics, and whether its payloads are sampled."""
    measure.set_version(served.version)
    if capture.ON:
        capture.sample(measure.current(), served)


def finish(status: int, body: bytes | None, is_json: bool) -> None:
    """The answer is known: count and time the request, end its span, hand a sampled request's payloads to the writer.

    `body`: what the client gets (None: not kept, e.g. a streamed response).
    """
    inference = measure.current()
    measure.record(status)
    if inference is not None and inference.payload is not None and body is not None:
        inference.payload.submit(inference, status, body, is_json)
