"""gRPC's lifecycle on real servers: a worker that cannot bind, a port already taken, gRPC off, a graceful stop."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
from pathlib import Path
from typing import Iterator

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from tests.support.harness import Server, free_port, pid_alive, wait_until
from tests.support.metrics import samples, value
from tests.support.models import copy_models


def predict(model: str, inputs: dict[str, np.ndarray]) -> predict_pb2.PredictRequest:
    """A TF Serving Predict request."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    for name, array in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(array))
    return request


MLP = predict("mlp", {"features": np.full((2, 20), 0.5, np.float32)})


def listening_pids(port: int) -> set[int]:
    """Processes with a socket listening on `port` (ss)."""
    out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    return {int(pid) for pid in re.findall(r"pid=(\d+)", out)}


def refused_start(tmp_path: Path, models: Path, grpc_bind: str) -> tuple[int, list[str]]:
    """Start a forkserve with FORKSERVE_GRPC_BIND = `grpc_bind`; its exit status and error lines (it must exit)."""
    server = Server(models_dir=models, run_dir=tmp_path / f"refused-{free_port()}", workers=1,
                    env={"FORKSERVE_GRPC_BIND": grpc_bind})
    server.start(timeout=0)
    assert server.process is not None
    try:
        code = server.process.wait(60)
    finally:
        server.stop()  # one that was not refused (a failing test) must not outlive it
    errors = [line for line in server.log().splitlines() if "[ERROR]" in line or "Traceback" in line]
    return code, errors


