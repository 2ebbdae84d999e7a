"""gRPC under rollouts and restarts, and spread over the workers, with the unmodified client libraries.

8 clients, each on one channel kept for the whole module with its library's default settings: 4
tensorflow-serving-api PredictionServiceStub, 4 tritonclient.grpc InferenceServerClient. Each client
dials its own loopback address (127.0.0.1 ... 127.0.0.8; the server listens on 0.0.0.0): grpcio
shares one connection between a process's channels to the same address with the same arguments,
and separate clients would not. This module imports tritonclient, so never server.protocols.v2.protos.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.support.grpc_traffic import GrpcTraffic, loopback_clients
from tests.support.harness import ROOT, Server, free_port, wait_until
from tests.support.models import copy_models

RECONNECT_BACKOFF = 5.0  # seconds: grpcio's first reconnect backoffs (1 s, then x1.6, with 20 % jitter), twice over


@pytest.fixture(scope="module")
def fleet(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A 2-worker forkserve over mlp version 1, gRPC on every address (each client dials its own loopback one)."""
    repo = copy_models(model_repo, tmp_path_factory.mktemp("grpc-rollout-models"), "mlp")
    port = free_port()
    server = Server(models_dir=repo, run_dir=tmp_path_factory.mktemp("grpc-rollout-run"), workers=2, grpc_port=port,
                    env={"FORKSERVE_POLL_INTERVAL": "0.5", "FORKSERVE_BOOT_TIMEOUT": "90",
                         "FORKSERVE_GRPC_BIND": f"0.0.0.0:{port}"}).start()
    yield server
    server.stop()


def _timed(step: Callable[[], None]) -> tuple[float, float]:
    started = time.monotonic()
    step()
    return started, time.monotonic()


def test_publish_sighup_and_a_killed_worker_under_8_grpc_clients(fleet: Server, model_repo: Path) -> None:
    server = fleet
    clients = GrpcTraffic(loopback_clients(server.grpc_port, 4))
    clients.start()
    try:
        wait_until(lambda: len({a.client for a in clients.between(0, time.monotonic()) if a.code == "OK"}) == 8, 60,
                   "every client answered")

        def publish() -> None:
            done = subprocess.run(
                [sys.executable, "-m", "server", "publish", "mlp", str(model_repo / "mlp" / "1" / "model.keras"),
                 "--models", str(server.models_dir)], cwd=ROOT, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0 and done.stdout.strip() == "2", done.stderr
            wait_until(lambda: server.all_serve("mlp", [2]), 180, "the rollout to version 2")

        def sighup() -> None:
            before = set(server.worker_pids())
            os.kill(server.process.pid, signal.SIGHUP)
            wait_until(lambda: not before & set(server.worker_pids()) and server.all_serve("mlp", [2]), 180, "the HUP rollout")

        victim: list[int] = []

        def sigkill() -> None:
            victim.append(server.worker_pids()[0])
            os.kill(victim[0], signal.SIGKILL)
            server.wait_reaped(victim[0])
            server.wait_workers_loaded(2)

        published = _timed(publish)
        hupped = _timed(sighup)
        wait_until(lambda: len(clients.between(time.monotonic() - 1, time.monotonic())) > 8, 30, "traffic after the HUP")
        before_kill = {a.client: a for a in clients.between(0, time.monotonic()) if a.code == "OK"}  # each one's last
        killed = _timed(sigkill)
        # NOTE: a replacement from the zygote is ready in under a second: the kill's window runs on until
        # 100 more calls were answered after it, so that every step is judged on as many calls.
        wait_until(lambda: len(clients.between(killed[1], time.monotonic())) > 100, 30, "traffic after the kill")
        killed = (killed[0], time.monotonic())
    finally:
        clients.finish()

    during = {name: clients.between(*window) for name, window in
              (("publish", published), ("sighup", hupped), ("sigkill", killed))}
    counts = {name: (len(calls), Counter(a.code for a in calls if a.code != "OK")) for name, calls in during.items()}
    print(f"calls and failures per step: {counts}")
    assert all(len(calls) > 100 for calls in during.values()), counts
    assert [a for a in clients.failures() if a.ended < killed[0]] == []  # (a) and (b): not one failed call
    lost = [a for a in clients.failures() if a.ended >= killed[0]]
    # (c) only clients whose channel was on the killed worker lose calls, all UNAVAILABLE, and only until their
    # channel reconnects. NOTE: usually the call in flight and at times the next one on the dying connection;
    # once (1 of 6 runs) a channel failed fast for about a second, in grpcio's reconnect backoff after the reset
    # (thousands of instant UNAVAILABLE from a client calling in a loop): that is the client's default policy.
    assert all(a.code.endswith("UNAVAILABLE") and a.started <= killed[0] + RECONNECT_BACKOFF for a in lost), lost[:5]
    for answer in lost:
        if answer.client.startswith("tfs"):  # its channel was on the victim: its last answer came from there
            assert before_kill[answer.client].worker == str(victim[0]), (answer, before_kill[answer.client])
    for calls in during.values():  # every client kept being answered through each step
        assert len({a.client for a in calls if a.code == "OK"}) == 8


def test_four_channels_reach_both_workers(fleet: Server) -> None:
    """HTTP/2 channels are long-lived; a worker above its share sends GOAWAY until 4 channels sit 2 and 2."""
    clients = GrpcTraffic(loopback_clients(fleet.grpc_port, 4, with_triton=False))
    clients.start()
    try:
        def spread() -> bool:
            recent = clients.between(time.monotonic() - 0.5, time.monotonic())
            on = {a.client: a.worker for a in recent if a.code == "OK"}  # each channel's latest worker
            return len(on) == 4 and sorted(Counter(on.values()).values()) == [2, 2]

        wait_until(spread, 60, "4 channels spread 2 and 2 over the workers")
    finally:
        clients.finish()
    assert clients.failures() == []
