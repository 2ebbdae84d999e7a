"""The master's gRPC port check: malformed binds, a port another listener holds, tcp_migrate_req."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from server.master.grpc_port import migrate_warning, problem_with, split_address


def _listener(reuseport: bool = False) -> socket.socket:
    sock = socket.socket()
    if reuseport:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_split_address_reads_host_port_ipv6_and_every_address() -> None:
    assert split_address("127.0.0.1:8500") == ("127.0.0.1", 8500)
    assert split_address("[::1]:8500") == ("::1", 8500)
    assert split_address(":8500") == ("0.0.0.0", 8500)


@pytest.mark.parametrize("bind", ["8500", "localhost", "127.0.0.1:", "127.0.0.1:http", "127.0.0.1:70000", "127.0.0.1:0"])
def test_a_malformed_bind_is_a_problem_naming_it(bind: str) -> None:
    problem = problem_with(bind)
    assert problem is not None and repr(bind) in problem and "HOST:PORT" in problem


def test_an_unresolvable_host_is_a_problem() -> None:
    problem = problem_with("no-such-host.invalid:8500")
    assert problem is not None and "no-such-host.invalid" in problem


def test_a_free_port_is_no_problem() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert problem_with(f"127.0.0.1:{port}") is None


@pytest.mark.parametrize("reuseport", [False, True], ids=["plain listener (TF Serving)", "SO_REUSEPORT listener (forkserve)"])
def test_a_port_another_listener_holds_is_refused(reuseport: bool) -> None:
    with _listener(reuseport) as held:
        port = held.getsockname()[1]
        problem = problem_with(f"127.0.0.1:{port}")
    assert problem is not None and f"gRPC port 127.0.0.1:{port} is taken" in problem and "\n" not in problem


def test_an_address_of_no_interface_here_is_refused() -> None:
    problem = problem_with("192.0.2.1:8500")  # TEST-NET-1: on no interface of this host
    assert problem is not None and "192.0.2.1:8500" in problem


def test_migrate_warning_only_when_the_kernel_resets_queued_connections(tmp_path: Path) -> None:
    sysctl = tmp_path / "tcp_migrate_req"
    sysctl.write_text("0\n")
    assert "tcp_migrate_req is 0" in migrate_warning(sysctl)
    sysctl.write_text("1\n")
    assert migrate_warning(sysctl) is None
    assert migrate_warning(tmp_path / "absent") is None  # a kernel before 5.14
