"""A/B: forkserve over gRPC with FORKSERVE_GRPC_MAX_CONNECTION_AGE at its default (5 s) against 0 (never).

    .venv/bin/python -m bench.grpc_age [--rounds 3] [--seconds 6] [--connections 16]

The MLP, V2 ModelInfer with raw_input_contents, h2load (bench.grpc_load), two 2-worker servers
measured in interleaved rounds; prints each run and the medians. Shows what the periodic GOAWAY
costs a load generator that does not move its next call at a GOAWAY (h2load).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np
import requests

from bench import models
from bench.grpc_load import checked_call, run_h2load
from bench.peers_grpc import v2_request
from tests.support.harness import Server

SETTINGS = {"age 5 s (default)": {}, "age 0 (never)": {"FORKSERVE_GRPC_MAX_CONNECTION_AGE": "0"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="grpc-age-"))
    models.build(work / "models", ("mlp",))
    servers = {name: Server(models_dir=work / "models", run_dir=work / f"run-{i}", workers=2,
                            env={"TF_CPP_MIN_LOG_LEVEL": "3", **env}) for i, (name, env) in enumerate(SETTINGS.items())}
    try:
        for server in servers.values():
            server.start()
        spec = requests.get(servers["age 5 s (default)"].url + "/v2/models/mlp", timeout=10).json()["inputs"][0]
        x = np.random.default_rng(0).random([1, *spec["shape"][1:]]).astype("float32")
        calls = {name: checked_call(server.grpc_target, "/inference.GRPCInferenceService/ModelInfer",
                                    v2_request("mlp", spec["name"], x)) for name, server in servers.items()}
        results: dict[str, list] = {name: [] for name in servers}
        for round_ in range(args.rounds):
            for name, call in calls.items():
                result = run_h2load(call, args.connections, args.seconds)
                results[name].append(result)
                print(f"round {round_ + 1} {name:18} {result.requests_per_second:7.0f} req/s "
                      f"p99 {result.p99_seconds * 1000:6.2f} ms errors {result.errors}", flush=True)
        for name, runs in results.items():
            print(f"{name:18} median {statistics.median(r.requests_per_second for r in runs):7.0f} req/s, "
                  f"errors {[r.errors for r in runs]}")
    finally:
        for server in servers.values():
            server.stop()


if __name__ == "__main__":
    main()
