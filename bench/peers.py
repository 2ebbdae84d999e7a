"""forkserve against the peers people compare it with: Seldon MLServer, KServe's Python server, and the HTTP floor.

    make bench-peers   # builds .peers/mlserver and .peers/kserve once, then runs this
    .venv/bin/python -m bench.peers [--seconds 8] [--rounds 3] [--noisy] [--out bench/results]

The same two models as bench.run (a CNN on one base64 JPEG per request, an MLP on 20 floats),
each server with 2 workers and a warm concrete function, never model.predict:
- forkserve, its defaults (TensorFlow Serving's REST API);
- KServe 0.21 `kserve.Model` (bench/peer_servers/kserve_server.py, the same v1 body);
- MLServer 1.7.1 with a custom runtime (bench/peer_servers/mlserver_runtime.py, V2 body), twice:
  `parallel_workers: 2` with adaptive batching (max_batch_size 32, max_batch_time 2 ms) and
  `parallel_workers: 0` without (its best at one connection); "MLServer" is the better of the two;
- the HTTP floor (bench/floor_app.py, MLP only): Flask doing the same JSON work and no model.
Every server must answer the same prediction before it is measured. All run at once; each round
measures every cell once, servers back to back, and the table shows the median of the rounds
[min-max]. `--noisy` adds the same cells with one core kept busy by a CPU-bound process at normal
priority. Writes peers.md and peers.png into --out.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import orjson
import requests

from bench import models
from bench.common import NoisyNeighbour, arguments, finish_figure, save_table
from bench.load import LoadResult, run_wrk
from bench.run import Baseline, request_bodies
from tests.e2e.harness import ROOT, Server, free_port, wait_until

PEERS = ROOT / ".peers"
RUNTIMES = ROOT / "bench" / "peer_servers"
CONCURRENCY = (1, 16, 64)
SERVERS = ("forkserve", "forkserve-before", "kserve", "mlserver-pw2", "mlserver-pw0", "floor")
PEERS_ONLY = ("kserve", "mlserver-pw2", "mlserver-pw0")


def v2_bodies(v1: dict[str, bytes]) -> dict[str, bytes]:
    """The same requests in the Open Inference Protocol V2 shape MLServer speaks."""
    cnn = orjson.loads(v1["cnn"])["instances"][0]["b64"]
    mlp = orjson.loads(v1["mlp"])["instances"][0]
    image = orjson.dumps({"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "data": [cnn]}]})
    return {
        "cnn": image,
        "cnn_heavy": image,
        "mlp": orjson.dumps({"inputs": [{"name": "features", "shape": [1, len(mlp)], "datatype": "FP32", "data": mlp}]}),
    }


class Process:
    """A peer server started from its own virtual environment."""

    def __init__(self, command: list[str], cwd: Path, env: dict[str, str], log: Path) -> None:
        with open(log, "wb") as out:
            self.process = subprocess.Popen(command, cwd=cwd, env={**os.environ, **env}, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        self.log = log

    def alive(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.log.name} exited: {self.log.read_text()[-3000:]}")
        return True

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.process.pid, signal.SIGKILL)


def start_mlserver(work: Path, files: dict[str, Path], parallel_workers: int, batching: bool) -> tuple[Process, str]:
    """MLServer over both models; returns it and its base URL."""
    root = work / f"mlserver-pw{parallel_workers}"
    port = free_port()
    settings = {"debug": False, "gzip_enabled": False, "metrics_endpoint": None, "parallel_workers": parallel_workers,
                "host": "127.0.0.1", "http_port": port, "grpc_port": free_port(), "metrics_port": free_port()}
    (root).mkdir(parents=True)
    (root / "settings.json").write_text(json.dumps(settings))
    for name, path in files.items():
        (root / name).mkdir()
        model = {"name": name, "implementation": "mlserver_runtime.KerasRuntime", "parameters": {"uri": str(path)}}
        if batching:
            model.update(max_batch_size=32, max_batch_time=0.002)
        (root / name / "model-settings.json").write_text(json.dumps(model))
    process = Process([str(PEERS / "mlserver" / "bin" / "mlserver"), "start", str(root)], root,
                      {"PYTHONPATH": str(RUNTIMES), "TF_CPP_MIN_LOG_LEVEL": "3"}, work / f"mlserver-pw{parallel_workers}.log")
    return process, f"http://127.0.0.1:{port}"


def start_kserve(work: Path, files: dict[str, Path]) -> tuple[Process, str]:
    port = free_port()
    command = [str(PEERS / "kserve" / "bin" / "python"), str(RUNTIMES / "kserve_server.py"), "--port", str(port),
               "--grpc-port", str(free_port()), "--workers", "2", *[f"{name}={path}" for name, path in files.items()]]
    process = Process(command, work, {"PYTHONPATH": str(RUNTIMES), "TF_CPP_MIN_LOG_LEVEL": "3"}, work / "kserve.log")
    return process, f"http://127.0.0.1:{port}"


def predictions(server: str, url: str, body: bytes) -> np.ndarray:
    """What a server answers for `body`, as an array (V2 outputs or TF Serving predictions)."""
    answer = requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=120)
    answer.raise_for_status()
    parsed = answer.json()
    if "outputs" in parsed:
        output = parsed["outputs"][0]
        return np.asarray(output["data"], dtype=np.float64).reshape(output["shape"])
    return np.asarray(parsed["predictions"], dtype=np.float64)


def answers_ready(url: str, body: bytes) -> bool:
    """The server answers 8 requests in a row (each worker warm: KServe loads at the first request)."""
    try:
        return all(requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=120).ok for _ in range(8))
    except requests.RequestException:
        return False


def process_tree_pss_mib(pid: int) -> float:
    """Proportional set size of a process and all its descendants."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            rollup = Path(f"/proc/{current}/smaps_rollup").read_text()
            total += int(next(line.split()[1] for line in rollup.splitlines() if line.startswith("Pss:")))
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(child) for child in (task / "children").read_text().split()]
        except (OSError, StopIteration):
            continue
    return total / 1024


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--noisy", action="store_true", help="also measure with one core kept busy")
    parser.add_argument("--workloads", nargs="+", default=["cnn", "mlp"], choices=models.WORKLOADS)
    parser.add_argument("--connections", nargs="+", type=int, default=list(CONCURRENCY))
    parser.add_argument("--forkserve-env", nargs="*", default=[], metavar="NAME=value",
                        help="settings of forkserve other than its defaults (to try a change against the peers)")
    parser.add_argument("--before-env", nargs="*", default=None, metavar="NAME=value",
                        help="also run a second forkserve with these settings, as 'forkserve-before' (a change's baseline)")
    args = parser.parse_args()
    workloads = tuple(args.workloads)
    for peer in ("mlserver", "kserve"):
        if not (PEERS / peer / "bin" / "python").exists():
            sys.exit(f"{PEERS / peer} is missing: run `make bench-peers` (it builds the peers' environments)")
    work = Path(tempfile.mkdtemp(prefix="forkserve-peers-"))
    files = models.build(work / "models", workloads)
    v1, v2 = request_bodies(), v2_bodies(request_bodies())
    running: list = []
    try:
        forkserve = Server(models_dir=work / "models", run_dir=work / "run", workers=2, env={"TF_CPP_MIN_LOG_LEVEL": "3", **dict(item.split("=", 1) for item in args.forkserve_env)})
        running.append(forkserve)
        forkserve.start()
        before = None
        if args.before_env is not None:
            before = Server(models_dir=work / "models", run_dir=work / "run-before", workers=2,
                            env={"TF_CPP_MIN_LOG_LEVEL": "3", **dict(item.split("=", 1) for item in args.before_env)})
            running.append(before)
            before.start()
        kserve, kserve_url = start_kserve(work, files)
        mls2, mls2_url = start_mlserver(work, files, 2, batching=True)
        mls0, mls0_url = start_mlserver(work, files, 0, batching=False)
        floor = Baseline("bench.floor_app:app", 2, {}, work)
        running += [kserve, mls2, mls0, floor]
        urls = {  # server: (url of a workload, its body, root pid)
            "forkserve": (lambda w: f"{forkserve.url}/v1/models/{w}:predict", v1, forkserve.process.pid),
            **({"forkserve-before": (lambda w: f"{before.url}/v1/models/{w}:predict", v1, before.process.pid)} if before else {}),
            "kserve": (lambda w: f"{kserve_url}/v1/models/{w}:predict", v1, kserve.process.pid),
            "mlserver-pw2": (lambda w: f"{mls2_url}/v2/models/{w}/infer", v2, mls2.process.pid),
            "mlserver-pw0": (lambda w: f"{mls0_url}/v2/models/{w}/infer", v2, mls0.process.pid),
            "floor": (lambda w: f"{floor.url}/v1/models/{w}:predict", v1, floor.process.pid),
        }
        peers = {"kserve": kserve, "mlserver-pw2": mls2, "mlserver-pw0": mls0}
        for server, (url, bodies, _) in urls.items():
            for workload in workloads if server != "floor" else [w for w in workloads if w == "mlp"]:
                def ready() -> bool:
                    if server in peers:
                        peers[server].alive()
                    return answers_ready(url(workload), bodies[workload])

                wait_until(ready, 300, f"{server} to answer {workload}", interval=1.0)
        for workload in workloads:
            reference = predictions("forkserve", urls["forkserve"][0](workload), v1[workload])
            for server in PEERS_ONLY:
                got = predictions(server, urls[server][0](workload), urls[server][1][workload])
                assert np.allclose(got, reference, atol=1e-4), (server, workload, got, reference)
        memory = {server: process_tree_pss_mib(pid) for server, (_, _, pid) in urls.items()}
        print("idle memory (PSS, MiB):", {k: round(v) for k, v in memory.items()}, flush=True)
        conditions = ("quiet", "noisy") if args.noisy else ("quiet",)
        measured: dict[tuple, list[LoadResult]] = collections.defaultdict(list)
        for round_number in range(args.rounds):
            for condition in conditions:
                for workload in workloads:
                    for connections in args.connections:
                        for server, (url, bodies, _) in urls.items():
                            if server == "floor" and workload != "mlp":
                                continue
                            with NoisyNeighbour() if condition == "noisy" else contextlib.nullcontext():
                                run_wrk(url(workload), bodies[workload], connections, 1, threads=1)
                                result = run_wrk(url(workload), bodies[workload], connections, args.seconds, threads=1)
                            measured[(condition, workload, connections, server)].append(result)
                            print(f"round {round_number + 1} {condition} {workload} c={connections:<3d} {server:13s} "
                                  f"{result.requests_per_second:8.1f} req/s p50 {result.p50_seconds * 1000:7.2f} "
                                  f"p99 {result.p99_seconds * 1000:7.2f} max {result.max_seconds * 1000:7.1f} errors {result.errors}",
                                  flush=True)
    finally:
        for server in reversed(running):
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    table = report(measured, memory, args)
    save_table(args.out, "peers.md", table)
    plot(measured, args.out / "peers.png", workloads, tuple(args.connections))


