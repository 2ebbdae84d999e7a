"""bench.grpc_load: h2load against a real grpcio server, every failed gRPC call counted although its HTTP status is 200."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import grpc
import pytest

from bench.grpc_load import ECHO_METHOD, HALF_FAIL_METHOD, GrpcCall, checked_call, frame, run_h2load, start_echo
from tests.support.harness import free_port

pytestmark = pytest.mark.skipif(shutil.which("h2load") is None, reason="h2load (nghttp2-client) is not installed")


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    port = free_port()
    servers = start_echo(port, processes=1)
    yield f"127.0.0.1:{port}"
    for server in servers:
        server.kill()
        server.join(10)


def test_frame_is_the_length_prefixed_message() -> None:
    assert frame(b"abc") == b"\x00\x00\x00\x00\x03abc"


def test_checked_call_keeps_the_answer_size(echo: str) -> None:
    call = checked_call(echo, ECHO_METHOD, b"x" * 100)
    assert call.response_size == 100


def test_checked_call_raises_on_a_failed_status(echo: str) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        checked_call(echo, "/bench.Echo/Missing", b"x")
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_h2load_run_counts_answered_calls_and_its_own_cpu(echo: str) -> None:
    call = checked_call(echo, ECHO_METHOD, os.urandom(120))
    result = run_h2load(call, connections=4, seconds=1, warm_up=1)
    assert result.errors == 0
    assert result.requests > 100 and result.requests_per_second > 100
    assert 0 < result.p50_seconds <= result.p99_seconds <= result.max_seconds
    assert 0 < result.client_cpu_seconds < 2


def test_h2load_run_counts_failed_calls_as_errors(echo: str) -> None:
    # every call is an HTTP 200 to h2load; only the missing answer bytes show the failures
    call = GrpcCall(echo, HALF_FAIL_METHOD, os.urandom(120), response_size=120)
    result = run_h2load(call, connections=4, seconds=1, warm_up=1)
    assert result.requests > 100
    assert abs(result.errors - result.requests / 2) <= 2


def test_h2load_run_counts_an_unimplemented_method_as_all_errors(echo: str) -> None:
    call = GrpcCall(echo, "/bench.Echo/Missing", b"x" * 120, response_size=120)
    result = run_h2load(call, connections=2, seconds=1, warm_up=1)
    assert result.requests > 0 and result.errors == result.requests
    assert result.requests_per_second == 0
