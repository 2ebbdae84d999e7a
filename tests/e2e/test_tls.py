"""TLS on both ports with real clients: requests and curl over HTTPS, grpcio's secure_channel, tritonclient with
ssl=True; mutual TLS; a bad file at start; a bad file and a renewed certificate while the server runs.

Two 1-worker servers over the MLP, started together: `tls_server` (a certificate, no client certificates)
and `mtls_server` (FORKSERVE_TLS_CLIENT_CA). The certificates are made with the openssl command line
(tests.certificates). This module imports tritonclient, so never server.protocols.v2.protos.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from server.state import read_worker_states
from tests.certificates import Pair, make_ca, make_cert
from tests.support.harness import ROOT, Server, wait_until
from tests.support.metrics import samples, value
from tests.support.models import copy_models
from tests.support.traffic import Traffic

FEATURES = np.full((2, 20), 0.5, np.float32)
CLIENT_TIMEOUT = 2  # FORKSERVE_CLIENT_TIMEOUT of tls_server: the deadline of a REST handshake
CURL = shutil.which("curl") or "/usr/bin/curl"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Pair]:
    """The test CA; server certificates (serial 1, and the renewal, serial 2); a client's; a stranger's from another CA."""
    directory = tmp_path_factory.mktemp("pki")
    ca, other_ca = make_ca(directory, "ca"), make_ca(directory, "other-ca")
    return {"ca": ca, "server": make_cert(directory, ca, "server", "localhost", 1),
            "renewed": make_cert(directory, ca, "renewed", "localhost renewed", 2),
            "client": make_cert(directory, ca, "client", "client", 3, client=True),
            "stranger": make_cert(directory, other_ca, "stranger", "stranger", 4, client=True)}


def install(pair: Pair, cert: Path, key: Path) -> None:
    """Both files replaced by rename, as cert-manager and a Kubernetes secret volume do."""
    for source, target in ((pair.cert, cert), (pair.key, key)):
        shutil.copy(source, target.with_name(f".{target.name}.new"))
        os.replace(target.with_name(f".{target.name}.new"), target)


@pytest.fixture(scope="module")
def servers(model_repo: Path, pki: dict[str, Pair], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    """Both servers, started at once (each costs a TensorFlow start): TLS with renewable files, and mutual TLS."""
    root = tmp_path_factory.mktemp("tls")
    live = root / "live"
    live.mkdir()
    install(pki["server"], live / "tls.crt", live / "tls.key")
    client = (str(pki["client"].cert), str(pki["client"].key))
    tls_env = {"FORKSERVE_TLS_CERT": str(live / "tls.crt"), "FORKSERVE_TLS_KEY": str(live / "tls.key")}
    plain = Server(models_dir=copy_models(model_repo, root / "models", "mlp"), run_dir=root / "run", workers=1,
                   tls_ca=pki["ca"].cert,
                   env={**tls_env, "FORKSERVE_POLL_INTERVAL": "0.5", "FORKSERVE_CLIENT_TIMEOUT": str(CLIENT_TIMEOUT),
                        "FORKSERVE_GRPC_MAX_CONNECTION_AGE": "1"})  # a retiring worker's gRPC clients move within ~2 s
    mutual = Server(models_dir=copy_models(model_repo, root / "models-m", "mlp"), run_dir=root / "run-m", workers=1,
                    tls_ca=pki["ca"].cert, tls_client=client,
                    env={"FORKSERVE_TLS_CERT": str(pki["server"].cert), "FORKSERVE_TLS_KEY": str(pki["server"].key),
                         "FORKSERVE_TLS_CLIENT_CA": str(pki["ca"].cert)})
    try:
        for server in (plain, mutual):
            server.start(timeout=0)
        for server in (plain, mutual):
            server.wait_workers_loaded(1)
        yield plain, mutual
    finally:
        plain.stop()
        mutual.stop()


@pytest.fixture(scope="module")
def tls_server(servers: tuple[Server, Server]) -> Server:
    return servers[0]


@pytest.fixture(scope="module")
def mtls_server(servers: tuple[Server, Server]) -> Server:
    return servers[1]


def presented(port: int, pki: dict[str, Pair], alpn: str | None = None, client: Pair | None = None) -> str:
    """The serial number of the certificate a new TLS handshake with 127.0.0.1:PORT presents (verified against the CA)."""
    context = ssl.create_default_context(cafile=pki["ca"].cert)
    if alpn:
        context.set_alpn_protocols([alpn])  # gRPC servers speak HTTP/2 only
    if client is not None:
        context.load_cert_chain(client.cert, client.key)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as wrapped:
        return wrapped.getpeercert()["serialNumber"]


def channel_credentials(pki: dict[str, Pair], client: Pair | None = None) -> grpc.ChannelCredentials:
    if client is None:
        return grpc.ssl_channel_credentials(pki["ca"].cert.read_bytes())
    return grpc.ssl_channel_credentials(pki["ca"].cert.read_bytes(), client.key.read_bytes(), client.cert.read_bytes())


def predict(channel: grpc.Channel) -> np.ndarray:
    """TF Serving's Predict on mlp, as TF Serving's docs build the request."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "mlp"
    request.inputs["features"].CopyFrom(tf.make_tensor_proto(FEATURES))
    answer = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    return tf.make_ndarray(answer.outputs["logits"])


