"""Two forkserve configurations side by side: the A/B behind every "kept" or "not kept" in docs/performance.md.

    .venv/bin/python -m bench.ab --a FORKSERVE_PIN_CPUS=0 --b FORKSERVE_PIN_CPUS=auto [--noisy] \
        [--variant C NAME=value ...] [--workloads mlp cnn] [--connections 1 16 64] [--seconds 6] [--rounds 3] \
        [--a-root /path/to/other/checkout]

Both servers (2 workers each, the bench models) run at once; each round measures every cell on A
then B, or B then A on odd rounds, so drift hits both. `--variant LABEL NAME=value ...` adds more
servers, measured in a rotating order and compared with A. In a value, `{work}` is the run's
scratch directory and `{otlp}` the URL of an OTLP/HTTP receiver this run starts (bench.otlp_sink). Besides wrk's req/s and latencies, each cell
records the workers' CPU per request (utime + stime from /proc), the steadier figure on a shared
machine. `--a-root` runs server A from another checkout (`git worktree add /tmp/base COMMIT`: the
code before a change against this one, in the same run). `--noisy` adds the cells with one core kept busy by a CPU-bound process. Prints a table of
medians [min-max] and the B/A ratio; writes ab.md into --out.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import models
from bench.common import NoisyNeighbour, arguments, batching_totals, process_cpu_seconds, rss_mib, save_table
from bench.load import LoadResult, run_wrk
from bench.otlp_sink import OtlpSink
from bench.run import request_bodies
from tests.support.harness import Server

METRICS_SETTLE_SECONDS = 1.2  # a worker writes its metrics every 0.5 s (server.telemetry.flusher)


def parse_env(assignments: list[str], places: dict[str, str] | None = None) -> dict[str, str]:
    """["NAME=value", ...] -> a dict (an empty list is the defaults); `{work}`, `{otlp}` in values filled from `places`."""
    pairs = (item.split("=", 1) for item in assignments)
    return {name: value.format(**places) if places else value for name, value in pairs}


def worker_cpu_seconds(server: Server) -> float:
    """utime + stime of the server's workers so far."""
    return process_cpu_seconds(server.worker_pids())


@dataclass
class Cell:
    """One measurement: wrk's result and what the server's workers report of it."""

    load: LoadResult
    cpu_ms: float  # workers' CPU per request
    batch_rows: float  # mean rows per TensorFlow call
    thread_wait_ms: float  # mean wait for a request thread
    rss_mib: float  # per worker, at the end


def cell(server: Server, workload: str, body: bytes, connections: int, seconds: float) -> Cell:
    """One wrk run after a 1 s warm-up, with the workers' CPU, batch sizes and thread waits over it."""
    url = f"{server.url}/v1/models/{workload}:predict"
    run_wrk(url, body, connections, 1)
    time.sleep(METRICS_SETTLE_SECONDS)
    totals = batching_totals(server.url, workload)
    before = worker_cpu_seconds(server)
    result = run_wrk(url, body, connections, seconds)
    cpu_ms = (worker_cpu_seconds(server) - before) / max(result.requests, 1) * 1000
    rss = rss_mib(server.worker_pids())
    time.sleep(METRICS_SETTLE_SECONDS)
    after = batching_totals(server.url, workload)
    calls, rows = after["calls"] - totals["calls"], after["rows"] - totals["rows"]
    waits, waited = after["waits"] - totals["waits"], after["wait_seconds"] - totals["wait_seconds"]
    return Cell(result, cpu_ms, rows / calls if calls else 0.0, waited / waits * 1000 if waits else 0.0, rss)


