"""TLS on both ports: the certificate, key and client-CA files read, checked and held (ssl only: no grpc, no TensorFlow).

The master reads FORKSERVE_TLS_CERT, FORKSERVE_TLS_KEY and FORKSERVE_TLS_CLIENT_CA at start (a bad
file stops the start in one line, server.master.hooks) and again when they change
(server.master.tls_watch), and keeps the last good set, `accepted()`. Workers never read the files:
they inherit the accepted set through fork. REST takes the SSLContext the master built from it
(gunicorn's `ssl_context` hook, `gunicorn_ssl_context`), gRPC the same bytes (server.rpc.tls). So a
worker serves exactly what the master checked, a new certificate reaches the workers that the next
rollout forks, and a file that goes bad costs no worker (the master reports it and keeps the last
good set), as a broken conf/models.toml does.
"""

from __future__ import annotations

import hashlib
import os
import re
import select
import socket
import ssl
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from server.settings import Settings

MAX_FILE_BYTES = 1024 * 1024  # a chain is a few KB, a CA bundle (Debian's ca-certificates.crt) ~220 KB
_CERTIFICATE = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n.+?-----END CERTIFICATE-----", re.S)
_PRIVATE_KEY = re.compile(rb"-----BEGIN ((?:RSA |EC |ENCRYPTED )?PRIVATE KEY)-----\r?\n.+?-----END \1-----", re.S)

# NOTE: the master builds contexts in its rollout thread while its main thread forks workers. OpenSSL
# takes global locks while it decodes PEM; a worker forked while one was held would inherit it
# locked and hang at its first handshake. Every build takes this lock, and so does every fork.
_building = threading.Lock()
os.register_at_fork(before=_building.acquire, after_in_parent=_building.release, after_in_child=_building.release)


class TlsError(ValueError):
    """A TLS file that cannot be used, in one line naming its variable and path."""


@dataclass(frozen=True, eq=False)
class Files:
    """What the three files held when read: the certificate chain, the private key, the client CAs (None: no mTLS)."""

    cert: bytes
    key: bytes
    client_ca: bytes | None

    def same(self, other: "Files | None") -> bool:
        return other is not None and (self.cert, self.key, self.client_ca) == (other.cert, other.key, other.client_ca)


@dataclass(frozen=True, eq=False)
class Material:
    """A checked set: the PEM blocks both transports serve, and REST's SSLContext built from them."""

    files: Files  # as read: what a later read is compared with
    chain: bytes  # the CERTIFICATE blocks of the certificate file, in order
    key: bytes  # its one private key block
    client_ca: bytes | None
    context: ssl.SSLContext

    @property
    def fingerprint(self) -> str:
        """The leaf certificate's SHA-256 fingerprint (`openssl x509 -noout -fingerprint -sha256`), its first 8 bytes."""
        leaf = _CERTIFICATE.search(self.chain)
        assert leaf is not None
        return hashlib.sha256(ssl.PEM_cert_to_DER_cert(leaf.group(0).decode("ascii"))).hexdigest()[:16]

    def describe(self, settings: Settings) -> str:
        """The files in one phrase, for the log."""
        ca = f", client certificates required (CAs: {settings.tls_client_ca})" if self.client_ca is not None else ""
        return f"certificate {settings.tls_cert} (sha256 {self.fingerprint}), key {settings.tls_key}{ca}"


_accepted: Material | None = None


def accepted() -> Material | None:
    """The set this process serves (a worker's: the master's when it forked); None before any was accepted."""
    return _accepted


def accept(material: Material) -> None:
    """Master: serve `material` in the workers forked from now on."""
    global _accepted
    _accepted = material


def current(settings: Settings) -> Material | None:
    """The accepted set; in a process that has none yet (not forked from a master that read them), read and check the files now."""
    if not settings.tls:
        return None
    if _accepted is None:
        accept(check(read(settings), settings))
    return _accepted


