"""The in-process limit: a warm concrete function at batch 1 and at its best batch size.

    .venv/bin/python -m bench.inprocess MODEL.keras   (prints JSON)
Runs in its own process with the threads one forkserve worker gets (intra-op = CPUs / workers).
"""

from __future__ import annotations

import json
import os
import sys
import time

BATCHES = (1, 2, 4, 8, 16, 32, 64)


def per_sample_seconds(function, inputs, batch: int, seconds: float = 1.5) -> float:  # noqa: ANN001
    """Median-free simple timing: total time over as many calls as fit in `seconds`, per sample."""
    calls = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        function(inputs).numpy()
        calls += 1
    return (time.perf_counter() - started) / (calls * batch)


def main() -> None:
    import numpy as np
    import tensorflow as tf

    threads = int(os.environ.get("INTRA_OP_THREADS", "1"))
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    model = keras.saving.load_model(sys.argv[1], compile=False)
    spec = tf.TensorSpec((None,) + tuple(model.inputs[0].shape[1:]), tf.float32)
    concrete = tf.function(lambda x: model(x, training=False), input_signature=[spec]).get_concrete_function()
    results = {}
    for batch in BATCHES:
        x = tf.constant(np.random.default_rng(0).random((batch,) + tuple(model.inputs[0].shape[1:]), dtype=np.float32))
        per_sample_seconds(concrete, x, batch, 0.3)  # warm
        results[batch] = per_sample_seconds(concrete, x, batch)
    best = min(results, key=results.get)
    print(json.dumps({"batch1_seconds": results[1], "best_batch": best, "best_per_sample_seconds": results[best],
                      "per_sample_seconds": results, "intra_op_threads": threads}))


if __name__ == "__main__":
    main()
