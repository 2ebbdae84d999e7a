"""The failure ledger: failed.json, the forkserve_version_failed gauges and the strikes (master rollout thread).

failed.json is read once, when the master starts (it outlives a master that was killed), and
from then on changed only through FailureLedger, which writes it whole and keeps in memory
exactly what it wrote: a write that fails (a full disk) changes nothing, on disk or here.
Workers read the file (server.models.registry) to answer END with the reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from server.config import ServerConfig
from server.master.rollout import policy
from server.master.rollout.record import record_metric
from server.master.strikes import Strikes, VersionKey
from server.repository import VersionSource, model_dir
from server.target import FailedVersion, config_key, read_failed, write_failed

log = logging.getLogger("forkserve.rollout")

Marks = dict[str, dict[int, FailedVersion]]


@dataclass(frozen=True)
class VersionsView:
    """What marks are judged against: the settled versions, their content digests and the accepted configuration."""

    sources: dict[VersionKey, VersionSource]
    config: ServerConfig
    digest: Callable[[Path], str]  # server.master.scanner content_digest: reads every byte, once per change


class FailureLedger:
    """Versions that must not be served, with why, and the deaths counted against versions being loaded."""

    def __init__(self, run_dir: Path, models_dir: Path | None, conf_name: str, attempts: int) -> None:
        self.run_dir = run_dir
        self.models_dir = models_dir
        self.conf_name = conf_name  # named in each reason: what to change to have the version tried again
        self.strikes = Strikes(attempts)
        self._marks: Marks = read_failed(run_dir)
        self._gauges_synced = False  # forkserve_version_failed set from the marks (once, at the first pass)

    def has_mark(self, key: VersionKey) -> bool:
        """Marked failed, whatever its files or settings are now."""
        return key[1] in self._marks.get(key[0], {})

    def reason(self, key: VersionKey) -> str:
        return self._marks[key[0]][key[1]].reason

    def is_failed(self, source: VersionSource, view: VersionsView) -> bool:
        """Marked failed with the content the directory still has and the settings the model still has."""
        entry = self._marks.get(source.model, {}).get(source.version)
        if entry is None or entry.config not in ("", config_key(view.config.for_model(source.model))):
            return False
        return entry.content in ("", view.digest(source.path))

    def drop_stale(self, view: VersionsView) -> None:
        """Forget marks whose version's files or settings changed since (tried again if the policy selects it).

        The gauge of every mark is set on the first call: failed.json outlives a master that was killed.
        """
        stale = [key for key, source in view.sources.items() if self.has_mark(key) and not self.is_failed(source, view)]
        if stale:
            self._write(self._without(stale))
        for model, version in stale:
            log.info("forkserve: model %s version %s, marked failed, changed (files or settings): it may be tried again",
                     model, version)
        gauges = {key: 0 for key in stale}
        if not self._gauges_synced:
            gauges.update({(model, version): 1 for model, versions in self._marks.items() for version in versions})
            self._gauges_synced = True
        for key, on in gauges.items():
            _set_failed_gauge(key, on)

    def count_deaths(self, exits: dict[int, policy.WorkerExit], served: set[VersionKey], view: VersionsView,
                     details: dict[int, str]) -> set[VersionKey]:
        """Count recorded deaths against the versions being loaded; mark those at the limit failed: the versions marked."""
        for key in served:
            self.strikes.clear(key)
        self._forget_recovered(served, view)
        blamed: dict[VersionKey, str] = {}
        for key, what in policy.deaths_to_count(exits, served, lambda key: self._marked_as_is(key, view), details):
            if self.strikes.add(key, what):
                blamed[key] = self.strikes.verdict(key)
        self.mark(blamed, view)
        return set(blamed)

    def mark(self, reasons: dict[VersionKey, str], view: VersionsView) -> None:
        """Remember versions that must not be served (with their content and settings now), and tell."""
        if not reasons:
            return
        marks, told = self._without([]), {}
        for (model, version), why in sorted(reasons.items()):
            source = view.sources.get((model, version))
            content = view.digest(source.path) if source is not None else ""
            told[(model, version)] = reason = (
                f"{why} (tried again when the files of {model}/{version} or the settings of model "
                f"{model} in {self.conf_name} change)")
            marks.setdefault(model, {})[version] = FailedVersion(reason, content, config_key(view.config.for_model(model)))
        self._write(marks)
        for key, reason in told.items():
            self.strikes.clear(key)
            log.error("forkserve: model %s version %s marked failed: %s", key[0], key[1], reason)
            record_metric(lambda m, k=(key[0], str(key[1])): m.ROLLOUT_FAILED_VERSIONS.labels(*k).inc())
            _set_failed_gauge(key, 1)

    def _forget_recovered(self, served: set[VersionKey], view: VersionsView) -> None:
        """Drop the marks of versions served now (tried again after a change) or removed from the repository."""
        recovered = [(m, v) for m, versions in self._marks.items() for v in versions if (m, v) in served]
        removed = [(m, v) for m, versions in self._marks.items() for v in versions
                   if not _version_exists(self.models_dir, view, m, v)]
        gone = sorted(set(recovered) | set(removed))
        if gone:
            self._write(self._without(gone))
        for model, version in recovered:
            log.info("forkserve: model %s version %s, once failed, is served now", model, version)
        for key in gone:
            _set_failed_gauge(key, 0)

    def _marked_as_is(self, key: VersionKey, view: VersionsView) -> bool:
        """Marked already, with these files (a worker still loading it when it was marked): its death is not counted."""
        source = view.sources.get(key)
        return self.has_mark(key) and (source is None or self.is_failed(source, view))

    def _without(self, keys: list[VersionKey]) -> Marks:
        """A copy of the marks without `keys`."""
        gone = set(keys)
        return {model: {v: f for v, f in versions.items() if (model, v) not in gone} for model, versions in self._marks.items()}

    def _write(self, marks: Marks) -> None:
        """Replace failed.json; memory follows only a write that succeeded."""
        write_failed(self.run_dir, marks)
        self._marks = {model: versions for model, versions in marks.items() if versions}


def _set_failed_gauge(key: VersionKey, on: int) -> None:
    record_metric(lambda m, k=(key[0], str(key[1])): m.VERSION_FAILED.labels(*k).set(on))


def _version_exists(root: Path | None, view: VersionsView, model: str, version: int) -> bool:
    """The version directory is there (in the repository, or under the model's base_path)."""
    directory = model_dir(root, view.config, model)
    return directory is not None and is_dir(directory / str(version))


def is_dir(path: Path) -> bool:
    """Path.is_dir, True for a directory we may not search (EACCES): it is there, not removed."""
    try:
        return path.is_dir()
    except OSError:
        return True
