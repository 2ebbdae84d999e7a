"""The inference flow every API shares: examples on their signature, and a job its transport abandons ends the request cancelled."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from server.config import ModelConfig
from server.dataplane.inference import examples, infer
from server.errors import Cancelled, InvalidArgument
from server.models.executor import Abandoned, ModelExecutor
from server.signature import SignatureInfo, TensorInfo

EXAMPLES = {"inputs": TensorInfo("inputs", "string", (None,))}
SIGNATURES = {
    "classify_x": SignatureInfo("classify_x", "classify", EXAMPLES, {"scores": TensorInfo("scores", "float32", (None, 1))}),
    "serving_default": SignatureInfo("serving_default", "predict", EXAMPLES, {"scores": TensorInfo("y", "float32", (None, 1))}),
    "floats": SignatureInfo("floats", "classify", {"x": TensorInfo("x", "float32", (None, 1))}, {"scores": TensorInfo("y", "float32", (None, 1))}),
}


def test_a_job_the_transport_abandons_while_its_request_waits_ends_the_request_cancelled() -> None:
    running, gate = threading.Event(), threading.Event()

    def run(signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        running.set()
        assert gate.wait(10)
        return {"y": inputs["x"]}

    executor = ModelExecutor("m/1", run, 1, 0.0, 100)  # one row a call: 3 rows are 3 calls
    executor.start()
    version = SimpleNamespace(executor=executor, config=ModelConfig(), name="m", version=1)
    jobs, submitted = [], threading.Event()
    submit = executor.submit

    def submit_and_keep(*args: object, **kwargs: object) -> object:
        jobs.append(submit(*args, **kwargs))  # type: ignore[arg-type]
        submitted.set()
        return jobs[-1]

    executor.submit = submit_and_keep  # type: ignore[method-assign]

    def client_cancels() -> None:  # what the gRPC transport does when its client cancels the call
        assert running.wait(10) and submitted.wait(10)
        executor.abandon(jobs[0])
        gate.set()

    canceller = threading.Thread(target=client_cancels)
    canceller.start()
    with pytest.raises(Cancelled, match="model m version 1 was cancelled") as cancelled:
        infer(version, "serving_default", {"x": np.zeros((3, 2), np.float32)}, 3, True, timeout=10)
    canceller.join()
    assert cancelled.value.status == 499
    with pytest.raises(Abandoned, match="after 1 of 3 rows"):  # it stopped after its first row
        jobs[0].future.result(timeout=0)


def test_examples_run_on_a_signature_that_takes_them_and_are_refused_elsewhere_in_tf_servings_words() -> None:
    executor = ModelExecutor("m/1", lambda signature, inputs: {"scores": np.ones((len(inputs["inputs"]), 1), np.float32)},
                             8, 0.0, 100)
    executor.start()
    version = SimpleNamespace(executor=executor, config=ModelConfig(), name="m", version=1, signature=SIGNATURES.__getitem__,
                              servable=SimpleNamespace(signature_defs=SIGNATURES))
    serialized = np.array([b"example-1", b"example-2"], dtype=object)
    signature, outputs = examples(version, "classify_x", serialized, "classify", 0.0, timeout=10)
    assert signature.name == "classify_x" and outputs["scores"].shape == (2, 1)
    # a predict-method signature of the right tensors is classified, as TF Serving does (TF2's classify_x_to_y)
    assert examples(version, "", serialized, "classify", 0.0, timeout=10)[0].name == "serving_default"
    with pytest.raises(InvalidArgument, match="^No regression outputs found in SignatureDef: "):
        examples(version, "classify_x", serialized, "regress", 0.0, timeout=10)
    with pytest.raises(InvalidArgument, match="^No classification inputs found in SignatureDef: "):
        examples(version, "floats", serialized, "classify", 0.0, timeout=10)
    with pytest.raises(InvalidArgument, match="^No signature was found with the name: nope$"):
        examples(version, "nope", serialized, "classify", 0.0, timeout=10)
