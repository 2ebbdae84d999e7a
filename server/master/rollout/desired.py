"""The target the master wants the workers to run, and its publication (master rollout thread, no TensorFlow).

Each pass re-reads conf/models.toml (keeping the last good configuration when the file is
broken), scans the repository for settled versions (server.master.scanner), marks failed at
once the versions no worker could load, leaves out the versions marked failed (.ledger) and
applies the version policies (server.target). A model with nothing usable is left out of the
target and reported with why. What in the repository or the configuration applies to nothing is
logged once each.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from server.config import ConfigError, ServerConfig, with_overrides
from server.master.config_watch import ConfigWatch
from server.master.rollout import policy
from server.master.rollout.ledger import FailureLedger, VersionsView, is_dir
from server.master.rollout.record import record_metric
from server.master.scanner import SettledScanner
from server.master.strikes import VersionKey
from server.repository import VersionSource, model_dir, stray_entries
from server.target import Target, compute_target, write_target

if TYPE_CHECKING:  # NOTE: imported only with TF Serving's configuration: protobuf stays out of the master otherwise
    from server.master.model_server_config import ModelServerConfigSource

log = logging.getLogger("forkserve.rollout")


class DesiredState:
    """Configuration + settled repository - failed versions -> the target; written to target.json on demand."""

    def __init__(self, models_dir: Path | None, conf_path: Path, config: ServerConfig, run_dir: Path,
                 ledger: FailureLedger, poll_interval: float, model_server: ModelServerConfigSource | None = None,
                 new_versions: bool = True) -> None:
        self.run_dir = run_dir
        self.ledger = ledger
        self.poll_interval = poll_interval
        self.config = ConfigWatch(conf_path, config, lambda ok: record_metric(
            lambda m: m.CONFIG_LAST_RELOAD_SUCCESSFUL.set(1 if ok else 0)), model_server)
        self.scanner = SettledScanner(models_dir, self._settled_version_changed, new_versions)
        self.settled: dict[str, list[VersionSource]] = {}
        self.unservable: dict[str, str] = {}  # models left out of the target, with why (the last compute)
        self._told: set[tuple[str, ...]] = set()  # repository and settings problems logged once each
        self._waiting_for = ""  # the generation a rollout waits to fold with directories still settling
        self._published_reports: tuple[object, dict[str, str]] = (self.config.problem, {})
        self._unpublished = False  # the last target write failed (a full run directory): write it again

    def view(self) -> VersionsView:
        """The settled versions of the last scan and the accepted configuration, as the ledger judges marks."""
        sources = {(s.model, s.version): s for versions in self.settled.values() for s in versions}
        return VersionsView(sources, self.config.accepted, self.scanner.content_digest)

    def compute(self, reason: str, serving: set[VersionKey], trust_all: bool = False,
                loaded: dict[str, dict[str, Any]] | None = None) -> Target:
        """What the policies select now from settled, not failed versions; `serving`: versions workers run or should run.

        `loaded`: explicit model control's loaded models, each with its load's override (None: every model).
        """
        config = self.config.refresh(serving)
        self.settled = self.scanner.scan(trust_all, config)
        self._tell_about_the_repository(config)
        view = self.view()
        self._fail_unloadable(view, serving)
        self.ledger.drop_stale(view)
        usable, why_empty = {}, {}
        selected = self.settled if loaded is None else {n: s for n, s in self.settled.items() if n in loaded}
        if loaded is not None:
            config = self._with_overrides(config, loaded)
            for name in set(loaded) - set(self.settled):
                usable[name], why_empty[name] = [], "the repository has no such model"
        for name, sources in selected.items():
            usable[name] = [s for s in sources if not self.ledger.is_failed(s, view)]
            if not sources:
                stray = self._stray(config, name)
                why_empty[name] = "no version directory" + (
                    f" ({'; '.join(f'{entry}: {why}' for entry, why in stray.items())})" if stray else "")
            elif not usable[name]:
                why_empty[name] = "every version failed: " + "; ".join(
                    f"version {s.version}: {self.ledger.reason((name, s.version))}" for s in sources)
        target = compute_target(usable, config, reason, why_empty=why_empty)
        self.unservable = target.unservable
        return target

    def _with_overrides(self, config: ServerConfig, loaded: dict[str, dict[str, Any]]) -> ServerConfig:
        """The configuration with the loads' overrides; one that no longer applies (models.toml changed) is left out."""
        try:
            return with_overrides(config, loaded)
        except ConfigError as exc:
            self._tell_once(("override", str(exc)), "forkserve: a load's config no longer applies over %s, "
                            "left out: %s", self.config.path.name, exc)
            good = {}
            for name, table in loaded.items():
                try:
                    with_overrides(config, {**good, name: table})
                except ConfigError:
                    continue
                good[name] = table
            return with_overrides(config, good)

    def settling(self, target: Target) -> bool:
        """Hold a rollout while a version directory is still being copied, so both go out in one rollout."""
        if not policy.waits_for_copy(self.scanner.unsettled_for(), self.poll_interval):
            self._waiting_for = ""
            return False
        if self._waiting_for != target.generation:
            self._waiting_for = target.generation
            log.info("forkserve: rollout to %s waits for version directories still being copied (up to %.0fs)",
                     target.generation, policy.SETTLE_WAIT_POLLS * self.poll_interval)
        return True

    def reports_changed(self) -> bool:
        """The configuration problem or the unservable models differ from target.json's (or its last write failed)."""
        return self._unpublished or (self.config.problem, self.unservable) != self._published_reports

    def publish(self, target: Target) -> None:
        """Write the target with the configuration problem and the unservable models of the moment."""
        for name in set(self._published_reports[1]) | set(self.unservable):
            record_metric(lambda m, name=name: m.MODEL_UNSERVABLE.labels(name).set(1 if name in self.unservable else 0))
        self._published_reports = (self.config.problem, self.unservable)
        self._unpublished = True
        write_target(self.run_dir, dataclasses.replace(target, config_problem=self.config.problem,
                                                       unservable=self.unservable))
        self._unpublished = False

    def _fail_unloadable(self, view: VersionsView, serving: set[VersionKey]) -> None:
        """Mark failed at once the settled versions no worker could load (unreadable, no model file, ambiguous)."""
        problems = {}
        for key, source in view.sources.items():
            if not source.problem:
                continue
            if key in serving:  # NOTE: an I/O error or a file dropped in must not take a served model out of service
                self._tell_once(("served problem", source.model, str(source.version), source.problem),
                                "forkserve: model %s version %s is served, but its directory now reads as unloadable "
                                "(%s); running workers keep the copy they loaded", source.model, source.version, source.problem)
            elif not self.ledger.is_failed(source, view):
                problems[key] = source.problem
        self.ledger.mark(problems, view)

    def _tell_about_the_repository(self, config: ServerConfig) -> None:
        """Log once each: entries a model directory ignores, settings for a model the repository lacks."""
        for name in self.settled:
            for entry, why in self._stray(config, name).items():
                self._tell_once(("stray", name, entry, why), "forkserve: model %s: %s %s", name, entry, why)
        root = self.scanner.models_dir
        for name in sorted(n for n in set(config.models) - set(self.settled)
                           if not config.for_model(n).base_path and (root is None or not is_dir(root / n))):
            self._tell_once(("settings", name, self.config.path.name),
                            "forkserve: %s has settings for model %s, but the repository has no model %s "
                            "(renamed or removed?); they apply to nothing", self.config.path, name, name)

    def _stray(self, config: ServerConfig, name: str) -> dict[str, str]:
        """Entries of a model's directory that look meant to be versions (server.repository.stray_entries)."""
        directory = model_dir(self.scanner.models_dir, config, name)
        return stray_entries(directory) if directory is not None else {}

    def _tell_once(self, key: tuple[str, ...], message: str, *args: object) -> None:
        if key not in self._told:
            self._told.add(key)
            log.warning(message, *args)

    def _settled_version_changed(self, source: VersionSource, what: str) -> bool:
        """The scanner saw a settled version's files change: a failed one is retried once settled; others are reported."""
        if self.ledger.has_mark((source.model, source.version)):
            log.info("forkserve: files of failed model %s version %s changed (%s); it is tried again once they settle",
                     source.model, source.version, what)
            return True
        log.warning(
            "forkserve: model %s version %s changed on disk after it settled (%s); versions are immutable: "
            "running workers keep the files they loaded, workers started later load the changed ones; "
            "publish a new version instead", source.model, source.version, what,
        )
        record_metric(lambda m: m.MODEL_VERSION_CHANGES.labels(source.model, str(source.version)).inc())
        return False
