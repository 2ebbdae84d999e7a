"""Fork safety of the zygote under load: N worker starts, each with a boot deadline, every answer checked.

A 2-worker demo server (the zygote on) serves client threads that post the same digits request
and compare each answer with the first one. One worker at a time is stopped (SIGTERM, so no
request may fail) and the master has its replacement forked by the zygote; a replacement not
loaded within the deadline is a hang: its threads' stacks are printed (gdb) and it is killed.
Passes with 0 hangs, 0 failed and 0 wrong answers, and every worker forked by the zygote.

    .venv/bin/python -m bench.zygote_stress --starts 500
"""

from __future__ import annotations

import argparse
import base64
import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import requests

from server.state import read_worker_states
from tests.support.harness import ROOT, Server, pid_alive
from tests.support.metrics import samples, value

BODY = {"instances": [{"b64": base64.b64encode((ROOT / "examples" / "digit.png").read_bytes()).decode()}]}
PATH = "/v1/models/digits/versions/1:predict"


def close(answer: list, reference: list) -> bool:
    """The same probabilities up to float rounding: a batch of other sizes sums in another order (oneDNN)."""
    return bool(np.allclose(np.asarray(answer), np.asarray(reference), rtol=0, atol=1e-6)) and \
        int(np.argmax(answer[0])) == int(np.argmax(reference[0]))


class CheckedTraffic:
    """Client threads that post BODY until stopped and count answers unlike the first."""

    def __init__(self, url: str, reference: list) -> None:
        self.url, self.reference = url, reference
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.answers = self.failed = self.wrong = 0
        self.errors: list[str] = []

    def client(self) -> None:
        session = requests.Session()
        while not self.stop.is_set():
            try:
                response = session.post(self.url, json=BODY, timeout=30)
                ok = response.status_code == 200
                right = ok and close(response.json()["predictions"], self.reference)
                error = "" if ok else f"{response.status_code} {response.text[:200]}"
            except requests.RequestException as exc:
                ok, right, error = False, False, repr(exc)
            with self.lock:
                self.answers += 1
                self.failed += not ok
                self.wrong += ok and not right
                if ok and not right and len(self.errors) < 10:
                    error = f"wrong: {response.json()['predictions']} against {self.reference}"
                if error and len(self.errors) < 10:
                    self.errors.append(error)
            self.stop.wait(0.02)

    def start(self, clients: int) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.client, daemon=True) for _ in range(clients)]
        for thread in threads:
            thread.start()
        return threads


def stacks(pid: int) -> str:
    """Every thread's native stack of a process that did not boot in time."""
    done = subprocess.run(["gdb", "-batch", "-p", str(pid), "-ex", "thread apply all bt 15"],
                          capture_output=True, text=True, timeout=60)
    return done.stdout[-6000:]


def replace_one(server: Server, deadline: float) -> tuple[float, int | None]:
    """Stop the oldest worker, wait for a new one to load; (seconds from the stop, the pid that hung or None)."""
    before = set(server.worker_pids())
    victim = min(before)
    started = time.monotonic()
    os.kill(victim, signal.SIGTERM)
    while time.monotonic() - started < deadline:
        loaded = set(server.worker_pids()) - before
        if loaded:
            return time.monotonic() - started, None
        time.sleep(0.02)
    booting = [pid for pid in server.children() if pid not in before and pid_alive(pid)]
    return time.monotonic() - started, booting[0] if booting else victim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=500)
    parser.add_argument("--deadline", type=float, default=20.0, help="seconds a replacement has to load")
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        server = Server(models_dir=ROOT / "models", run_dir=Path(scratch) / "run", workers=2,
                        conf_path=ROOT / "conf" / "models.toml").start()
        try:
            reference = server.post(PATH, json=BODY).json()["predictions"]
            traffic = CheckedTraffic(server.url + PATH, reference)
            threads = traffic.start(args.clients)
            times, hangs = [], []
            for start in range(args.starts):
                seconds, hung = replace_one(server, args.deadline)
                if hung is not None:
                    hangs.append(hung)
                    print(f"start {start}: worker {hung} not loaded after {seconds:.1f} s\n{stacks(hung)}", flush=True)
                    os.kill(hung, signal.SIGKILL)
                    server.wait_workers_loaded(2, 120)
                else:
                    times.append(seconds)
                if start % 50 == 49:
                    print(f"{start + 1} starts: median {statistics.median(times):.2f} s, max {max(times):.2f} s, "
                          f"{traffic.answers} answers, {traffic.failed} failed, {traffic.wrong} wrong, {len(hangs)} hangs", flush=True)
            traffic.stop.set()
            for thread in threads:
                thread.join(30)
            scrape = samples(server)
            times.sort()
            print(f"starts {args.starts}, hangs {len(hangs)}, answers {traffic.answers}, failed {traffic.failed}, "
                  f"wrong {traffic.wrong}; stop-to-loaded median {statistics.median(times):.2f} s, "
                  f"p99 {times[int(0.99 * (len(times) - 1))]:.2f} s, max {times[-1]:.2f} s; forks by zygote "
                  f"{value(scrape, 'forkserve_worker_forks_total', by='zygote'):.0f}, by master "
                  f"{value(scrape, 'forkserve_worker_forks_total', by='master'):.0f}; zygote faults "
                  f"{sum(v for (name, _), v in scrape.items() if name == 'forkserve_zygote_faults_total'):.0f}")
            for error in traffic.errors:
                print("error:", error)
            states = read_worker_states(server.run_dir)
            print(f"workers now: {sorted(states)}")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