@pytest.fixture(scope="module")
def first(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A 1-worker forkserve over mlp and slow, gRPC on its own port."""
    repo = copy_models(model_repo, tmp_path_factory.mktemp("grpc-lifecycle-models"), "mlp", "slow")
    run_dir = tmp_path_factory.mktemp("grpc-lifecycle-run")
    conf = run_dir / "models.toml"
    conf.write_text("[models.slow]\nmax_batch_size = 8\n")  # warm-up at 1, 2, 4 and 8 rows, not up to 64: each row is slow
    server = Server(models_dir=repo, run_dir=run_dir, conf_path=conf, workers=1).start()
    yield server
    server.stop()


def test_a_worker_that_cannot_bind_the_grpc_port_is_not_ready_and_says_why(model_repo: Path, tmp_path: Path) -> None:
    """The port is free at the master's check and taken (a plain listener, as TF Serving's) before the worker binds.

    NOTE: deterministic in practice: the master logs its run directory right after the check and
    before forking; the worker binds only once TensorFlow is imported and its models are warm (seconds).
    """
    repo = copy_models(model_repo, tmp_path / "models", "mlp")
    server = Server(models_dir=repo, run_dir=tmp_path / "run", workers=1)
    server.start(timeout=0)
    squatter = socket.socket()
    try:
        wait_until(lambda: "forkserve: run directory" in server.log(), 60, "the master's port check", interval=0.01)
        squatter.bind(("127.0.0.1", server.grpc_port))
        squatter.listen()
        assert not server.worker_pids()  # no worker loaded yet: none can have bound the port
        [worker] = server.wait_workers_loaded(1)
        readyz = server.get("/readyz")
        assert readyz.status_code == 503
        assert readyz.json()["status"] == "not ready"
        assert f"cannot listen for gRPC on 127.0.0.1:{server.grpc_port}" in readyz.json()["grpc"]
        assert f"forkserve worker {worker} NOT ready: gRPC: cannot listen for gRPC on 127.0.0.1:{server.grpc_port}" in server.log()
        # Not a silent REST-only worker, and not a boot error: the worker stays, answering REST, not ready.
        assert server.get("/healthz").status_code == 200
        assert server.post("/v1/models/mlp:predict", json={"instances": [[0.5] * 20]}).status_code == 200
        assert pid_alive(worker) and server.process.poll() is None and server.worker_pids() == [worker]
        assert listening_pids(server.grpc_port) == {os.getpid()}  # only the squatter: no shard of the worker stayed
        assert "leaves with exit code" not in server.log() and "Worker failed to boot" not in server.log()
    finally:
        squatter.close()
        assert server.stop() == 0


def test_a_second_forkserve_on_the_same_grpc_port_is_refused_and_the_first_keeps_its_connections(
        first: Server, model_repo: Path, tmp_path: Path) -> None:
    channel = grpc.insecure_channel(first.grpc_target)
    states: list[grpc.ChannelConnectivity] = []
    channel.subscribe(states.append, try_to_connect=True)
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    try:
        stub.Predict(MLP, timeout=30)
        # The connectivity callbacks come on grpcio's own thread: READY may follow the answer a little.
        wait_until(lambda: states and states[-1] == grpc.ChannelConnectivity.READY, 10, "the channel's READY callback")
        connected = len(states)
        code, errors = refused_start(tmp_path, first.models_dir, first.grpc_target)
        assert code != 0
        assert len(errors) == 1, errors
        assert f"cannot start: gRPC port {first.grpc_target} is taken (Address already in use)" in errors[0]
        stub.Predict(MLP, timeout=30)
        assert states[connected - 1:] == [grpc.ChannelConnectivity.READY]  # never left READY: the same connection
    finally:
        channel.close()


def test_the_port_is_owned_from_the_masters_start_to_its_exit(model_repo: Path, tmp_path: Path) -> None:
    """A second forkserve is refused while the first's workers still load (nobody listens yet); a third starts at once after.

    NOTE: the second master's start (a gunicorn process, no TensorFlow) is over long before the
    first's worker has imported TensorFlow and warmed its model; the empty listener set checked
    after the refusal proves it. Without the master's lock the second passed the listener check
    and both servers' workers shared the port.
    """
    repo = copy_models(model_repo, tmp_path / "models", "mlp")
    owner = Server(models_dir=repo, run_dir=tmp_path / "owner", workers=1)
    owner.start(timeout=0)
    try:
        wait_until(lambda: "forkserve: run directory" in owner.log(), 60, "the first master's claim", interval=0.01)
        code, errors = refused_start(tmp_path, repo, owner.grpc_target)
        assert not listening_pids(owner.grpc_port)  # the first's worker was still loading: the lock refused the second
        assert code != 0 and len(errors) == 1, errors
        assert (f"cannot start: gRPC port {owner.grpc_target} is taken (Address already in use): "
                f"another forkserve holds port {owner.grpc_port}") in errors[0]
        [worker] = owner.wait_workers_loaded(1)
        with grpc.insecure_channel(owner.grpc_target) as channel:
            call = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict.with_call(MLP, timeout=30)
        assert dict(call[1].trailing_metadata())["x-forkserve-worker"] == str(worker)
    finally:
        assert owner.stop() == 0
    successor = Server(models_dir=repo, run_dir=tmp_path / "successor", workers=1, grpc_port=owner.grpc_port).start()
    try:
        [worker] = successor.worker_pids()
        assert listening_pids(successor.grpc_port) == {worker}
        with grpc.insecure_channel(successor.grpc_target) as channel:
            call = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict.with_call(MLP, timeout=30)
        assert dict(call[1].trailing_metadata())["x-forkserve-worker"] == str(worker)
    finally:
        assert successor.stop() == 0


@pytest.mark.parametrize("reuseport", [False, True], ids=["plain (TF Serving)", "SO_REUSEPORT (grpc-core's default)"])
def test_a_foreign_listener_on_the_grpc_port_is_refused(model_repo: Path, tmp_path: Path, reuseport: bool) -> None:
    with socket.socket() as foreign:
        if reuseport:
            foreign.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        foreign.bind(("127.0.0.1", 0))
        foreign.listen()
        port = foreign.getsockname()[1]
        code, errors = refused_start(tmp_path, model_repo, f"127.0.0.1:{port}")
    assert code != 0 and len(errors) == 1, errors
    assert f"gRPC port 127.0.0.1:{port} is taken" in errors[0]


@pytest.mark.parametrize("bind", ["localhost", "127.0.0.1:notaport", "127.0.0.1:0", "no-such-host.invalid:8500"])
def test_a_malformed_grpc_bind_is_refused_at_start_in_one_line(model_repo: Path, tmp_path: Path, bind: str) -> None:
    code, errors = refused_start(tmp_path, model_repo, bind)
    assert code != 0 and len(errors) == 1, errors
    assert "cannot start: gRPC address" in errors[0] and repr(bind) in errors[0]


def test_an_empty_grpc_bind_turns_grpc_off(model_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(model_repo, tmp_path / "models", "mlp")
    server = Server(models_dir=repo, run_dir=tmp_path / "run", workers=1, env={"FORKSERVE_GRPC_BIND": ""}).start()
    try:
        assert server.get("/readyz").status_code == 200
        assert "gRPC" not in server.log() and "tcp_migrate_req" not in server.log()
        for pid in server.children():  # no worker listens on anything but the REST socket it inherited
            assert "cygrpc" not in Path(f"/proc/{pid}/maps").read_text()  # grpcio never loaded
        assert listening_pids(server.grpc_port) == set()
    finally:
        server.stop()


def test_a_retiring_worker_closes_its_listener_sends_goaway_and_finishes_a_slow_call(first: Server) -> None:
    """SIGTERM while a call on `slow` runs: the listener closes at once, idle channels get GOAWAY, the call succeeds."""
    [worker] = first.worker_pids()
    assert listening_pids(first.grpc_port) == {worker}
    busy = grpc.insecure_channel(first.grpc_target)
    idle = grpc.insecure_channel(first.grpc_target, options=[("grpc.primary_user_agent", "idle")])  # a connection of its own
    idle_states: list[grpc.ChannelConnectivity] = []
    idle.subscribe(idle_states.append, try_to_connect=True)
    try:
        prediction_service_pb2_grpc.PredictionServiceStub(idle).Predict(MLP, timeout=30)
        wait_until(lambda: idle_states and idle_states[-1] == grpc.ChannelConnectivity.READY, 10, "the idle channel's READY callback")
        rows = np.random.default_rng(0).random((6, 192, 192, 3), dtype=np.float32)
        call = prediction_service_pb2_grpc.PredictionServiceStub(busy).Predict.future(predict("slow", {"image": rows}),
                                                                                      timeout=60)
        wait_until(lambda: value(samples(first), "forkserve_inflight_requests", model="slow") >= 1, 30, "the slow call in flight")
        assert not call.done()
        os.kill(worker, signal.SIGTERM)
        wait_until(lambda: worker not in listening_pids(first.grpc_port), 10, "the retiring worker's listener to close")
        wait_until(lambda: grpc.ChannelConnectivity.IDLE in idle_states[1:], 10, "GOAWAY on the idle connection")
        response = call.result(timeout=60)
        assert response.outputs["score"].tensor_shape.dim[0].size == 6
        assert dict(call.trailing_metadata())["x-forkserve-worker"] == str(worker)
        first.wait_reaped(worker)
        assert f"forkserve worker {worker} leaves" not in first.log()  # a graceful exit, logged as nothing unusual
        [replacement] = first.wait_workers_loaded(1)
        assert prediction_service_pb2_grpc.PredictionServiceStub(idle).Predict.with_call(MLP, timeout=30)[1] \
            .trailing_metadata() and replacement != worker
    finally:
        busy.close()
        idle.close()
