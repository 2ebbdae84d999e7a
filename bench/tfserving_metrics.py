"""CPU per request of forkserve's request metrics with TF Serving's latency histograms off and on (in-process).

    .venv/bin/python -m bench.tfserving_metrics [--requests 20000] [--rounds 7]

Runs measure.begin .. record .. release as a TF Serving predict does, with the buffer flushed every
500 requests into a multiprocess directory of its own, FORKSERVE_TFSERVING_METRICS_PATH off then on
(server.telemetry.measure.TFSERVING), interleaved; prints the median process CPU per request.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def per_request_us(requests: int, on: bool) -> float:
    """Process CPU µs per measured request, its share of the flushes included."""
    from server.telemetry import measure
    from server.telemetry.buffer import BUFFER

    measure.TFSERVING = on
    started = time.process_time()
    for index in range(requests):
        measure.begin("mlp", "tfserving_predict")
        measure.set_version(1)
        for stage, seconds in (("decode", 1e-4), ("queue", 2e-4), ("compute", 3e-4), ("encode", 1e-4)):
            measure.stage(stage, seconds)
        measure.record(200)
        measure.release()
        if index % 500 == 499:
            BUFFER.flush()
    BUFFER.flush()
    return (time.process_time() - started) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:  # prometheus_client picks its value class at import: a child of its own
        with tempfile.TemporaryDirectory(prefix="bench-tfs-metrics-") as directory:
            env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": directory}
            sys.exit(subprocess.run([sys.executable, "-m", "bench.tfserving_metrics", *sys.argv[1:]], env=env).returncode)
    per_request_us(2000, False), per_request_us(2000, True)  # warm: the series' files exist
    results: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.rounds):
        for on in (False, True):
            results[on].append(per_request_us(args.requests, on))
    off, on = statistics.median(results[False]), statistics.median(results[True])
    rounded = {key: [round(value, 1) for value in sorted(values)] for key, values in results.items()}
    print(f"off {off:.1f} µs CPU per request, on {on:.1f} µs (+{on - off:.1f} µs); rounds off {rounded[False]}, on {rounded[True]}")


if __name__ == "__main__":
    main()
