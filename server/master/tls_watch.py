"""The TLS files as the master follows them: the set the workers are given, and what is wrong with the files now.

Runs in the master's rollout thread, which reads FORKSERVE_TLS_CERT, FORKSERVE_TLS_KEY and
FORKSERVE_TLS_CLIENT_CA every poll (server.master.rollout). New content counts once two polls read
the same bytes, as conf/models.toml's does (server.master.config_watch): a certificate and its key
written one after the other are never taken half-way. A set that checks out is accepted
(server.tls) and the controller replaces every worker, one at a time, so each serves it: this is
how a certificate renewed in place (cert-manager, a Kubernetes secret volume, certbot) is served
without a restart. A set that does not check out is reported once (log,
forkserve_tls_last_reload_successful 0) and never reaches a worker: workers forked meanwhile serve
the last good set. A reload (`python -m server reload`, SIGHUP) takes the files as they are at once.
"""

from __future__ import annotations

import logging
from typing import Callable

from server import tls
from server.settings import Settings

log = logging.getLogger("forkserve.tls")


class TlsWatch:
    """The accepted TLS set (server.tls.accepted) kept up to date with the files, and the current problem, if any."""

    def __init__(self, settings: Settings, report: Callable[[bool], None] | None = None) -> None:
        material = tls.accepted()
        assert material is not None, "on_starting accepts the TLS files before the controller starts"
        self.settings = settings
        self.problem = ""
        self._report = report or (lambda ok: None)
        self._seen: tls.Files | str = material.files  # the last read: the files, or why they could not be read
        self._refused: tls.Files | None = None  # a set whose check failed: not checked again until it changes
        self._report(True)

    def refresh(self, at_once: bool = False) -> tls.Material | None:
        """Read the files again: the newly accepted set when they changed, settled (or `at_once`) and check out, else None."""
        try:
            read: tls.Files | str = tls.read(self.settings)
        except tls.TlsError as exc:
            read = str(exc)
        settled = at_once or _same(read, self._seen)
        self._seen = read
        if not settled:
            return None
        if isinstance(read, str):
            self._refuse(read)
            return None
        current = tls.accepted()
        assert current is not None
        if read.same(current.files):
            self._clear()
            return None
        if read.same(self._refused):
            return None
        try:
            material = tls.check(read, self.settings)
        except tls.TlsError as exc:
            self._refused = read
            self._refuse(str(exc))
            return None
        tls.accept(material)
        self._refused = None
        self._clear()
        log.info("forkserve: TLS files changed: workers forked from now on serve %s (was sha256 %s)",
                 material.describe(self.settings), current.fingerprint)
        return material

    def _refuse(self, why: str) -> None:
        """Keep the accepted set; log and report a new problem once."""
        if why != self.problem:
            accepted = tls.accepted()
            log.error("forkserve: %s; the workers keep serving the last good certificate (sha256 %s)",
                      why, accepted.fingerprint if accepted else "?")
            self._report(False)
        self.problem = why

    def _clear(self) -> None:
        if self.problem:
            log.info("forkserve: the TLS files are valid again")
            self._report(True)
        self.problem = ""


def _same(read: tls.Files | str, seen: tls.Files | str) -> bool:
    """Two reads of the files found the same thing (the same bytes, or the same error)."""
    if isinstance(read, str) or isinstance(seen, str):
        return read == seen
    return read.same(seen)
