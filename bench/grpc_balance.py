"""How gRPC calls spread over 2 workers with 1, 4 and 16 client channels (one TF Serving stub each).

    .venv/bin/python -m bench.grpc_balance [--channels 1 4 16] [--rounds 3] [--seconds 30] [--age 30] [--no-balance]

2-worker forkserve over an MLP; each channel is one client thread calling Predict in a closed loop
for the whole run, as a long-lived TF Serving client does. The worker that answered each call is
read from the `x-forkserve-worker` trailing metadata. Each round opens fresh channels (the kernel
hashes them anew). Reported per channel count and round: the largest share one worker carried over
the window and over its worst 5 s slice, and how often a worker stopped listening on a socket (the log).
Goal: with >= 4 channels no worker above 60 % over the window.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import numpy as np
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from bench import models
from tests.support.harness import Server, free_port

SLICE = 5.0


def request() -> predict_pb2.PredictRequest:
    """A 2-row Predict for the MLP (20 features)."""
    import tensorflow as tf

    message = predict_pb2.PredictRequest()
    message.model_spec.name = "mlp"
    message.inputs["features"].CopyFrom(tf.make_tensor_proto(np.full((2, 20), 0.5, np.float32)))
    return message


def targets(port: int, channels: int) -> list[str]:
    """One loopback address per channel (127.0.0.1, .2, ...): distinct connections, as from distinct clients.

    NOTE: grpcio shares one connection between the channels of a process that have the same
    address and arguments (its global subchannel pool); separate clients would not.
    """
    return [f"127.0.0.{i % 250 + 1}:{port}" for i in range(channels)]


def drive(port: int, channels: int, seconds: float) -> tuple[list[tuple[float, str]], int]:
    """`channels` closed-loop clients for `seconds`: (time, worker) of each answer, and the failures."""
    message = request()
    answers: list[tuple[float, str]] = []
    failures = [0]
    lock = threading.Lock()
    stop = threading.Event()

    def client(target: str) -> None:
        with grpc.insecure_channel(target) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            while not stop.is_set():
                try:
                    _, call = stub.Predict.with_call(message, timeout=30)
                    worker = dict(call.trailing_metadata())["x-forkserve-worker"]
                    with lock:
                        answers.append((time.monotonic(), worker))
                except grpc.RpcError:
                    with lock:
                        failures[0] += 1

    threads = [threading.Thread(target=client, args=(target,), daemon=True) for target in targets(port, channels)]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(60)
    return answers, failures[0]


def shares(answers: list[tuple[float, str]]) -> tuple[float, float]:
    """The largest share one worker carried over the window, and the worst one over a SLICE."""
    def top(part: list[tuple[float, str]]) -> float:
        counts = Counter(worker for _, worker in part)
        return max(counts.values()) / len(part) if part else 0.0

    start = answers[0][0]
    slices: dict[int, list[tuple[float, str]]] = {}
    for answer in answers:
        slices.setdefault(int((answer[0] - start) // SLICE), []).append(answer)
    full = [part for part in slices.values() if len(part) > 10]
    return top(answers), max((top(part) for part in full[:-1] or full), default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=3, help="fresh channels per channel count")
    parser.add_argument("--age", type=float, default=None, help="FORKSERVE_GRPC_MAX_CONNECTION_AGE (default: the server's)")
    parser.add_argument("--no-balance", action="store_true", help="FORKSERVE_BALANCE_CONNECTIONS=0 (no shedding)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="forkserve-grpc-balance-"))
    files = models.build(work / "source", ("mlp",))
    (work / "models" / "mlp").mkdir(parents=True)
    shutil.copytree(files["mlp"].parent, work / "models" / "mlp" / "1")
    env = {}
    if args.age is not None:
        env["FORKSERVE_GRPC_MAX_CONNECTION_AGE"] = str(args.age)
    if args.no_balance:
        env["FORKSERVE_BALANCE_CONNECTIONS"] = "0"
    port = free_port()
    env["FORKSERVE_GRPC_BIND"] = f"0.0.0.0:{port}"  # every loopback address (targets)
    server = Server(models_dir=work / "models", run_dir=work / "run", workers=2, grpc_port=port, env=env).start()
    try:
        print(f"| channels | round | calls | failed | top worker, window | worst {SLICE:.0f} s slice | pauses |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for channels in args.channels:
            for round_ in range(args.rounds):
                before = server.log().count("stopped listening on one socket")
                answers, failed = drive(port, channels, args.seconds)
                window, worst = shares(answers)
                pauses = server.log().count("stopped listening on one socket") - before
                print(f"| {channels} | {round_ + 1} | {len(answers)} | {failed} | {window:.0%} | {worst:.0%} | {pauses} |",
                      flush=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
