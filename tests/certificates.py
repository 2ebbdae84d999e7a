"""Test certificates made with the `openssl` command line at test time: a CA, server and client certificates signed by it."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

OPENSSL = "/usr/bin/openssl"
EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]  # P-256: made in milliseconds


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@dataclass(frozen=True)
class Pair:
    """A certificate file and its key file."""

    cert: Path
    key: Path


def make_ca(directory: Path, name: str) -> Pair:
    """A self-signed CA: NAME.pem, NAME.key."""
    directory.mkdir(parents=True, exist_ok=True)
    openssl("req", "-x509", *EC_KEY, "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
            "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)
    return Pair(directory / f"{name}.pem", directory / f"{name}.key")


def make_cert(directory: Path, ca: Pair, name: str, common_name: str, serial: int, client: bool = False) -> Pair:
    """A certificate signed by `ca` for localhost and 127.0.0.1 (server), or for a client: NAME.pem, NAME.key."""
    directory.mkdir(parents=True, exist_ok=True)
    usage = "clientAuth" if client else "serverAuth"
    (directory / f"{name}.ext").write_text(
        f"basicConstraints=critical,CA:FALSE\nextendedKeyUsage={usage}\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("req", "-new", *EC_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={common_name}",
            cwd=directory)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", str(ca.cert), "-CAkey", str(ca.key), "-set_serial", str(serial),
            "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=directory)
    return Pair(directory / f"{name}.pem", directory / f"{name}.key")
