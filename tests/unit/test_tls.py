"""server.tls: the TLS files read and checked with the ssl module, the context REST serves, the bounded handshake."""

from __future__ import annotations

import dataclasses
import os
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import pytest

from server import tls
from server.settings import Settings
from tests.certificates import OPENSSL, Pair, make_ca, make_cert


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Pair]:
    """A CA, a server and a client certificate it signed, and a second server certificate from another CA."""
    directory = tmp_path_factory.mktemp("pki")
    ca, other_ca = make_ca(directory, "ca"), make_ca(directory, "other-ca")
    return {"ca": ca, "server": make_cert(directory, ca, "server", "localhost", 1),
            "client": make_cert(directory, ca, "client", "client", 2, client=True),
            "other": make_cert(directory, other_ca, "other", "localhost", 3)}


def settings_for(cert: Path, key: Path, client_ca: Path | None = None, client_timeout: float = 15.0) -> Settings:
    return dataclasses.replace(Settings.from_env(), tls_cert=cert, tls_key=key, tls_client_ca=client_ca,
                               client_timeout=client_timeout)


def load(settings: Settings) -> tls.Material:
    return tls.check(tls.read(settings), settings)


def refused(settings: Settings) -> str:
    with pytest.raises(tls.TlsError) as caught:
        load(settings)
    message = str(caught.value)
    assert "\n" not in message and "_ssl.c" not in message
    return message


def handshake(context: ssl.SSLContext, client: ssl.SSLContext) -> dict:
    """One TLS handshake over a socket pair; the certificate the server presented, as the client decoded it."""
    server_end, client_end = socket.socketpair()
    with server_end, client_end:
        errors: list[BaseException] = []

        def serve() -> None:
            try:
                with context.wrap_socket(server_end, server_side=True) as wrapped:
                    wrapped.recv(1)
            except (OSError, ssl.SSLError) as exc:
                errors.append(exc)

        thread = threading.Thread(target=serve)
        thread.start()
        try:
            with client.wrap_socket(client_end, server_hostname="localhost") as wrapped:
                wrapped.sendall(b"x")
                presented = wrapped.getpeercert()
        finally:
            thread.join(10)
        if errors:
            raise errors[0]
        return presented


def client_context(pki: dict[str, Pair], certificate: Pair | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki["ca"].cert)
    if certificate is not None:
        context.load_cert_chain(certificate.cert, certificate.key)
    return context


def test_a_good_set_serves_its_certificate_and_requires_nothing_of_clients(pki: dict[str, Pair]) -> None:
    material = load(settings_for(pki["server"].cert, pki["server"].key))
    assert material.context.verify_mode == ssl.CERT_NONE and material.client_ca is None
    assert material.context.minimum_version >= ssl.TLSVersion.TLSv1_2
    presented = handshake(material.context, client_context(pki))
    assert presented["serialNumber"] == "01" and presented["subject"] == ((("commonName", "localhost"),),)


def test_with_a_client_ca_a_certificate_it_signed_is_required(pki: dict[str, Pair]) -> None:
    material = load(settings_for(pki["server"].cert, pki["server"].key, pki["ca"].cert))
    assert material.context.verify_mode == ssl.CERT_REQUIRED
    assert handshake(material.context, client_context(pki, pki["client"]))["serialNumber"] == "01"
    with pytest.raises((ssl.SSLError, OSError)):
        handshake(material.context, client_context(pki))  # no client certificate
    with pytest.raises((ssl.SSLError, OSError)):
        handshake(material.context, client_context(pki, pki["other"]))  # signed by another CA


def test_what_both_transports_get_is_the_certificate_blocks_and_the_one_key(pki: dict[str, Pair], tmp_path: Path) -> None:
    """A certificate file with its key appended (as some tools write them): gRPC gets the chain only."""
    combined = tmp_path / "combined.pem"
    combined.write_bytes(pki["server"].cert.read_bytes() + pki["server"].key.read_bytes())
    material = load(settings_for(combined, pki["server"].key))
    assert material.chain.strip() == pki["server"].cert.read_bytes().strip()
    assert b"PRIVATE KEY" not in material.chain and material.key.strip() == pki["server"].key.read_bytes().strip()
    assert material.files.cert == combined.read_bytes()  # what a later read is compared with
    assert len(material.fingerprint) == 16


def test_a_missing_file_is_named_with_its_variable(pki: dict[str, Pair], tmp_path: Path) -> None:
    assert refused(settings_for(tmp_path / "nope.pem", pki["server"].key)) == \
        f"FORKSERVE_TLS_CERT {tmp_path / 'nope.pem'}: No such file or directory"
    assert refused(settings_for(pki["server"].cert, pki["server"].key, tmp_path / "ca.pem")).startswith(
        f"FORKSERVE_TLS_CLIENT_CA {tmp_path / 'ca.pem'}: No such file")


