"""Latency while a new model version rolls out, against steady state, through nginx.

    .venv/bin/python -m bench.rollout [--clients 8] [--steady 10]

2-worker forkserve behind the shipped nginx config, closed-loop clients posting to an MLP;
measures p50 / p99 / max over a steady window, then publishes a new version and measures
from the publish until every worker serves it. Goal: max under 1 s, p99 within 2x steady.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import models
from server.cli.publish import publish
from server.state import read_worker_states
from tests.support.harness import Server, wait_until
from tests.support.nginx import Nginx
from tests.support.traffic import Traffic


def summary(latencies: list[float]) -> str:
    """p50 / p99 / max in ms."""
    values = np.array(latencies) * 1000
    return f"{len(values)} requests, p50 {np.percentile(values, 50):.1f} ms, p99 {np.percentile(values, 99):.1f} ms, max {values.max():.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--steady", type=float, default=10.0, help="seconds of steady-state measurement")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="forkserve-rollout-"))
    files = models.build(work / "source")
    (work / "models" / "mlp").mkdir(parents=True)
    shutil.copytree(files["mlp"].parent, work / "models" / "mlp" / "1")
    server = Server(models_dir=work / "models", run_dir=work / "run", workers=2, env={"FORKSERVE_POLL_INTERVAL": "0.5"}).start()
    nginx = Nginx(work / "nginx", [server.port])
    traffic = Traffic(f"{nginx.url}/v1/models/mlp:predict", pause=0.0)  # a closed loop: as many requests as it can
    threads = traffic.start(args.clients)
    try:
        time.sleep(2)  # let connections and caches warm before measuring
        steady_from = time.monotonic()
        time.sleep(args.steady)
        steady_to = time.monotonic()
        version = publish("mlp", files["mlp"], work / "models")
        published = time.monotonic()

        def rolled() -> bool:
            states = read_worker_states(server.run_dir)
            live = [states[pid] for pid in server.worker_pids() if pid in states]
            return len(live) == 2 and all(s.serving("mlp") == [version] for s in live)

        wait_until(rolled, 300, "the rollout")
        finished = time.monotonic()
        time.sleep(1)
    finally:
        traffic.stop.set()
        for thread in threads:
            thread.join(60)
        nginx.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    steady = [a[4] for a in traffic.answers if steady_from <= a[0] < steady_to]
    during = [a[4] for a in traffic.answers if published <= a[0] < finished]
    failures = traffic.failures()
    print(f"| window | {args.clients} clients through nginx |")
    print("|---|---|")
    print(f"| steady ({args.steady:.0f} s) | {summary(steady)} |")
    print(f"| rollout ({finished - published:.1f} s, 2 workers) | {summary(during)} |")
    print(f"| failed requests | {len(failures)} |")


if __name__ == "__main__":
    main()
