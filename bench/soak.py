"""Soak: 64 concurrent clients (or --connections) for 60 s; errors, the slowest request and each worker's memory over time.

    .venv/bin/python -m bench.soak [--seconds 60] [--connections 64] [--workload mlp]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
from pathlib import Path

from bench import models
from bench.load import run_wrk
from bench.run import request_bodies
from tests.support.harness import Server


def rss_mb(pid: int) -> float:
    """Resident memory of a process in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--workload", choices=("mlp", "cnn"), default="mlp")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="forkserve-soak-"))
    models.build(work / "models")
    server = Server(models_dir=work / "models", run_dir=work / "run", workers=2).start()
    samples: dict[int, list[float]] = {pid: [] for pid in server.worker_pids()}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(5):
            for pid in samples:
                samples[pid].append(rss_mb(pid))

    try:
        for pid in samples:
            samples[pid].append(rss_mb(pid))
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        result = run_wrk(f"{server.url}/v1/models/{args.workload}:predict", request_bodies()[args.workload], args.connections,
                         args.seconds, threads=min(2, args.connections))
        done.set()
        sampler.join()
        for pid in samples:
            samples[pid].append(rss_mb(pid))
        restarts = set(server.worker_pids()) != set(samples)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"| {args.seconds} s, {args.connections} connections ({args.workload.upper()}, wrk) | value |")
    print("|---|---|")
    print(f"| requests | {result.requests} ({result.requests_per_second:.0f}/s) |")
    print(f"| errors (non-2xx + socket) | {result.errors} |")
    print(f"| p50 / p99 / max | {result.p50_seconds * 1000:.1f} / {result.p99_seconds * 1000:.1f} / {result.max_seconds * 1000:.1f} ms |")
    print(f"| worker restarts | {'yes' if restarts else 'none'} |")
    for pid, values in samples.items():
        growth = (values[-1] - values[0]) / values[0] * 100
        print(f"| worker {pid} RSS start / max / end | {values[0]:.0f} / {max(values):.0f} / {values[-1]:.0f} MB ({growth:+.1f} %) |")


if __name__ == "__main__":
    main()