def health_status(channel: grpc.Channel) -> str:
    answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)


def grpc_error(server: Server, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    """The code a health check over this channel ends with (credentials None: plaintext)."""
    target = f"localhost:{server.grpc_port}"
    channel = grpc.secure_channel(target, credentials) if credentials is not None else grpc.insecure_channel(target)
    with channel:
        with pytest.raises(grpc.RpcError) as caught:
            health_status(channel)
    return caught.value.code()


def curl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CURL, "--silent", "--show-error", "--max-time", "20", *args], capture_output=True, text=True,
                          timeout=60)


# --- TLS: any client that trusts the certificate -----------------------------------------------------------


def test_requests_and_curl_over_https_verify_the_certificate_and_plain_http_gets_nothing(
        tls_server: Server, pki: dict[str, Pair]) -> None:
    answer = tls_server.post("/v1/models/mlp:predict", json={"instances": FEATURES.tolist()})
    assert answer.status_code == 200 and np.array(answer.json()["predictions"]).shape == (2, 2)
    assert tls_server.get("/readyz").json()["status"] == "ready"
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{tls_server.port}/readyz", timeout=10)
    url = f"https://localhost:{tls_server.port}/v1/models/mlp:predict"
    done = curl("--cacert", str(pki["ca"].cert), "-H", "Content-Type: application/json",
                "-d", '{"instances": [[' + ",".join(["0.5"] * 20) + "]]}", url)
    assert done.returncode == 0, done.stderr
    assert np.allclose(yaml.safe_load(done.stdout)["predictions"], answer.json()["predictions"][:1], atol=1e-6)
    assert curl(url).returncode == 60  # the system's CAs do not know the test CA: "peer certificate cannot be authenticated"


def test_grpc_secure_channel_predict_and_health_and_a_plaintext_client_is_refused_without_a_log_line(
        tls_server: Server, pki: dict[str, Pair]) -> None:
    with grpc.secure_channel(f"localhost:{tls_server.grpc_port}", channel_credentials(pki)) as channel:
        logits = predict(channel)
        assert health_status(channel) == "SERVING"
    expected = np.array(tls_server.post("/v1/models/mlp:predict", json={"instances": FEATURES.tolist()}).json()["predictions"])
    assert np.allclose(logits, expected, atol=1e-6)
    assert grpc_error(tls_server, None) == grpc.StatusCode.UNAVAILABLE
    with socket.create_connection(("127.0.0.1", tls_server.grpc_port), timeout=10) as raw:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # a port scan, an HTTP client on the wrong port
        raw.settimeout(10)
        assert raw.recv(100) == b""
    assert presented(tls_server.grpc_port, pki, alpn="h2") == presented(tls_server.port, pki) == "01"
    # grpc-core logs each failed handshake unformatted on stderr unless GRPC_VERBOSITY is above INFO (server.worker.hooks)
    assert "Handshake failed" not in tls_server.log()


