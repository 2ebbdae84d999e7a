"""server.rpc.tls: grpcio credentials from the accepted TLS set, on a real grpcio server and channel."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from server import tls
from server.rpc.tls import server_credentials
from server.settings import Settings
from tests.certificates import Pair, make_ca, make_cert


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Pair]:
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory, "ca")
    return {"ca": ca, "server": make_cert(directory, ca, "server", "localhost", 1),
            "client": make_cert(directory, ca, "client", "client", 2, client=True)}


@pytest.fixture
def accepted_reset() -> Iterator[None]:
    before = tls.accepted()
    tls._accepted = None
    yield
    tls._accepted = before


def check(port: int, credentials: grpc.ChannelCredentials) -> str:
    """grpc.health.v1 Check over a TLS channel to localhost: the status name, or the error code's."""
    with grpc.secure_channel(f"localhost:{port}", credentials) as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            return health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
        except grpc.RpcError as exc:
            return exc.code().name


def serve(credentials: grpc.ServerCredentials) -> tuple[grpc.Server, int]:
    server = grpc.server(ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server, port


def test_no_credentials_when_tls_is_off(accepted_reset: None) -> None:
    assert server_credentials(dataclasses.replace(Settings.from_env(), tls_cert=None, tls_key=None)) is None


def test_client_certificates_are_required_with_a_client_ca(pki: dict[str, Pair], accepted_reset: None) -> None:
    settings = dataclasses.replace(Settings.from_env(), tls_cert=pki["server"].cert, tls_key=pki["server"].key,
                                   tls_client_ca=pki["ca"].cert)
    credentials = server_credentials(settings)
    assert credentials is not None and tls.accepted() is not None  # read and checked in this process: no master forked it
    server, port = serve(credentials)
    try:
        ca = pki["ca"].cert.read_bytes()
        client = pki["client"]
        assert check(port, grpc.ssl_channel_credentials(ca, client.key.read_bytes(), client.cert.read_bytes())) == "SERVING"
        assert check(port, grpc.ssl_channel_credentials(ca)) == "UNAVAILABLE"
    finally:
        server.stop(0)


def test_without_a_client_ca_any_client_that_trusts_the_certificate_is_served(pki: dict[str, Pair], accepted_reset: None) -> None:
    settings = dataclasses.replace(Settings.from_env(), tls_cert=pki["server"].cert, tls_key=pki["server"].key)
    server, port = serve(server_credentials(settings))
    try:
        assert check(port, grpc.ssl_channel_credentials(pki["ca"].cert.read_bytes())) == "SERVING"
        with grpc.insecure_channel(f"localhost:{port}") as channel:  # plaintext: no answer
            with pytest.raises(grpc.RpcError) as caught:
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(0)