def read(settings: Settings) -> Files:
    """The three files' bytes; TlsError when one cannot be read (missing, unreadable, not a regular file, too large)."""
    assert settings.tls_cert is not None and settings.tls_key is not None
    ca = settings.tls_client_ca
    return Files(_read_file("FORKSERVE_TLS_CERT", settings.tls_cert), _read_file("FORKSERVE_TLS_KEY", settings.tls_key),
                 _read_file("FORKSERVE_TLS_CLIENT_CA", ca) if ca is not None else None)


def _read_file(variable: str, path: Path) -> bytes:
    """One file, at most MAX_FILE_BYTES, never blocking on a FIFO or a device."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise TlsError(f"{variable} {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TlsError(f"{variable} {path}: not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise TlsError(f"{variable} {path}: {info.st_size} bytes, more than a PEM file holds (limit {MAX_FILE_BYTES})")
        with os.fdopen(os.dup(fd), "rb") as handle:
            return handle.read(MAX_FILE_BYTES + 1)[:MAX_FILE_BYTES]
    except OSError as exc:
        raise TlsError(f"{variable} {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def check(files: Files, settings: Settings) -> Material:
    """The set checked with the ssl module as both transports will use it; TlsError (one line) when it cannot serve."""
    cert_path, key_path, ca_path = settings.tls_cert, settings.tls_key, settings.tls_client_ca
    chain = b"\n".join(_CERTIFICATE.findall(files.cert))
    if not chain:
        raise TlsError(f"FORKSERVE_TLS_CERT {cert_path}: no PEM certificate in it (-----BEGIN CERTIFICATE-----)")
    keys = [match.group(0) for match in _PRIVATE_KEY.finditer(files.key)]
    if len(keys) != 1:
        raise TlsError(f"FORKSERVE_TLS_KEY {key_path}: {'no' if not keys else len(keys)} PEM private keys in it, "
                       f"one wanted (-----BEGIN PRIVATE KEY-----)")
    key = keys[0]
    client_ca = b"\n".join(_CERTIFICATE.findall(files.client_ca)) if files.client_ca is not None else None
    if client_ca == b"":
        raise TlsError(f"FORKSERVE_TLS_CLIENT_CA {ca_path}: no PEM certificate in it (-----BEGIN CERTIFICATE-----)")
    with _building:
        context = _server_context(chain, key, client_ca, cert_path, key_path, ca_path)
    context.sslsocket_class = type("BoundedHandshakeSocket", (BoundedHandshakeSocket,),
                                   {"handshake_timeout": settings.client_timeout})
    return Material(files, chain, key, client_ca, context)


class BoundedHandshakeSocket(ssl.SSLSocket):
    """REST's TLS connections: a handshake not completed within `handshake_timeout` seconds ends the connection.

    NOTE: gthread runs the handshake on a request thread, blocking, without a timeout, once the first
    byte arrived: 40 clients that sent 5 bytes of a ClientHello and stopped held all 32 threads of a
    worker, which answered nobody until they left. The deadline is for the whole handshake, so a
    client trickling a byte at a time gains nothing.
    """

    handshake_timeout = 15.0  # FORKSERVE_CLIENT_TIMEOUT (check() sets it)

    def do_handshake(self, block: bool = False) -> None:
        """The handshake, non-blocking under a deadline; the socket's timeout as it was afterwards."""
        timeout = self.gettimeout()
        deadline = time.monotonic() + self.handshake_timeout
        self.settimeout(0.0)
        try:
            while True:
                try:
                    super().do_handshake()
                    return
                except ssl.SSLWantReadError:
                    wanted = select.POLLIN
                except ssl.SSLWantWriteError:
                    wanted = select.POLLOUT
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._ready(wanted, remaining):
                    self._abandon()
                    # NOTE: an SSLError other than SSL_ERROR_EOF: gthread logs one line, as for any invalid request
                    raise ssl.SSLError(ssl.SSL_ERROR_WANT_READ, f"no TLS handshake within {self.handshake_timeout:g}s")
        finally:
            self.settimeout(timeout)

    def _ready(self, wanted: int, seconds: float) -> bool:
        poller = select.poll()
        poller.register(self.fileno(), wanted)
        return bool(poller.poll(seconds * 1000))

    def _abandon(self) -> None:
        """Shut the connection down, so that gunicorn's error answer fails at once instead of resuming the handshake."""
        try:
            self.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Encrypted(Exception):
    """The key asked for a passphrase."""