def test_tritonclient_with_ssl_over_http_and_grpc(tls_server: Server, pki: dict[str, Pair]) -> None:
    rest = triton_http.InferenceServerClient(f"localhost:{tls_server.port}", ssl=True,
                                             ssl_options={"ca_certs": str(pki["ca"].cert)})
    rpc = triton_grpc.InferenceServerClient(f"localhost:{tls_server.grpc_port}", ssl=True,
                                            root_certificates=str(pki["ca"].cert))
    try:
        rest_input = triton_http.InferInput("features", list(FEATURES.shape), "FP32")
        rest_input.set_data_from_numpy(FEATURES)
        rpc_input = triton_grpc.InferInput("features", list(FEATURES.shape), "FP32")
        rpc_input.set_data_from_numpy(FEATURES)
        assert rest.is_server_ready() and rpc.is_server_ready()
        over_rest = rest.infer("mlp", [rest_input]).as_numpy("logits")
        over_grpc = rpc.infer("mlp", [rpc_input]).as_numpy("logits")
        assert over_rest.shape == (2, 2) and np.allclose(over_rest, over_grpc, atol=1e-6)
    finally:
        rest.close()
        rpc.close()


def test_clients_that_stall_in_the_handshake_hold_no_request_thread_past_the_client_timeout(
        tls_server: Server, pki: dict[str, Pair]) -> None:
    """36 connections (more than the worker's 32 request threads) send 5 bytes of a ClientHello and stop."""
    stalled = [socket.create_connection(("127.0.0.1", tls_server.port), timeout=30) for _ in range(36)]
    try:
        for connection in stalled:
            connection.sendall(b"\x16\x03\x01\x02\x00")
        started = time.monotonic()  # NOTE: gthread takes connections in the order they arrived: these first
        assert tls_server.get("/healthz", timeout=CLIENT_TIMEOUT + 8).status_code == 200
        assert time.monotonic() - started < CLIENT_TIMEOUT + 3
        for connection in stalled:
            assert connection.recv(100) == b""  # closed by the server
    finally:
        for connection in stalled:
            connection.close()
    assert f"no TLS handshake within {CLIENT_TIMEOUT}s" in tls_server.log()


def test_a_client_stalled_mid_body_over_tls_gets_408_after_the_client_timeout(tls_server: Server, pki: dict[str, Pair]) -> None:
    """The receive timeout forkserve sets on the connection holds under TLS too (the read ends in an SSL error, an OSError)."""
    context = ssl.create_default_context(cafile=pki["ca"].cert)
    with socket.create_connection(("127.0.0.1", tls_server.port), timeout=30) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as stalled:
        stalled.sendall(b"POST /v1/models/mlp:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 1000\r\n\r\n{\"instances\": [")
        started = time.monotonic()
        assert stalled.recv(100).startswith(b"HTTP/1.1 408")
        assert CLIENT_TIMEOUT - 0.5 < time.monotonic() - started < CLIENT_TIMEOUT + 5


# --- mutual TLS: a certificate the client CA signed, or nothing ---------------------------------------------