def main() -> None:
    parser = arguments(__doc__, seconds=6.0)
    parser.add_argument("--a", nargs="*", default=[], metavar="NAME=value", help="environment of server A")
    parser.add_argument("--b", nargs="*", default=[], metavar="NAME=value", help="environment of server B")
    parser.add_argument("--workloads", nargs="+", default=["mlp", "cnn"], choices=models.WORKLOADS)
    parser.add_argument("--connections", nargs="+", type=int, default=[1, 16, 64])
    parser.add_argument("--variant", nargs="+", action="append", default=[], metavar="LABEL NAME=value",
                        help="another server to compare with A (repeatable)")
    parser.add_argument("--noisy", action="store_true", help="also measure with one core kept busy")
    parser.add_argument("--a-root", type=Path, default=None, help="another checkout of forkserve to run server A from")
    args = parser.parse_args()
    configurations = {"A": args.a, "B": args.b, **{variant[0]: variant[1:] for variant in args.variant}}
    bodies = request_bodies()
    measured: dict[tuple, list[Cell]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="forkserve-ab-") as work, OtlpSink() as sink:
        models.build(Path(work) / "models", tuple(args.workloads))
        places = {"work": work, "otlp": sink.url}
        servers = {
            name: Server(models_dir=Path(work) / "models", run_dir=Path(work) / f"run-{name}", workers=2,
                         env={"TF_CPP_MIN_LOG_LEVEL": "3", **parse_env(assignments, places)},
                         **({"root": args.a_root.resolve()} if name == "A" and args.a_root else {}))
            for name, assignments in configurations.items()
        }
        try:
            for server in servers.values():
                server.start()
            names = list(servers)
            for round_number in range(args.rounds):
                shift = round_number % len(names)
                order = names[shift:] + names[:shift]  # two servers: A B, then B A
                for condition in ("quiet", "noisy") if args.noisy else ("quiet",):
                    for workload in args.workloads:
                        for connections in args.connections:
                            for name in order:
                                with NoisyNeighbour() if condition == "noisy" else contextlib.nullcontext():
                                    done = cell(servers[name], workload, bodies[workload], connections, args.seconds)
                                measured[(condition, workload, connections, name)].append(done)
                                result = done.load
                                print(f"round {round_number + 1} {condition} {workload} c={connections:<3d} {name} "
                                      f"{result.requests_per_second:8.1f} req/s p50 {result.p50_seconds * 1000:6.2f} "
                                      f"p99 {result.p99_seconds * 1000:7.2f} cpu/req {done.cpu_ms:.3f} ms "
                                      f"batch {done.batch_rows:.1f} thread wait {done.thread_wait_ms:.2f} ms "
                                      f"rss {done.rss_mib:.0f} MiB errors {result.errors}", flush=True)
        finally:
            for server in servers.values():
                server.stop()
    save_table(args.out, "ab.md", report(measured, args))


def report(measured: dict, args: argparse.Namespace) -> str:
    """One row per cell and server: medians [min-max], and B against A."""
    variants = "".join(f"  {v[0]}: {' '.join(v[1:]) or '(defaults)'}" for v in args.variant)
    a_from = f" (checkout {args.a_root})" if args.a_root else ""
    lines = [f"# A: {' '.join(args.a) or '(defaults)'}{a_from}  B: {' '.join(args.b) or '(defaults)'}{variants}", "",
             f"2 workers each, wrk -t1, {args.rounds} interleaved rounds of {args.seconds:.0f} s, median [min-max]", "",
             "| condition | workload | conc. | server | req/s | p50 ms | p99 ms | slowest ms | worker CPU ms/req "
             "| rows per TF call | thread wait ms | worker RSS MiB | errors | /A req/s | /A CPU |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(measured):
        condition, workload, connections, name = key
        runs = measured[key]
        rps = [c.load.requests_per_second for c in runs]
        cpu = statistics.median(c.cpu_ms for c in runs)
        ratios = " |"
        if name != "A":
            a_runs = measured[(condition, workload, connections, "A")]
            ratios = (f"{statistics.median(rps) / statistics.median(c.load.requests_per_second for c in a_runs):.2f} | "
                      f"{cpu / statistics.median(c.cpu_ms for c in a_runs):.2f}")
        lines.append(
            f"| {condition} | {workload} | {connections} | {name} | {statistics.median(rps):.0f} [{min(rps):.0f}-{max(rps):.0f}] "
            f"| {statistics.median(c.load.p50_seconds for c in runs) * 1000:.2f} "
            f"| {statistics.median(c.load.p99_seconds for c in runs) * 1000:.2f} "
            f"| {statistics.median(c.load.max_seconds for c in runs) * 1000:.1f} | {cpu:.3f} "
            f"| {statistics.median(c.batch_rows for c in runs):.1f} | {statistics.median(c.thread_wait_ms for c in runs):.2f} "
            f"| {statistics.median(c.rss_mib for c in runs):.0f} | {sum(c.load.errors for c in runs)} | {ratios} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
