"""The gRPC path of this checkout against another checkout's, side by side: h2load on TF Serving Predict and V2 ModelInfer.

    .venv/bin/python -m bench.grpc_ab --baseline /path/to/other/checkout [--workloads mlp cnn] \
        [--connections 1 16 64] [--seconds 6] [--rounds 3]

Made for changes of the gRPC transport (issue 32: grpcio's sync server against grpc.aio): make the
baseline with `git worktree add /tmp/base COMMIT`. Both servers (2 workers each, the bench models,
this checkout's virtual environment) run at once; each round measures every cell on the baseline
then this checkout, or the other way round on odd rounds, so drift hits both. Besides h2load's
calls/s and latencies, each cell records the workers' CPU per call (utime + stime from /proc).
Prints medians [min-max] and this/baseline ratios; writes grpc-ab.md into --out.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import statistics
import tempfile
from pathlib import Path

from bench import models, peers_grpc
from bench.common import arguments, process_cpu_seconds, save_table
from bench.grpc_load import GrpcCall, checked_call, run_h2load
from bench.load import LoadResult
from bench.run import request_bodies
from tests.support.harness import ROOT, Server

SERVERS = ("baseline", "this")
METHODS = {"tfs": peers_grpc.TFS_PREDICT, "v2": peers_grpc.V2_INFER}


def calls_for(server: Server, workloads: list[str]) -> dict[tuple[str, str], GrpcCall]:
    """(workload, api) -> the checked call (answers compared with grpcio first)."""
    arrays = peers_grpc.input_arrays(request_bodies())
    calls = {}
    for workload in workloads:
        name = peers_grpc.input_name(server.grpc_target, workload)
        requests = {"tfs": peers_grpc.tfs_request(workload, name, arrays[workload]),
                    "v2": peers_grpc.v2_request(workload, name, arrays[workload])}
        for api, method in METHODS.items():
            calls[(workload, api)] = checked_call(server.grpc_target, method, requests[api])
    return calls


def measure(server: Server, call: GrpcCall, connections: int, seconds: float) -> tuple[LoadResult, float]:
    """One h2load run and the workers' CPU milliseconds per answered call."""
    before = process_cpu_seconds(server.worker_pids())
    result = run_h2load(call, connections, seconds)
    spent = process_cpu_seconds(server.worker_pids()) - before
    return result, spent * 1000 / max(1, result.requests)


def main() -> None:
    parser = arguments(__doc__, seconds=6.0)
    parser.add_argument("--baseline", type=Path, required=True, help="another checkout of forkserve (git worktree)")
    parser.add_argument("--workloads", nargs="+", default=["mlp", "cnn"])
    parser.add_argument("--connections", nargs="+", type=int, default=[1, 16, 64])
    args: argparse.Namespace = parser.parse_args()
    results: dict[tuple, list[tuple[LoadResult, float]]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as stack:
        work = Path(scratch)
        models.build(work / "models", tuple(args.workloads))
        servers = {}
        for label, root in (("baseline", args.baseline.resolve()), ("this", ROOT)):
            server = Server(models_dir=work / "models", run_dir=work / f"run-{label}", workers=2, root=root,
                            env={"FORKSERVE_ACCESS_LOG": "0"})
            stack.callback(server.stop)
            servers[label] = server.start()
        calls = {label: calls_for(server, args.workloads) for label, server in servers.items()}
        for round_number in range(args.rounds):
            order = SERVERS if round_number % 2 == 0 else SERVERS[::-1]
            for (workload, api) in calls["this"]:
                for connections in args.connections:
                    for label in order:
                        cell = measure(servers[label], calls[label][(workload, api)], connections, args.seconds)
                        results[(workload, api, connections, label)].append(cell)
                        print(f"round {round_number} {workload} {api} c{connections} {label}: "
                              f"{cell[0].requests_per_second:.0f} calls/s, {cell[1]:.3f} ms CPU/call", flush=True)
    save_table(args.out, "grpc-ab.md", table(results, args))


def table(results: dict[tuple, list[tuple[LoadResult, float]]], args: argparse.Namespace) -> str:
    """Medians [min-max] per cell, and this checkout against the baseline."""
    lines = [f"# gRPC: this checkout against {args.baseline} (2 workers each, h2load -t1 -m1, "
             f"{args.rounds} interleaved rounds of {args.seconds:g} s), median [min-max]", "",
             "| workload | api | conc. | server | calls/s | p50 ms | p99 ms | errors | worker CPU ms/call | this/baseline calls/s | this/baseline CPU/call |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (workload, api, connections, label), cells in sorted(results.items()):
        rates = [c[0].requests_per_second for c in cells]
        cpu = statistics.median(c[1] for c in cells)
        ratio = cpu_ratio = ""
        if label == "this":
            base = results[(workload, api, connections, "baseline")]
            ratio = f"{statistics.median(rates) / statistics.median(c[0].requests_per_second for c in base):.2f}×"
            cpu_ratio = f"{cpu / statistics.median(c[1] for c in base):.2f}×"
        lines.append(f"| {workload} | {api} | {connections} | {label} | {statistics.median(rates):.0f} "
                     f"[{min(rates):.0f}-{max(rates):.0f}] | {statistics.median(c[0].p50_seconds for c in cells) * 1000:.2f} | "
                     f"{statistics.median(c[0].p99_seconds for c in cells) * 1000:.2f} | {sum(c[0].errors for c in cells)} | "
                     f"{cpu:.3f} | {ratio} | {cpu_ratio} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