def _no_passphrase() -> bytes:
    # NOTE: without a callback OpenSSL prompts on the terminal for an encrypted key's passphrase: a hang.
    raise _Encrypted()


def _server_context(chain: bytes, key: bytes, client_ca: bytes | None, cert_path: Any, key_path: Any, ca_path: Any) -> ssl.SSLContext:
    """gunicorn's default context (ssl.create_default_context for client authentication, the chain, verify_mode) from bytes."""
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_verify_locations(cadata=chain.decode("latin-1"))
    except ssl.SSLError as exc:
        raise TlsError(f"FORKSERVE_TLS_CERT {cert_path}: not a valid PEM certificate ({_reason(exc)})") from None
    try:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH,
                                             cadata=client_ca.decode("latin-1") if client_ca is not None else None)
    except ssl.SSLError as exc:
        raise TlsError(f"FORKSERVE_TLS_CLIENT_CA {ca_path}: not a valid PEM certificate ({_reason(exc)})") from None
    try:
        _load_chain(context, chain, key)
    except _Encrypted:
        raise TlsError(f"FORKSERVE_TLS_KEY {key_path}: the key is encrypted; give it unencrypted "
                       f"(`openssl pkey -in KEY -out PLAIN`): nobody is there to type its passphrase") from None
    except ssl.SSLError as exc:
        if exc.reason in ("KEY_VALUES_MISMATCH", "NO_CERTIFICATE_ASSIGNED"):
            raise TlsError(f"FORKSERVE_TLS_KEY {key_path} is not the key of the certificate in FORKSERVE_TLS_CERT {cert_path}") from None
        if exc.reason == "EE_KEY_TOO_SMALL":  # OpenSSL's default security level
            raise TlsError(f"FORKSERVE_TLS_CERT {cert_path}: its key is too small to serve TLS (RSA needs 2048 bits or more)") from None
        raise TlsError(f"FORKSERVE_TLS_KEY {key_path}: not a valid PEM private key ({_reason(exc)})") from None
    except OSError as exc:  # memfd_create or /proc/self/fd refused (too many open files)
        raise TlsError(f"TLS files could not be loaded: {exc}") from None
    context.verify_mode = ssl.CERT_REQUIRED if client_ca is not None else ssl.CERT_NONE
    return context


def _load_chain(context: ssl.SSLContext, chain: bytes, key: bytes) -> None:
    """load_cert_chain from bytes: through anonymous in-memory files (memfd), so no copy of the key touches a disk."""
    fds = [os.memfd_create("forkserve-tls-cert", os.MFD_CLOEXEC), os.memfd_create("forkserve-tls-key", os.MFD_CLOEXEC)]
    try:
        for fd, data in zip(fds, (chain, key)):
            while data:
                data = data[os.write(fd, data):]
        context.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}", password=_no_passphrase)
    finally:
        for fd in fds:
            os.close(fd)


def _reason(exc: ssl.SSLError) -> str:
    """OpenSSL's reason without the source location."""
    if exc.reason:
        return exc.reason.replace("_", " ").lower()
    return re.sub(r"^\[\w+\]\s*|\s*\(_ssl\.c:\d+\)", "", str(exc.args[-1]))


def gunicorn_ssl_context(conf: Any, default_ssl_context_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """gunicorn's `ssl_context` hook (a worker, for every connection): the context of the accepted set.

    NOTE: gunicorn 27's default builds a new context from the files for every connection
    (gunicorn.sock.ssl_wrap_socket): milliseconds of CPU each (bench/results/code-notes.md#tls-context), a changed file served at once by REST but not
    by gRPC, a half-replaced pair failing every handshake, an encrypted key prompting on a terminal.
    Without an accepted set (certfile given to gunicorn directly), gunicorn's own factory.
    """
    material = _accepted
    return material.context if material is not None else default_ssl_context_factory()
