"""The master's gRPC port claim and check: the lock, malformed binds, a port another listener holds, tcp_migrate_req."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from server.master.grpc_port import PortTaken, claim, migrate_warning, problem_with
from tests.support.harness import pid_alive, wait_until


def _listener(reuseport: bool = False) -> socket.socket:
    sock = socket.socket()
    if reuseport:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_claimed_port_is_refused_to_a_second_claim_whichever_address_until_released() -> None:
    """Keyed by the port alone: 0.0.0.0:P and 127.0.0.1:P are one TCP port too; a release frees it at once."""
    port = _free_port()
    lock = claim(f"127.0.0.1:{port}")
    try:
        assert problem_with(f"127.0.0.1:{port}") is None  # nothing listens: the lock alone refuses
        for bind in (f"127.0.0.1:{port}", f":{port}", f"0.0.0.0:{port}"):
            with pytest.raises(PortTaken) as refused:
                claim(bind)
            message = str(refused.value)
            assert message.startswith(f"gRPC port {bind} is taken (Address already in use): another forkserve holds port {port}")
            assert f"@forkserve-grpc-port-{port}" in message and "\n" not in message
        claim(f"127.0.0.1:{_free_port()}").close()  # another port is another lock
    finally:
        lock.close()
    claim(f"0.0.0.0:{port}").close()


def test_a_claim_on_a_port_another_process_listens_on_is_refused_and_leaves_no_lock() -> None:
    with _listener(reuseport=True) as held:
        port = held.getsockname()[1]
        with pytest.raises(PortTaken, match=f"gRPC port 127.0.0.1:{port} is taken .*another server listens on it"):
            claim(f"127.0.0.1:{port}")
    claim(f"127.0.0.1:{port}").close()  # the failed claim did not keep the lock


def test_a_malformed_bind_is_refused_by_the_claim_naming_it() -> None:
    with pytest.raises(PortTaken, match="gRPC address '127.0.0.1:0'.*HOST:PORT"):
        claim("127.0.0.1:0")


HOLDER = textwrap.dedent("""
    import os, sys, time
    from server.master.grpc_port import claim
    lock = claim(sys.argv[1])
    child = os.fork()
    if child == 0:  # a worker: inherits the lock, outlives the master for a while
        sys.stdin.read()
        os._exit(0)
    print(child, flush=True)
    time.sleep(600)
""")


def test_the_lock_outlives_a_sigkilled_master_while_a_child_lives_and_is_freed_with_the_last() -> None:
    """The kernel releases it, no file to clean: SIGKILL of the holder, then exit of the worker it forked."""
    port = _free_port()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, f"127.0.0.1:{port}"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdin is not None
    child = int(holder.stdout.readline())
    try:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        with pytest.raises(PortTaken, match="another forkserve holds"):
            claim(f"127.0.0.1:{port}")
    finally:
        holder.stdin.close()  # the child reads EOF and exits
    wait_until(lambda: not pid_alive(child), 10, "the child to exit")
    claim(f"127.0.0.1:{port}").close()


READS_SETTINGS = textwrap.dedent("""
    import runpy, sys
    from server.cli.main import main
    from server.master.grpc_port import claim
    runpy.run_path("gunicorn.conf.py")  # what every start and `gunicorn --check-config` evaluate
    main(["validate", "mlp", sys.argv[2], "--models", sys.argv[3]])  # refused (no such source), after reading settings
    claim(sys.argv[1]).close()  # raises if anything above had claimed the port
    print("claimed")
""")


def test_only_the_masters_start_claims_the_port_not_the_config_or_the_cli(tmp_path: Path) -> None:
    port = _free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FORKSERVE_") and k != "PROMETHEUS_MULTIPROC_DIR"}
    env = {**clean, "FORKSERVE_RUN_DIR": str(tmp_path / "run"), "FORKSERVE_GRPC_BIND": f"127.0.0.1:{port}"}
    done = subprocess.run([sys.executable, "-c", READS_SETTINGS, f"127.0.0.1:{port}", str(tmp_path / "absent"), str(tmp_path)],
                          cwd=Path(__file__).resolve().parents[3], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines()[-1:] == ["claimed"], done.stderr