def _median(results: list[LoadResult], field: str) -> tuple[float, float, float]:
    values = [getattr(r, field) for r in results]
    return statistics.median(values), min(values), max(values)


def report(measured: dict, memory: dict[str, float], args: argparse.Namespace) -> str:
    """One row per cell: req/s [min-max], p50 / p99, the ratio to the best peer."""
    lines = [f"# forkserve and its peers: 2 workers each, wrk -t1, {args.rounds} interleaved rounds of "
             f"{args.seconds:.0f} s, median [min-max]", "",
             "Idle memory, whole process tree (PSS): " + ", ".join(f"{k} {v:.0f} MiB" for k, v in memory.items()), "",
             "| condition | workload | conc. | server | req/s | p50 ms | p99 ms | slowest ms | errors | × best peer (req/s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (condition, workload, connections, server), results in sorted(measured.items(), key=lambda item: (
            item[0][0], item[0][1], item[0][2], SERVERS.index(item[0][3]))):
        rps, low, high = _median(results, "requests_per_second")
        peers = [statistics.median(r.requests_per_second for r in measured[(condition, workload, connections, peer)])
                 for peer in PEERS_ONLY]
        versus = f"{rps / max(peers):.2f}×" if server.startswith("forkserve") else ""
        lines.append(f"| {condition} | {workload} | {connections} | {server} | {rps:.0f} [{low:.0f}-{high:.0f}] "
                     f"| {_median(results, 'p50_seconds')[0] * 1000:.2f} | {_median(results, 'p99_seconds')[0] * 1000:.2f} "
                     f"| {_median(results, 'max_seconds')[0] * 1000:.1f} | {sum(r.errors for r in results)} | {versus} |")
    return "\n".join(lines) + "\n"


def plot(measured: dict, path: Path, workloads: tuple[str, ...], concurrency: tuple[int, ...]) -> None:
    """req/s and p99 against connections, per workload (quiet condition)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, len(workloads), figsize=(5.5 * len(workloads), 8), squeeze=False)
    for column, workload in enumerate(workloads):
        for server in SERVERS:
            cells = [(c, measured.get(("quiet", workload, c, server))) for c in concurrency]
            cells = [(c, results) for c, results in cells if results]
            if not cells:
                continue
            xs = [c for c, _ in cells]
            axes[0][column].plot(xs, [_median(r, "requests_per_second")[0] for _, r in cells], "o-", label=server)
            axes[1][column].plot(xs, [_median(r, "p99_seconds")[0] * 1000 for _, r in cells], "o-", label=server)
        axes[0][column].set(title=f"{workload}: throughput", xlabel="connections", ylabel="requests/s", xscale="log")
        axes[1][column].set(title=f"{workload}: p99 latency", xlabel="connections", ylabel="ms", xscale="log", yscale="log")
    finish_figure(figure, axes, concurrency, path)


if __name__ == "__main__":
    main()
