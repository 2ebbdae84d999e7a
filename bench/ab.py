"""Two forkserve configurations side by side: the A/B behind every "kept" or "not kept" in docs/performance.md.

    .venv/bin/python -m bench.ab --a FORKSERVE_PIN_CPUS=0 --b FORKSERVE_PIN_CPUS=auto [--noisy] \
        [--workloads mlp cnn] [--connections 1 16 64] [--seconds 6] [--rounds 3]

Both servers (2 workers each, the bench models) run at once; each round measures every cell on A
then B, or B then A on odd rounds, so drift hits both. Besides wrk's req/s and latencies, each cell
records the workers' CPU per request (utime + stime from /proc), the steadier figure on a shared
machine. `--noisy` adds the cells with one core kept busy by a CPU-bound process. Prints a table of
medians [min-max] and the B/A ratio; writes ab.md into --out.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import statistics
import tempfile
from pathlib import Path

from bench import models
from bench.common import NoisyNeighbour, arguments, process_cpu_seconds, save_table
from bench.load import LoadResult, run_wrk
from bench.run import request_bodies
from tests.e2e.harness import Server

def parse_env(assignments: list[str]) -> dict[str, str]:
    """["NAME=value", ...] -> a dict (an empty list is the defaults)."""
    return dict(item.split("=", 1) for item in assignments)


def worker_cpu_seconds(server: Server) -> float:
    """utime + stime of the server's workers so far."""
    return process_cpu_seconds(server.worker_pids())


def cell(server: Server, workload: str, body: bytes, connections: int, seconds: float) -> tuple[LoadResult, float]:
    """One wrk run after a 1 s warm-up: its result and the workers' CPU milliseconds per request."""
    url = f"{server.url}/v1/models/{workload}:predict"
    run_wrk(url, body, connections, 1)
    before = worker_cpu_seconds(server)
    result = run_wrk(url, body, connections, seconds)
    return result, (worker_cpu_seconds(server) - before) / max(result.requests, 1) * 1000


def main() -> None:
    parser = arguments(__doc__, seconds=6.0)
    parser.add_argument("--a", nargs="*", default=[], metavar="NAME=value", help="environment of server A")
    parser.add_argument("--b", nargs="*", default=[], metavar="NAME=value", help="environment of server B")
    parser.add_argument("--workloads", nargs="+", default=["mlp", "cnn"], choices=("mlp", "cnn"))
    parser.add_argument("--connections", nargs="+", type=int, default=[1, 16, 64])
    parser.add_argument("--noisy", action="store_true", help="also measure with one core kept busy")
    args = parser.parse_args()
    bodies = request_bodies()
    measured: dict[tuple, list[tuple[LoadResult, float]]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="forkserve-ab-") as work:
        models.build(Path(work) / "models")
        servers = {
            name: Server(models_dir=Path(work) / "models", run_dir=Path(work) / f"run-{name}", workers=2,
                         env={"TF_CPP_MIN_LOG_LEVEL": "3", **parse_env(assignments)})
            for name, assignments in (("A", args.a), ("B", args.b))
        }
        try:
            for server in servers.values():
                server.start()
            for round_number in range(args.rounds):
                order = ["A", "B"] if round_number % 2 == 0 else ["B", "A"]
                for condition in ("quiet", "noisy") if args.noisy else ("quiet",):
                    for workload in args.workloads:
                        for connections in args.connections:
                            for name in order:
                                with NoisyNeighbour() if condition == "noisy" else contextlib.nullcontext():
                                    result, cpu = cell(servers[name], workload, bodies[workload], connections, args.seconds)
                                measured[(condition, workload, connections, name)].append((result, cpu))
                                print(f"round {round_number + 1} {condition} {workload} c={connections:<3d} {name} "
                                      f"{result.requests_per_second:8.1f} req/s p50 {result.p50_seconds * 1000:6.2f} "
                                      f"p99 {result.p99_seconds * 1000:7.2f} cpu/req {cpu:.3f} ms errors {result.errors}",
                                      flush=True)
        finally:
            for server in servers.values():
                server.stop()
    save_table(args.out, "ab.md", report(measured, args))


def report(measured: dict, args: argparse.Namespace) -> str:
    """One row per cell and server: medians [min-max], and B against A."""
    lines = [f"# A: {' '.join(args.a) or '(defaults)'}  B: {' '.join(args.b) or '(defaults)'}", "",
             f"2 workers each, wrk -t1, {args.rounds} interleaved rounds of {args.seconds:.0f} s, median [min-max]", "",
             "| condition | workload | conc. | server | req/s | p50 ms | p99 ms | slowest ms | worker CPU ms/req | errors | B/A req/s | B/A CPU |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(measured):
        condition, workload, connections, name = key
        runs = measured[key]
        rps = [r.requests_per_second for r, _ in runs]
        cpu = statistics.median(c for _, c in runs)
        ratios = " |"
        if name == "B":
            a_runs = measured[(condition, workload, connections, "A")]
            ratios = (f"{statistics.median(rps) / statistics.median(r.requests_per_second for r, _ in a_runs):.2f} | "
                      f"{cpu / statistics.median(c for _, c in a_runs):.2f}")
        lines.append(
            f"| {condition} | {workload} | {connections} | {name} | {statistics.median(rps):.0f} [{min(rps):.0f}-{max(rps):.0f}] "
            f"| {statistics.median(r.p50_seconds for r, _ in runs) * 1000:.2f} "
            f"| {statistics.median(r.p99_seconds for r, _ in runs) * 1000:.2f} "
            f"| {statistics.median(r.max_seconds for r, _ in runs) * 1000:.1f} | {cpu:.3f} "
            f"| {sum(r.errors for r, _ in runs)} | {ratios} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
