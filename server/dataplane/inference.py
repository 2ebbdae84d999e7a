"""The inference flow every predict, classify and regress API shares: validated tensors through the version's executor."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from server.errors import Cancelled, DeadlineExceeded, InvalidArgument
from server.models.executor import Abandoned
from server.models.flow import Steps, Wait, run_blocking
from server.models.registry import ModelVersion
from server.models.reply import CancelledError, ReplyTimeout
from server.models.signature_choice import examples_signature
from server.protocols.tfserving import json_codec
from server.signature import SignatureInfo
from server.telemetry import measure, metrics
from server.telemetry.payloads import capture
from server.tensors.declared import check_rows
from server.tensors.validate import validate_inputs


def tfserving_predict(served: ModelVersion, body: Any, timeout: float) -> dict[str, Any]:
    """TF Serving's predict without a handler, row or columnar, through the executor: the response body."""
    started = time.perf_counter()
    decoded = json_codec.decode_predict(body, lambda name: rest_predict_signature(served, name), served.config)
    _, outputs = predict(served, decoded.signature_name, decoded.inputs, started, timeout)
    return json_codec.encode_predict(outputs, decoded.row_format)


def rest_predict_signature(served: ModelVersion, name: str) -> SignatureInfo:
    """The signature a REST predict body names, or TF Serving's INVALID_ARGUMENT (http_rest_api_handler.cc GetInfoMap)."""
    if name not in served.servable.signatures:
        raise InvalidArgument(f'Serving signature name: "{name}" not found in signature def')
    return served.signature(name)


def predict(
    served: ModelVersion, signature_name: str, inputs: dict[str, np.ndarray], decode_started: float, timeout: float,
) -> tuple[SignatureInfo, dict[str, np.ndarray]]:
    """The flow every predict API shares, on this thread: check the decoded inputs against the signature, run them, wait."""
    return run_blocking(predict_steps(served, signature_name, inputs, decode_started, timeout))


def predict_steps(
    served: ModelVersion, signature_name: str, inputs: dict[str, np.ndarray], decode_started: float, timeout: float,
) -> Steps[tuple[SignatureInfo, dict[str, np.ndarray]]]:
    """predict() as a flow (server.models.flow): its driver waits for the model."""
    signature = served.signature(signature_name)
    fed, rows = validate_inputs(inputs, signature, served.config)
    measure.stage("decode", time.perf_counter() - decode_started)
    batchable = signature.batchable and all(a.ndim >= 1 for a in fed.values())
    outputs = yield from infer_steps(served, signature.name, fed, rows, batchable, timeout)
    return signature, outputs


def infer(
    served: ModelVersion, signature: str, inputs: dict[str, np.ndarray], rows: int, batchable: bool, timeout: float,
) -> dict[str, np.ndarray]:
    """Queue the inputs on the version's executor and wait for its rows on this thread, within `timeout` seconds."""
    return run_blocking(infer_steps(served, signature, inputs, rows, batchable, timeout))


def infer_steps(
    served: ModelVersion, signature: str, inputs: dict[str, np.ndarray], rows: int, batchable: bool, timeout: float,
) -> Steps[dict[str, np.ndarray]]:
    """infer() as a flow (server.models.flow): queue the job, yield the wait for its rows.

    A request that gives up (its deadline) abandons its job: the executor stops its rows at the next
    max_batch_size chunk. A job abandoned while the flow waits (its gRPC client cancelled: the
    transport, or a flow closed) ends the request as Cancelled. Every API checked its rows before
    decoding; this is the backstop for any path.
    """
    executor = served.executor
    assert executor is not None
    check_rows(rows, served.config.max_request_rows)
    inference = measure.current()
    trace = inference.trace if inference is not None else None
    if trace is not None:
        trace.rows += rows
        trace.signature = signature
    job = executor.submit(signature, inputs, rows, batchable, trace.span.get_span_context() if trace else None)
    wait = Wait(executor, job, timeout)
    try:
        outputs = yield wait
    except (CancelledError, Abandoned):  # NOTE: the transport abandoned the job while the flow waited
        wait.abandon()
        raise Cancelled(f"the call to model {served.name} version {served.version} was cancelled") from None
    except GeneratorExit:  # the flow was closed unfinished: nobody waits for these rows
        wait.abandon()
        raise
    except ReplyTimeout:
        wait.abandon()
        metrics.record(lambda: metrics.REJECTED_REQUESTS.labels(served.name, "deadline").inc())
        raise DeadlineExceeded(
            f"model {served.name} version {served.version} did not answer within {timeout}s"
        ) from None
    finally:
        # A request that gave up (deadline) still shows where it waited: in the queue, or in the call.
        now = time.monotonic()
        measure.stage("queue", (job.started or now) - job.enqueued, job.started or now)
        if job.started:
            measure.stage("compute", (job.finished or now) - job.started, job.finished or now)
    return outputs


def examples_steps(
    served: ModelVersion, signature: SignatureInfo, serialized: np.ndarray, decode_started: float, timeout: float,
) -> Steps[dict[str, np.ndarray]]:
    """Serialized tf.Examples through a signature that takes them (examples_signature), as a flow."""
    if capture.ON:
        capture.tensors(measure.current(), {"inputs": serialized})
    measure.stage("decode", time.perf_counter() - decode_started)
    outputs = yield from infer_steps(served, signature.name, {"inputs": serialized}, len(serialized), signature.batchable,
                                     timeout)
    return outputs


def multi_inference_steps(
    served: ModelVersion, tasks: list[tuple[SignatureInfo, str]], serialized: np.ndarray, decode_started: float,
    timeout: float,
) -> Steps[list[dict[str, np.ndarray]]]:
    """MultiInference: the same tf.Examples through each task's signature, one call each, in task order."""
    if capture.ON:
        capture.tensors(measure.current(), {"inputs": serialized})
    measure.stage("decode", time.perf_counter() - decode_started)
    results = []
    deadline = time.monotonic() + timeout
    for signature, _ in tasks:
        results.append((yield from infer_steps(served, signature.name, {"inputs": serialized}, len(serialized),
                                               signature.batchable, max(deadline - time.monotonic(), 0.0))))
    return results


def examples(served: ModelVersion, signature_name: str, serialized: np.ndarray, method: str, decode_started: float,
             timeout: float) -> tuple[SignatureInfo, dict[str, Any]]:
    """A Classify/Regress request's signature checked and its examples run, on this thread."""
    signature = examples_signature(served, signature_name, method)
    return signature, run_blocking(examples_steps(served, signature, serialized, decode_started, timeout))
