"""The master's view of the TLS files: a renewed set settles, checks out and is accepted; a bad one keeps the last good set."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from server import tls
from server.master.tls_watch import TlsWatch
from server.settings import Settings
from tests.certificates import Pair, make_ca, make_cert


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Pair]:
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory, "ca")
    return {"first": make_cert(directory, ca, "first", "localhost", 1),
            "renewed": make_cert(directory, ca, "renewed", "localhost renewed", 2)}


@pytest.fixture
def live(pki: dict[str, Pair], tmp_path: Path) -> Iterator[Settings]:
    """tls.crt and tls.key holding the first certificate, accepted as on_starting does; the accepted set restored after."""
    shutil.copy(pki["first"].cert, tmp_path / "tls.crt")
    shutil.copy(pki["first"].key, tmp_path / "tls.key")
    settings = dataclasses.replace(Settings.from_env(), tls_cert=tmp_path / "tls.crt", tls_key=tmp_path / "tls.key")
    before = tls.accepted()
    tls.accept(tls.check(tls.read(settings), settings))
    yield settings
    tls._accepted = before


def replace(pair: Pair, settings: Settings) -> None:
    """Both files replaced by rename, as a Kubernetes secret volume or cert-manager does."""
    assert settings.tls_cert is not None and settings.tls_key is not None
    for source, target in ((pair.cert, settings.tls_cert), (pair.key, settings.tls_key)):
        shutil.copy(source, target.with_name(".new"))
        os.replace(target.with_name(".new"), target)


def test_a_renewed_certificate_is_accepted_once_it_settled(live: Settings, pki: dict[str, Pair]) -> None:
    reports: list[bool] = []
    watch = TlsWatch(live, reports.append)
    first = tls.accepted()
    assert watch.refresh() is None  # unchanged
    replace(pki["renewed"], live)
    assert watch.refresh() is None and tls.accepted() is first  # seen once: may still be changing
    accepted = watch.refresh()
    assert accepted is not None and tls.accepted() is accepted and accepted.fingerprint != first.fingerprint
    assert accepted.chain.strip() == pki["renewed"].cert.read_bytes().strip()
    assert watch.refresh() is None and reports == [True]


def test_a_certificate_written_before_its_key_is_never_taken_half_way(live: Settings, pki: dict[str, Pair],
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    watch = TlsWatch(live)
    first = tls.accepted()
    assert live.tls_cert is not None and live.tls_key is not None
    live.tls_cert.write_bytes(pki["renewed"].cert.read_bytes())  # the key follows a poll later
    assert watch.refresh() is None
    live.tls_key.write_bytes(pki["renewed"].key.read_bytes())
    assert watch.refresh() is None and tls.accepted() is first and not watch.problem
    assert watch.refresh() is not None and not [r for r in caplog.records if r.levelname == "ERROR"]


def test_a_bad_set_is_reported_once_and_never_accepted(live: Settings, pki: dict[str, Pair],
                                                       caplog: pytest.LogCaptureFixture) -> None:
    reports: list[bool] = []
    watch = TlsWatch(live, reports.append)
    first = tls.accepted()
    assert live.tls_key is not None
    live.tls_key.write_bytes(pki["renewed"].key.read_bytes())  # not the key of the certificate in tls.crt
    for _ in range(4):
        assert watch.refresh() is None and tls.accepted() is first
    assert "is not the key of the certificate" in watch.problem
    errors = [r.message for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and f"keep serving the last good certificate (sha256 {first.fingerprint})" in errors[0]
    live.tls_key.unlink()
    watch.refresh(), watch.refresh()
    assert "No such file or directory" in watch.problem and tls.accepted() is first
    live.tls_key.write_bytes(pki["first"].key.read_bytes())  # back to the accepted files
    watch.refresh(), watch.refresh()
    assert not watch.problem and tls.accepted() is first and reports == [True, False, False, True]


def test_a_reload_takes_the_files_at_once(live: Settings, pki: dict[str, Pair]) -> None:
    watch = TlsWatch(live)
    replace(pki["renewed"], live)
    accepted = watch.refresh(at_once=True)
    assert accepted is not None and tls.accepted() is accepted
