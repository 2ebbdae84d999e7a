"""Where a worker's time goes under load: py-spy samples one worker while wrk drives the server.

    .venv/bin/python -m bench.spy --env OTEL_EXPORTER_OTLP_ENDPOINT={otlp} OTEL_TRACES_SAMPLER_ARG=0.01 \
        --match tracing.py --match OtelBatchSpan --workload mlp --connections 16 --seconds 12

Prints the share of the worker's samples (every thread, idle waits left out) whose stack holds
any `--match` string (a file, function or thread name), and keeps the raw profile. The share is
the figure a noisy machine cannot hide: an end-to-end A/B here moves +-10 % between two identical
servers, a feature's own share of the samples does not.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import models
from bench.ab import parse_env
from bench.load import run_wrk
from bench.otlp_sink import OtlpSink
from bench.run import request_bodies
from tests.support.harness import Server


def share(profile: Path, matches: list[str]) -> tuple[int, int]:
    """(samples whose stack holds one of `matches`, all samples) of a py-spy raw profile."""
    matched = total = 0
    for line in profile.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        total += int(count)
        if any(match in stack for match in matches):
            matched += int(count)
    return matched, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", nargs="*", default=[], metavar="NAME=value", help="the server's environment ({work}, {otlp})")
    parser.add_argument("--match", action="append", default=[], help="a string a counted stack holds (repeatable)")
    parser.add_argument("--workload", choices=("mlp", "cnn", "cnn_heavy"), default="mlp")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--py-spy", default=str(Path(sys.executable).with_name("py-spy")), help="the py-spy binary (requirements-dev.txt)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/forkserve-spy.txt"), help="the raw profile")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="forkserve-spy-") as work, OtlpSink() as sink:
        models.build(Path(work) / "models", (args.workload,))
        env = {"TF_CPP_MIN_LOG_LEVEL": "3", **parse_env(args.env, {"work": work, "otlp": sink.url})}
        server = Server(models_dir=Path(work) / "models", run_dir=Path(work) / "run", workers=2, env=env)
        server.start()
        try:
            url = f"{server.url}/v1/models/{args.workload}:predict"
            body = request_bodies()[args.workload]
            run_wrk(url, body, args.connections, 2)  # warm: batch sizes seen, connections spread
            spy = subprocess.Popen([args.py_spy, "record", "-p", str(server.worker_pids()[0]), "-d", str(int(args.seconds)),
                                    "-r", str(args.rate), "-f", "raw", "-o", str(args.out), "--nonblocking", "-t"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            started = time.monotonic()
            result = run_wrk(url, body, args.connections, args.seconds)
            spy.wait(timeout=args.seconds + 30 - (time.monotonic() - started))
        finally:
            server.stop()
    matched, total = share(args.out, args.match)
    print(f"{result.requests_per_second:.0f} req/s; {matched} of {total} samples "
          f"({100 * matched / max(total, 1):.2f} %) hold {' or '.join(args.match) or '(nothing)'}; profile {args.out}")


if __name__ == "__main__":
    main()
