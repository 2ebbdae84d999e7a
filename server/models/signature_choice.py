"""Which signature a TF Serving request runs on, by TF Serving's checks and messages (gRPC, REST and warm-up records).

Runs in workers; the dataplane's flows (server.dataplane.inference) and the warm-up replay
(server.models.warmup_records) choose through it.
"""

from __future__ import annotations

from typing import Any

from server.errors import FailedPrecondition
from server.models.registry import ModelVersion
from server.protocols.tfserving import examples as tfserving_examples
from server.signature import DEFAULT_SIGNATURE, SignatureInfo


def predict_signature(served: ModelVersion, name: str) -> SignatureInfo:
    """The signature a PredictRequest (gRPC, warm-up) names, or TF Serving's FAILED_PRECONDITION (predict_util.cc)."""
    key = name or DEFAULT_SIGNATURE
    if key not in served.servable.signatures:
        raise FailedPrecondition(f'Serving signature key "{key}" not found.')
    return served.signature(key)


def examples_signature(served: ModelVersion, signature_name: str, method: str) -> SignatureInfo:
    """The signature a Classify/Regress request names, by TF Serving's checks and messages (server.protocols.tfserving.examples)."""
    checked = tfserving_examples.examples_signature(served.servable.signature_defs, signature_name, method)
    return served.signature(checked.name)


def multi_inference_checked(served: ModelVersion, tasks: Any) -> list[tuple[SignatureInfo, str]]:
    """A MultiInferenceRequest's tasks (InferenceTask messages) as (callable signature, method), by TF Serving's checks."""
    checked = tfserving_examples.multi_inference_tasks(
        [(t.model_spec.name, t.model_spec.signature_name, t.method_name) for t in tasks], served.servable.signature_defs)
    return [(served.signature(signature.name), method) for signature, method in checked]
