"""How evenly keep-alive connections land on the workers, directly and through nginx, balancing on and off.

    .venv/bin/python -m bench.connections [--seconds 8] [--rounds 3] [--out bench/results]

Two forkserve instances (2 workers each) over the same models run at once, one with
FORKSERVE_BALANCE_CONNECTIONS=1 (the default) and one with 0. wrk opens 64 keep-alive
connections, straight to gunicorn or through the shipped conf/nginx.conf; every second `ss`
counts the established connections each worker holds, and the cell reports the largest share
one worker held after the first two seconds, with req/s and p99. Cells interleave round by round.
Writes connections.md into --out.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from bench import models
from bench.common import arguments, save_table
from bench.load import LoadResult, run_wrk
from bench.run import request_bodies
from tests.support.harness import Server
from tests.support.nginx import Nginx

CONNECTIONS = 64


def worker_shares(port: int) -> list[int]:
    """Established connections to `port` per owning process, largest first."""
    listing = subprocess.run(["ss", "-tnpH", "state", "established", f"( sport = :{port} )"],
                             capture_output=True, text=True, check=True).stdout
    return sorted(collections.Counter(re.findall(r"pid=(\d+)", listing)).values(), reverse=True)


def cell(url: str, port: int, body: bytes, seconds: float) -> tuple[LoadResult, float]:
    """One wrk run; its result and the largest share of connections one worker held (sampled each second)."""
    worst: list[float] = []
    done = threading.Event()

    def sample() -> None:
        time.sleep(2)
        while not done.wait(1.0):
            shares = worker_shares(port)
            if sum(shares):
                worst.append(shares[0] / sum(shares))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = run_wrk(url, body, CONNECTIONS, seconds, threads=2)
    finally:
        done.set()
        sampler.join()
    return result, max(worst, default=0.0)


def main() -> None:
    parser = arguments(__doc__)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="forkserve-connections-"))
    models.build(work / "models")
    bodies = request_bodies()
    servers = {flag: Server(models_dir=work / "models", run_dir=work / f"run-{flag}", workers=2,
                            env={"FORKSERVE_BALANCE_CONNECTIONS": flag, "TF_CPP_MIN_LOG_LEVEL": "3"}) for flag in ("1", "0")}
    proxies: dict[str, Nginx] = {}
    measured: dict[tuple[str, str, str], list[tuple[LoadResult, float]]] = collections.defaultdict(list)
    try:
        for flag, server in servers.items():
            server.start()
            proxies[flag] = Nginx(work / f"nginx-{flag}", [server.port])
        for round_number in range(args.rounds):
            for workload in ("cnn", "mlp"):
                for route in ("direct", "nginx"):
                    for flag, server in servers.items():
                        base = server.url if route == "direct" else proxies[flag].url
                        result, worst = cell(f"{base}/v1/models/{workload}:predict", server.port, bodies[workload], args.seconds)
                        balancing = "on" if flag == "1" else "off"
                        measured[(workload, route, balancing)].append((result, worst))
                        print(f"round {round_number + 1} {workload} {route:6s} balancing {balancing:3s} "
                              f"{result.requests_per_second:7.0f} req/s p99 {result.p99_seconds * 1000:7.2f} ms "
                              f"busiest worker {worst:.0%} errors {result.errors}", flush=True)
    finally:
        for proxy in proxies.values():
            proxy.stop()
        for server in servers.values():
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    table = report(measured, args)
    save_table(args.out, "connections.md", table)


def report(measured: dict, args: argparse.Namespace) -> str:
    """Medians and ranges per cell."""
    lines = [f"# Connections per worker: {CONNECTIONS} keep-alive connections, 2 workers, "
             f"{args.rounds} interleaved rounds of {args.seconds:.0f} s (median [min-max])", "",
             "| workload | route | balancing | busiest worker's share | req/s | p99 ms | errors |", "|---|---|---|---|---|---|---|"]
    for (workload, route, balancing), runs in sorted(measured.items()):
        shares = [worst for _, worst in runs]
        rps = [r.requests_per_second for r, _ in runs]
        p99 = [r.p99_seconds * 1000 for r, _ in runs]
        lines.append(f"| {workload} | {route} | {balancing} | {statistics.median(shares):.0%} [{min(shares):.0%}-{max(shares):.0%}] "
                     f"| {statistics.median(rps):.0f} [{min(rps):.0f}-{max(rps):.0f}] "
                     f"| {statistics.median(p99):.1f} [{min(p99):.1f}-{max(p99):.1f}] | {sum(r.errors for r, _ in runs)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
