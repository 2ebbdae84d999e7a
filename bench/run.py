"""Throughput benchmark: forkserve against the naive server, the HTTP floor and the in-process limit.

    .venv/bin/python -m bench.run [--seconds 8] [--out bench/results]

All side by side in one run on this machine (the ratios are what to read; absolute numbers move
with the machine's load). Workloads: a small CNN and a heavy one (bench.models) on 100x100x3 images
sent as one base64 JPEG per request, and an MLP on 20 floats sent as JSON; concurrency 1, 16 and
64; load from wrk.
Writes throughput.md (table) and throughput.png (plot) into --out.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import requests
from PIL import Image

from bench import models
from bench.common import finish_figure
from bench.load import LoadResult, run_wrk
from server.settings import DEFAULT_THREADS, available_cpus
from tests.support.harness import ROOT, Server, free_port, wait_until

CONCURRENCY = (1, 16, 64)
WORKLOADS = ("cnn", "cnn_heavy", "mlp")
GUNICORN = Path(sys.executable).with_name("gunicorn")


@dataclass(frozen=True)
class Row:
    """One measurement: a server under one workload at one concurrency."""

    workload: str
    server: str
    concurrency: int
    result: LoadResult


def request_bodies() -> dict[str, bytes]:
    """One predict body per workload: a b64 JPEG for the CNN, 20 floats for the MLP."""
    rng = np.random.default_rng(0)
    gradient = np.linspace(0, 255, 100, dtype=np.float32)
    pixels = (gradient[None, :, None] * 0.5 + gradient[:, None, None] * 0.3 + rng.normal(0, 20, (100, 100, 3)))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB").save(buffer, format="JPEG", quality=90)
    image = base64.b64encode(buffer.getvalue()).decode()
    return {
        "cnn": orjson.dumps({"instances": [{"b64": image}]}),
        "cnn_heavy": orjson.dumps({"instances": [{"b64": image}]}),
        "mlp": orjson.dumps({"instances": [rng.normal(size=20).round(4).tolist()]}),
    }


def in_process_limit(model_file: Path, cpus: int) -> dict:
    """Best of: one process with every CPU, or one single-threaded process per CPU at once."""

    def launch(threads: int) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "bench.inprocess", str(model_file)],
            cwd=ROOT, env={**os.environ, "INTRA_OP_THREADS": str(threads), "TF_CPP_MIN_LOG_LEVEL": "3"},
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )

    whole = json.loads(launch(cpus).communicate(timeout=300)[0])
    parallel = [launch(1) for _ in range(cpus)]
    shares = [json.loads(p.communicate(timeout=300)[0]) for p in parallel]
    split_rate = sum(1 / s["best_per_sample_seconds"] for s in shares)
    whole_rate = 1 / whole["best_per_sample_seconds"]
    return {
        "batch1_seconds": min(whole["batch1_seconds"], min(s["batch1_seconds"] for s in shares)),
        "batched_rate": max(whole_rate, split_rate),
        "best_batch": whole["best_batch"],
        "layout": f"1 process x {cpus} threads" if whole_rate >= split_rate else f"{cpus} processes x 1 thread",
    }


class Baseline:
    """A plain gunicorn app (the naive server or the HTTP floor) with forkserve's gunicorn settings."""

    def __init__(self, app: str, workers: int, env: dict[str, str], cwd: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [str(GUNICORN), "-w", str(workers), "-k", "gthread", "--threads", "8", "-b", f"127.0.0.1:{self.port}",
                   "--keep-alive", "75", "--timeout", "120", "--no-control-socket", app]
        # NOTE: cwd elsewhere, or gunicorn would read forkserve's gunicorn.conf.py and its hooks.
        self.process = subprocess.Popen(command, cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3", **env},
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait(self, path: str, body: bytes, workers: int) -> None:
        """Until `workers` distinct fresh connections are answered (every worker loaded)."""
        def answered() -> bool:
            try:
                return all(
                    requests.post(self.url + path, data=body, headers={"Content-Type": "application/json", "Connection": "close"}, timeout=60).ok
                    for _ in range(workers * 4)
                )
            except requests.RequestException:
                return False
        wait_until(answered, 180, f"{self.url} to answer")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)


def measure(url: str, body: bytes, workload: str, server: str, connections: int, seconds: float) -> Row:
    """wrk at one concurrency, after a short warm-up."""
    run_wrk(url, body, connections, 1, threads=2)
    result = run_wrk(url, body, connections, seconds, threads=2)
    print(f"  {workload} {server:9s} c={connections:<3d} {result.requests_per_second:9.1f} req/s "
          f"p50 {result.p50_seconds * 1000:7.2f} ms p99 {result.p99_seconds * 1000:7.2f} ms errors {result.errors}",
          flush=True)
    return Row(workload, server, connections, result)


def run(seconds: float, out: Path) -> None:
    """Every server and workload, then the table and the plot.

    All servers run at once (idle ones cost nothing) and the measurements interleave: forkserve,
    naive and floor back to back at each concurrency, so a drift in this shared machine's speed
    shows in all three instead of in the ratios.
    """
    cpus = available_cpus()
    work = Path(tempfile.mkdtemp(prefix="forkserve-bench-"))
    started = time.monotonic()
    running: list = []
    try:
        files = models.build(work / "models", WORKLOADS)
        bodies = request_bodies()
        limits = {name: in_process_limit(path, cpus) for name, path in files.items()}
        print(f"in-process limits: {limits}", flush=True)
        forkserve = Server(models_dir=work / "models", run_dir=work / "run", workers=cpus)
        running.append(forkserve)
        naive = {w: Baseline("bench.naive_app:app", cpus, {"NAIVE_MODEL": str(files[w])}, work) for w in WORKLOADS}
        floor = Baseline("bench.floor_app:app", cpus, {}, work)
        running += [*naive.values(), floor]
        forkserve.start()
        for workload, server in naive.items():
            server.wait(f"/v1/models/{workload}:predict", bodies[workload], cpus)
        floor.wait("/v1/models/x:predict", bodies["mlp"], cpus)
        rows: list[Row] = []
        for workload in WORKLOADS:
            path = f"/v1/models/{workload}:predict"
            urls = {"forkserve": forkserve.url, "naive": naive[workload].url, "floor": floor.url}
            for connections in CONCURRENCY:
                for name, url in urls.items():
                    rows.append(measure(url + path, bodies[workload], workload, name, connections, seconds))
    finally:
        for server in running:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    rows.sort(key=lambda r: (("forkserve", "naive", "floor").index(r.server), r.workload, r.concurrency))
    table = report(rows, limits, cpus, time.monotonic() - started)
    (out / "throughput.md").write_text(table)
    plot(rows, limits, out / "throughput.png")
    print(table)


def report(rows: list[Row], limits: dict, cpus: int, elapsed: float) -> str:
    """The markdown table with ratios against each baseline."""
    by_key = {(r.workload, r.server, r.concurrency): r.result for r in rows}
    lines = [
        f"Run on {cpus} CPUs in {elapsed:.0f} s; forkserve (its defaults: {cpus} workers x {DEFAULT_THREADS} threads) and "
        f"both baselines ({cpus} workers x 8 threads) on gunicorn's gthread, all running at once, measured back to back "
        "at each concurrency. "
        "In-process limit: a warm concrete function.",
        "",
        "| workload | server | conc. | req/s | p50 ms | p99 ms | errors | × naive | / floor | / in-process batched |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        r = row.result
        naive = by_key.get((row.workload, "naive", row.concurrency))
        floor = by_key.get((row.workload, "floor", row.concurrency))
        limit = limits[row.workload]["batched_rate"]
        lines.append(
            f"| {row.workload} | {row.server} | {row.concurrency} | {r.requests_per_second:.0f} | {r.p50_seconds * 1000:.2f} "
            f"| {r.p99_seconds * 1000:.2f} | {r.errors} | {r.requests_per_second / naive.requests_per_second:.1f}× "
            f"| {r.requests_per_second / floor.requests_per_second:.0%} | {r.requests_per_second / limit:.0%} |"
        )
    lines.append("")
    for workload, limit in limits.items():
        lines.append(
            f"- {workload} in-process: batch 1 {limit['batch1_seconds'] * 1000:.3f} ms per call; best batched "
            f"{limit['batched_rate']:.0f} samples/s ({limit['layout']}, batch {limit['best_batch']})"
        )
    lines += ["", "Targets (best concurrency for throughput, concurrency 1 for latency):"]
    for workload, goals in (("cnn", ("naive", "limit")), ("cnn_heavy", ("naive", "limit")), ("mlp", ("floor",))):
        best = max((r for r in rows if r.workload == workload and r.server == "forkserve"), key=lambda r: r.result.requests_per_second)
        best_naive = max(r.result.requests_per_second for r in rows if r.workload == workload and r.server == "naive")
        best_floor = max(r.result.requests_per_second for r in rows if r.workload == workload and r.server == "floor")
        if "naive" in goals:
            lines.append(f"- {workload}: forkserve {best.result.requests_per_second:.0f} req/s = "
                         f"{best.result.requests_per_second / best_naive:.0f}× the naive server's best (target ≥ 40×)")
        if "limit" in goals:
            lines.append(f"- {workload}: {best.result.requests_per_second / limits[workload]['batched_rate']:.0%} "
                         "of the in-process batched limit (target ≥ 50%)")
        if "floor" in goals:
            lines.append(f"- {workload}: {best.result.requests_per_second / best_floor:.0%} of the HTTP floor's best (target ≥ 70%)")
        single = by_key[(workload, "forkserve", 1)]
        budget = limits[workload]["batch1_seconds"] + 0.0015
        lines.append(f"- {workload}: p50 at concurrency 1 = {single.p50_seconds * 1000:.2f} ms; in-process batch 1 + 1.5 ms = "
                     f"{budget * 1000:.2f} ms ({'met' if single.p50_seconds <= budget else 'missed'})")
    return "\n".join(lines) + "\n"


def plot(rows: list[Row], limits: dict, path: Path) -> None:
    """Throughput and latency against concurrency, one column per workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, len(WORKLOADS), figsize=(5.5 * len(WORKLOADS), 8))
    for column, workload in enumerate(WORKLOADS):
        for server, style in (("forkserve", "o-"), ("naive", "s--"), ("floor", "^:")):
            points = sorted((r.concurrency, r.result) for r in rows if r.workload == workload and r.server == server)
            xs = [c for c, _ in points]
            axes[0][column].plot(xs, [r.requests_per_second for _, r in points], style, label=server)
            axes[1][column].plot(xs, [r.p50_seconds * 1000 for _, r in points], style, label=f"{server} p50")
            axes[1][column].plot(xs, [r.p99_seconds * 1000 for _, r in points], style, alpha=0.4, label=f"{server} p99")
        axes[0][column].axhline(limits[workload]["batched_rate"], color="grey", linewidth=1, label="in-process batched limit")
        axes[0][column].set(title=f"{workload}: throughput", xlabel="concurrent connections", ylabel="requests/s", xscale="log", yscale="log")
        axes[1][column].set(title=f"{workload}: latency", xlabel="concurrent connections", ylabel="ms", xscale="log", yscale="log")
    finish_figure(figure, axes, CONCURRENCY, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="wrk duration per measurement")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    run(args.seconds, args.out)


if __name__ == "__main__":
    main()
