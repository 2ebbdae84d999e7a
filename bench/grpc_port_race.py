"""Two forkserves started 0.0-0.5 s apart on one gRPC port: how often both end up serving it (issue 32, item 6).

    .venv/bin/python -m bench.grpc_port_race [--trials 12] [--spread 0.5]

Each trial starts a 1-worker forkserve over `mlp`, then a second one on the same FORKSERVE_GRPC_BIND
after a delay spread evenly over 0 to `--spread` seconds, and waits until one of them has exited
(refused) or both have a loaded worker. "shared" is both servers' workers listening on the port (the
kernel then spreads a client's connections over two servers), "refused" one master exiting with
the port taken. Prints one line per trial and the counts.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench import models
from tests.support.harness import Server, free_port, wait_until


def listening_pids(port: int) -> set[int]:
    """Processes with a socket listening on `port` (ss)."""
    out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    return {int(field.split("=")[1]) for field in out.replace(",", " ").split() if field.startswith("pid=")}


def outcome(first: Server, second: Server) -> str | None:
    """"refused" (a master exited, the port taken), "shared" (both serve the port), or None while undecided."""
    for server in (first, second):
        assert server.process is not None
        if server.process.poll() is not None:
            return "refused" if "is taken" in server.log() else f"exited {server.process.returncode}"
    workers = [set(server.worker_pids()) for server in (first, second)]
    if not all(workers):
        return None
    listening = listening_pids(first.grpc_port)
    return "shared" if all(listening & mine for mine in workers) else "one serves"


def trial(repo: Path, work: Path, delay: float) -> tuple[str, float]:
    """Start two servers `delay` s apart on one gRPC port; the outcome and the seconds until it was known."""
    port = free_port()
    servers = [Server(models_dir=repo, run_dir=work / f"run-{port}-{n}", workers=1, grpc_port=port) for n in (1, 2)]
    started = time.monotonic()
    try:
        servers[0].start(timeout=0)
        time.sleep(delay)  # the gap between the two starts is what is measured, not a wait for a server
        servers[1].start(timeout=0)
        result = wait_until(lambda: outcome(*servers), 180, "a refusal or both servers loaded", interval=0.05)
        return result, time.monotonic() - started
    finally:
        for server in servers:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--spread", type=float, default=0.5, help="the largest gap between the two starts (s)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="forkserve-grpc-port-race-"))
    files = models.build(work / "source", ("mlp",))
    (work / "models" / "mlp").mkdir(parents=True)
    shutil.copytree(files["mlp"].parent, work / "models" / "mlp" / "1")
    counts: Counter = Counter()
    try:
        print("| trial | gap (s) | outcome | decided after (s) |")
        print("|---:|---:|---|---:|")
        for n in range(args.trials):
            delay = args.spread * n / max(args.trials - 1, 1)
            result, seconds = trial(work / "models", work, delay)
            counts[result] += 1
            print(f"| {n + 1} | {delay:.2f} | {result} | {seconds:.1f} |", flush=True)
        print("\n" + ", ".join(f"{name}: {count}" for name, count in counts.most_common()))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