def test_mutual_tls_serves_a_client_with_a_certificate_on_both_ports_and_refuses_one_without(
        mtls_server: Server, pki: dict[str, Pair]) -> None:
    body = {"instances": FEATURES.tolist()}
    assert mtls_server.post("/v1/models/mlp:predict", json=body).status_code == 200
    for refused in (None, (str(pki["stranger"].cert), str(pki["stranger"].key))):
        with pytest.raises(requests.ConnectionError):  # requests' SSLError is one
            mtls_server.post("/v1/models/mlp:predict", json=body, cert=refused)
    url = f"https://localhost:{mtls_server.port}/healthz"
    assert curl("--cacert", str(pki["ca"].cert), "--cert", str(pki["client"].cert), "--key", str(pki["client"].key),
                url).returncode == 0
    assert curl("--cacert", str(pki["ca"].cert), url).returncode != 0
    with grpc.secure_channel(f"localhost:{mtls_server.grpc_port}", channel_credentials(pki, pki["client"])) as channel:
        assert predict(channel).shape == (2, 2) and health_status(channel) == "SERVING"
    assert grpc_error(mtls_server, channel_credentials(pki)) == grpc.StatusCode.UNAVAILABLE
    assert grpc_error(mtls_server, channel_credentials(pki, pki["stranger"])) == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_with_tritonclient_over_http_and_grpc(mtls_server: Server, pki: dict[str, Pair]) -> None:
    client = pki["client"]
    rest = triton_http.InferenceServerClient(f"localhost:{mtls_server.port}", ssl=True, ssl_options={
        "ca_certs": str(pki["ca"].cert), "certfile": str(client.cert), "keyfile": str(client.key)})
    rpc = triton_grpc.InferenceServerClient(f"localhost:{mtls_server.grpc_port}", ssl=True,
                                            root_certificates=str(pki["ca"].cert), private_key=str(client.key),
                                            certificate_chain=str(client.cert))
    try:
        assert rest.is_server_ready() and rpc.is_server_ready()
    finally:
        rest.close()
        rpc.close()


