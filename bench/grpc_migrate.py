"""New gRPC connections reset while a worker retires, with net.ipv4.tcp_migrate_req 0 and 1 (needs root; restored).

    .venv/bin/python -m bench.grpc_migrate [--trials 3] [--storm 16]

2-worker forkserve; `--storm` threads open connections as fast as they can (TCP connect, the
HTTP/2 preface and SETTINGS, read the server's SETTINGS, close) while one worker is sent SIGTERM,
until the master has reaped it. A connection the kernel had queued on the retiring worker's
listening sockets is reset when they close, unless tcp_migrate_req moves it to another worker's.
Prints, per setting and trial: connections answered, reset, and refused or closed unanswered.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import tempfile
import threading
from collections import Counter
from pathlib import Path

from bench import models
from tests.support.harness import Server

MIGRATE_REQ = Path("/proc/sys/net/ipv4/tcp_migrate_req")
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + an empty SETTINGS frame


def one_connection(port: int) -> str:
    """"answered", "reset", "refused" or "closed" (EOF before any byte of the server)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(PREFACE)
            return "answered" if sock.recv(64) else "closed"
    except ConnectionResetError:
        return "reset"
    except ConnectionRefusedError:
        return "refused"
    except OSError as exc:
        return type(exc).__name__


def storm(port: int, threads: int, stop: threading.Event) -> Counter:
    """Connections from `threads` threads until `stop`, counted by outcome."""
    outcomes: Counter = Counter()
    lock = threading.Lock()

    def run() -> None:
        mine: Counter = Counter()
        while not stop.is_set():
            mine[one_connection(port)] += 1
        with lock:
            outcomes.update(mine)

    workers = [threading.Thread(target=run, daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    stop.wait()
    for worker in workers:
        worker.join(30)
    return outcomes


def retire_under_storm(server: Server, threads: int) -> Counter:
    """SIGTERM one worker while the storm runs; the outcomes from just before the signal until it is reaped."""
    stop = threading.Event()
    result: list[Counter] = []
    runner = threading.Thread(target=lambda: result.append(storm(server.grpc_port, threads, stop)))
    runner.start()
    stop.wait(1.0)  # the storm at full rate first
    victim = server.worker_pids()[0]
    os.kill(victim, signal.SIGTERM)
    server.wait_reaped(victim)
    stop.set()
    runner.join(60)
    server.wait_workers_loaded(2)
    return result[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--storm", type=int, default=16, help="connecting threads")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="forkserve-grpc-migrate-"))
    files = models.build(work / "source", ("mlp",))
    (work / "models" / "mlp").mkdir(parents=True)
    shutil.copytree(files["mlp"].parent, work / "models" / "mlp" / "1")
    before = MIGRATE_REQ.read_text()
    server = Server(models_dir=work / "models", run_dir=work / "run", workers=2).start()
    try:
        print("| tcp_migrate_req | trial | answered | reset | other |")
        print("|---:|---:|---:|---:|---|")
        for setting in ("0", "1"):
            MIGRATE_REQ.write_text(setting)
            for trial in range(args.trials):
                outcomes = retire_under_storm(server, args.storm)
                other = {k: v for k, v in outcomes.items() if k not in ("answered", "reset")}
                print(f"| {setting} | {trial + 1} | {outcomes['answered']} | {outcomes['reset']} | {other or '-'} |", flush=True)
    finally:
        MIGRATE_REQ.write_text(before)
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