def test_files_that_are_not_pem_are_refused(pki: dict[str, Pair], tmp_path: Path) -> None:
    der = tmp_path / "server.der"
    subprocess.run([OPENSSL, "x509", "-in", str(pki["server"].cert), "-outform", "DER", "-out", str(der)], check=True)
    assert "FORKSERVE_TLS_CERT" in refused(settings_for(der, pki["server"].key))
    assert "no PEM certificate" in refused(settings_for(pki["server"].key, pki["server"].key))
    assert "FORKSERVE_TLS_KEY" in refused(settings_for(pki["server"].cert, pki["server"].cert))
    assert "FORKSERVE_TLS_CLIENT_CA" in refused(settings_for(pki["server"].cert, pki["server"].key, pki["ca"].key))
    damaged = tmp_path / "damaged.pem"
    text = pki["server"].cert.read_text()
    damaged.write_text(text[:80] + "!!!!" + text[84:])
    assert refused(settings_for(damaged, pki["server"].key)).startswith(f"FORKSERVE_TLS_CERT {damaged}: not a valid PEM certificate")


def test_a_key_that_is_not_the_certificate_s_is_refused(pki: dict[str, Pair]) -> None:
    assert refused(settings_for(pki["server"].cert, pki["other"].key)) == (
        f"FORKSERVE_TLS_KEY {pki['other'].key} is not the key of the certificate in FORKSERVE_TLS_CERT {pki['server'].cert}")


def test_a_key_too_small_for_openssl_s_security_level_is_named(tmp_path: Path) -> None:
    subprocess.run([OPENSSL, "req", "-x509", "-newkey", "rsa:1024", "-nodes", "-keyout", str(tmp_path / "small.key"),
                    "-out", str(tmp_path / "small.pem"), "-days", "1", "-subj", "/CN=localhost"], check=True, capture_output=True)
    assert refused(settings_for(tmp_path / "small.pem", tmp_path / "small.key")) == (
        f"FORKSERVE_TLS_CERT {tmp_path / 'small.pem'}: its key is too small to serve TLS (RSA needs 2048 bits or more)")


def test_an_encrypted_key_is_refused_without_prompting(pki: dict[str, Pair], tmp_path: Path) -> None:
    """NOTE: OpenSSL's default is to ask for the passphrase on the terminal: a start that hangs."""
    encrypted = tmp_path / "encrypted.key"
    subprocess.run([OPENSSL, "pkey", "-in", str(pki["server"].key), "-aes256", "-passout", "pass:secret",
                    "-out", str(encrypted)], check=True)
    started = time.monotonic()
    assert "is encrypted" in refused(settings_for(pki["server"].cert, encrypted))
    assert time.monotonic() - started < 5


def test_fifos_devices_and_huge_files_are_not_read(pki: dict[str, Pair], tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert refused(settings_for(fifo, pki["server"].key)) == f"FORKSERVE_TLS_CERT {fifo}: not a regular file"
    assert refused(settings_for(Path("/dev/zero"), pki["server"].key)).endswith("not a regular file")
    huge = tmp_path / "huge.pem"
    with open(huge, "wb") as handle:
        handle.truncate(tls.MAX_FILE_BYTES + 1)
    assert "more than a PEM file holds" in refused(settings_for(huge, pki["server"].key))


def test_gunicorns_hook_serves_the_accepted_context_and_gunicorns_own_without_one(pki: dict[str, Pair]) -> None:
    material = load(settings_for(pki["server"].cert, pki["server"].key))
    fallback = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    before = tls.accepted()
    try:
        tls._accepted = None
        assert tls.gunicorn_ssl_context(None, lambda: fallback) is fallback
        tls.accept(material)
        assert tls.gunicorn_ssl_context(None, lambda: fallback) is material.context
    finally:
        tls._accepted = before


def test_a_stalled_handshake_ends_at_the_deadline(pki: dict[str, Pair]) -> None:
    """5 bytes of a ClientHello, then a byte every 0.2 s: the handshake gives up after client_timeout, whole, not per read."""
    material = load(settings_for(pki["server"].cert, pki["server"].key, client_timeout=0.5))
    server_end, client_end = socket.socketpair()
    with server_end, client_end:
        wrapped = material.context.wrap_socket(server_end, server_side=True, do_handshake_on_connect=False)
        stop = threading.Event()
        ended: list[BaseException | None] = []

        def trickle() -> None:
            client_end.sendall(b"\x16\x03\x01\x02\x00")
            while not stop.wait(0.2):
                try:
                    client_end.sendall(b"\x01")
                except OSError:
                    return

        def handshake() -> None:
            try:
                wrapped.do_handshake()
                ended.append(None)
            except (ssl.SSLError, OSError) as exc:
                ended.append(exc)

        threads = [threading.Thread(target=trickle), threading.Thread(target=handshake, daemon=True)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        threads[1].join(5)
        stop.set()
        threads[0].join(5)
        assert ended, "the handshake still waits for the client after 5 s"
        assert isinstance(ended[0], ssl.SSLError) and str(ended[0]) == "no TLS handshake within 0.5s"
        assert 0.4 < time.monotonic() - started < 3
        assert wrapped.gettimeout() is None  # blocking again, as gunicorn set it