def documented_probe(marker: str) -> list[str]:
    """The exec probe docs/deployment.md gives for mutual TLS (the YAML block holding `marker`)."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if marker in b)
    probe = yaml.safe_load(block)["readinessProbe"]
    return probe["exec"]["command"]


def test_the_documented_exec_probe_for_mutual_tls_answers_as_readyz_does(mtls_server: Server, pki: dict[str, Pair]) -> None:
    command = documented_probe("load_cert_chain")
    assert command[:2] == ["python3", "-c"]
    script = (command[2].replace("/etc/forkserve/probe/tls.crt", str(pki["client"].cert))
              .replace("/etc/forkserve/probe/tls.key", str(pki["client"].key))
              .replace("127.0.0.1:8000", f"127.0.0.1:{mtls_server.port}"))
    assert script != command[2]
    assert subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=30).returncode == 0
    without = script.replace(str(pki["client"].key), str(pki["stranger"].key)).replace(str(pki["client"].cert), str(pki["stranger"].cert))
    assert subprocess.run([sys.executable, "-c", without], capture_output=True, timeout=30).returncode != 0


# --- the files: wrong at start, wrong later, renewed ----------------------------------------------------------


@pytest.mark.parametrize("case", ["missing", "not PEM", "wrong key", "client CA not PEM", "key without certificate"])
def test_a_bad_tls_file_stops_the_start_in_one_line(case: str, model_repo: Path, pki: dict[str, Pair], tmp_path: Path) -> None:
    env = {"FORKSERVE_TLS_CERT": str(pki["server"].cert), "FORKSERVE_TLS_KEY": str(pki["server"].key)}
    expected = {
        "missing": (f"FORKSERVE_TLS_CERT {tmp_path / 'nope.pem'}: No such file or directory",
                    {"FORKSERVE_TLS_CERT": str(tmp_path / "nope.pem")}),
        "not PEM": (f"FORKSERVE_TLS_KEY {pki['server'].cert}: no PEM private keys in it",
                    {"FORKSERVE_TLS_KEY": str(pki["server"].cert)}),
        "wrong key": (f"FORKSERVE_TLS_KEY {pki['renewed'].key} is not the key of the certificate in FORKSERVE_TLS_CERT",
                      {"FORKSERVE_TLS_KEY": str(pki["renewed"].key)}),
        "client CA not PEM": (f"FORKSERVE_TLS_CLIENT_CA {pki['ca'].key}: no PEM certificate",
                              {"FORKSERVE_TLS_CLIENT_CA": str(pki["ca"].key)}),
        "key without certificate": ("FORKSERVE_TLS_CERT and FORKSERVE_TLS_KEY go together", {"FORKSERVE_TLS_CERT": ""}),
    }
    line, changes = expected[case]
    server = Server(models_dir=model_repo, run_dir=tmp_path / "run", workers=1, env={**env, **changes}).start(timeout=0)
    assert server.process is not None
    assert server.process.wait(60) == 1
    log = server.log()
    assert [entry for entry in log.splitlines() if "cannot start" in entry] == [
        next(entry for entry in log.splitlines() if line in entry)], log
    assert "Traceback" not in log and "Booting worker" not in log


def test_a_bad_file_is_kept_out_of_a_rollout_and_a_renewed_certificate_rolls_out_without_a_failed_call(
        tls_server: Server, pki: dict[str, Pair]) -> None:
    """The files go bad (a key that is not the certificate's), a reload rolls; then the renewal arrives. Traffic throughout."""
    live = Path(tls_server.env["FORKSERVE_TLS_CERT"]).parent
    rest = Traffic(f"{tls_server.url}/v1/models/mlp:predict", verify=str(pki["ca"].cert))
    rest.start(2)
    rpc_codes: list[str] = []
    stop = threading.Event()

    def rpc_client() -> None:
        with grpc.secure_channel(f"localhost:{tls_server.grpc_port}", channel_credentials(pki)) as channel:
            while not stop.is_set():
                try:
                    predict(channel)
                    rpc_codes.append("OK")
                except grpc.RpcError as exc:
                    rpc_codes.append(exc.code().name)

    rpc_thread = threading.Thread(target=rpc_client, daemon=True)
    rpc_thread.start()
    try:
        shutil.copy(pki["renewed"].key, live / ".tls.key.new")
        os.replace(live / ".tls.key.new", live / "tls.key")  # the certificate is still serial 1's
        wait_until(lambda: value(samples(tls_server), "forkserve_tls_last_reload_successful") == 0, 30, "the bad key seen")
        before = tls_server.worker_pids()
        os.kill(tls_server.process.pid, signal.SIGHUP)  # a reload while the files are bad
        wait_until(lambda: not set(before) & set(tls_server.worker_pids()) and tls_server.worker_pids(), 120,
                   "the reload to replace the worker")
        assert tls_server.process.poll() is None
        assert presented(tls_server.port, pki) == presented(tls_server.grpc_port, pki, alpn="h2") == "01"  # the last good set
        assert tls_server.log().count("is not the key of the certificate") == 1
        assert all(state.ready for state in read_worker_states(tls_server.run_dir).values())

        install(pki["renewed"], live / "tls.crt", live / "tls.key")
        wait_until(lambda: presented(tls_server.port, pki) == "02" and presented(tls_server.grpc_port, pki, alpn="h2") == "02",
                   120, "a handshake to present the renewed certificate on both ports")
        assert value(samples(tls_server), "forkserve_tls_last_reload_successful") == 1
        renewed_at = len(rest.answers), len(rpc_codes)
        wait_until(lambda: len(rest.answers) > renewed_at[0] + 20 and len(rpc_codes) > renewed_at[1] + 20, 60,
                   "calls to the renewed worker")
    finally:
        rest.finish()
        stop.set()
        rpc_thread.join(60)
    log = tls_server.log()
    assert "Worker failed to boot" not in log and "exit code 3" not in log
    assert "rollout" in log and "(TLS certificate changed)" in log
    assert rest.failures() == [] and len(rest.answers) > 20
    assert set(rpc_codes) == {"OK"} and len(rpc_codes) > 20


def test_the_start_line_names_the_certificate_and_whether_clients_need_one(tls_server: Server, mtls_server: Server,
                                                                           pki: dict[str, Pair]) -> None:
    assert "forkserve: TLS on both ports: certificate " in tls_server.log()
    assert f"client certificates required (CAs: {pki['ca'].cert})" in mtls_server.log()
    assert "client certificates required" not in tls_server.log().split("TLS files changed")[0]
