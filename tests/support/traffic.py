"""Clients that post predictions until stopped, each after a short pause, and record every answer."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import requests

BODY = {"instances": [[0.5] * 20, [-0.25] * 20]}


@dataclass
class Traffic:
    """Clients posting predictions until stopped, `pause` seconds apart each; every answer is recorded."""

    url: str
    body: dict = field(default_factory=lambda: BODY)
    stop: threading.Event = field(default_factory=threading.Event)
    answers: list[tuple[float, int, str, str, float]] = field(default_factory=list)  # (t, status, version, error, seconds)
    lock: threading.Lock = field(default_factory=threading.Lock)
    verify: str | bool = True  # a CA file for a server with a test certificate (server.tls)
    pause: float = 0.05  # each client's think time between answer and next request (bench.rollout: 0, a closed loop)

    def client(self) -> None:
        session = requests.Session()
        while not self.stop.is_set():
            at = time.monotonic()
            try:
                # NOTE: per request: a session's verify loses to REQUESTS_CA_BUNDLE (requests issue 3829)
                response = session.post(self.url, json=self.body, timeout=30, verify=self.verify)
                error = response.text[:200] if not response.ok else ""
                record = (at, response.status_code, response.headers.get("X-Model-Version", ""), error, time.monotonic() - at)
            except requests.RequestException as exc:
                record = (at, 0, "", repr(exc), time.monotonic() - at)
            with self.lock:
                self.answers.append(record)
            # NOTE: 8 clients in a closed loop take 1.4 of this machine's 2 cores (300 requests/s): the rollouts under
            # test, and the other test process, would wait for CPU. Paused, 8 still keep requests in flight always.
            self.stop.wait(self.pause)

    def failures(self) -> list[tuple[float, int, str, str, float]]:
        with self.lock:
            return [a for a in self.answers if a[1] != 200]

    def start(self, clients: int) -> list[threading.Thread]:
        """Start `clients` client threads."""
        threads = [threading.Thread(target=self.client, daemon=True) for _ in range(clients)]
        for thread in threads:
            thread.start()
        self.threads = threads
        return threads

    def finish(self) -> None:
        """Stop the clients and wait for their last answers."""
        self.stop.set()
        for thread in getattr(self, "threads", []):
            thread.join(60)
