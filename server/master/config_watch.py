"""conf/models.toml as the master follows it: the last good configuration, and what is wrong with the file now.

Runs in the master's rollout thread, which re-reads the file every poll. New content counts
once two polls read the same bytes, as a version directory must settle: an editor's save that
truncates then writes, or renames over the file, is never taken half-way. A broken edit never
reaches a worker (workers take the configuration from the target, server.target): the master
keeps the last configuration it accepted, logs the error once, sets
forkserve_config_last_reload_successful to 0 and names the problem in every worker's /readyz;
the next good version of the file is picked up and rolled out like a new model version. A file
that disappears after it was read is such a problem too (an empty file means every default).

With TF Serving's model configuration (server.master.model_server_config), the configuration is
models.toml's under it: the same rules hold for both, each problem keeps the last good whole.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from server.config import (
    ConfigError,
    ServerConfig,
    parse_config_bytes,
    read_config_bytes,
)
from server.target import ConfigProblem

if TYPE_CHECKING:  # NOTE: imported only with TF Serving's configuration: protobuf stays out of the master otherwise
    from server.master.model_server_config import ModelServerConfigSource

log = logging.getLogger("forkserve.config")


class ConfigWatch:
    """The accepted configuration and the current problem, if any."""

    def __init__(self, path: Path, accepted: ServerConfig, report: Callable[[bool], None] | None = None,
                 model_server: ModelServerConfigSource | None = None) -> None:
        self.path = path
        self.model_server = model_server
        self._file_config = accepted  # models.toml's part: what on_starting validated
        self.accepted = model_server.compose(accepted) if model_server is not None else accepted
        self._layer_problem: ConfigProblem | None = None
        self._file_problem: ConfigProblem | None = None
        self._report = report or (lambda ok: None)
        self._seen: bytes | None = _read_or_none(path)  # the bytes the accepted configuration came from
        self._settled = self._seen
        self._report(True)

    def refresh(self, serving: set[tuple[str, int]] | None = None) -> ServerConfig:
        """Read the files again; the new configuration once it settled and is valid, else the last good one.

        `serving`: the versions workers serve now (TF Serving's labels may name only those).
        """
        config = self._refresh_file()
        if self.model_server is None:
            return self.accepted
        self.model_server.refresh(serving or set())
        return self.compose(config)

    def composable(self) -> str:
        """Why models.toml cannot go under TF Serving's models as they are now ("" when it can)."""
        assert self.model_server is not None
        try:
            self.model_server.compose(self._file_config)
        except ConfigError as exc:
            return str(exc)
        return ""

    @property
    def problem(self) -> ConfigProblem | None:
        """What is wrong with models.toml, else with TF Serving's model configuration, now."""
        return self._file_problem or self._layer_problem

    def compose(self, file_config: ServerConfig | None = None) -> ServerConfig:
        """models.toml's configuration under TF Serving's models, taken when valid; a problem keeps the last good one."""
        assert self.model_server is not None
        problem = ConfigProblem(self.model_server.problem) if self.model_server.problem else None
        try:
            composed = self.model_server.compose(file_config or self._file_config)
        except ConfigError as exc:
            self._layer_problem = self._tell(exc, self._layer_problem)
            return self.accepted
        if problem != self._layer_problem:  # NOTE: the source logged it; forkserve_config_last_reload_successful says it
            self._report(problem is None)
        self._layer_problem = problem
        self.accepted = composed
        return composed

    def _refresh_file(self) -> ServerConfig:
        """models.toml's part: the new one once it settled and is valid, else the last good one."""
        try:
            raw = read_config_bytes(self.path)
            if raw is None and self._settled is not None:  # no file at the start means defaults; later, a mistake
                raise ConfigError(f"{self.path} is missing (an empty file means every default)")
        except ConfigError as exc:
            self._seen = None
            return self._refuse(exc)
        if raw is None:
            return self._file_config
        if raw != self._seen:  # changed since the last poll: wait until it stops changing
            self._seen = raw
            return self._file_config
        if raw == self._settled and self._file_problem is None:
            return self._file_config
        self._settled = raw
        try:
            config = parse_config_bytes(raw, self.path)
        except ConfigError as exc:
            return self._refuse(exc)
        if self._file_problem is not None:
            log.info("forkserve: %s is valid again", self.path)
            self._report(True)
        self._file_problem = None
        self._file_config = config
        if self.model_server is None:
            self.accepted = config
        return config

    def _refuse(self, exc: ConfigError) -> ServerConfig:
        """Keep the last good configuration; log and report a new problem of models.toml once."""
        self._file_problem = self._tell(exc, self._file_problem)
        return self._file_config

    def _tell(self, exc: ConfigError, before: ConfigProblem | None) -> ConfigProblem:
        """The problem `exc` names: logged and reported when it is not the one `before`."""
        problem = ConfigProblem(str(exc), exc.model)
        if problem != before:
            log.error("forkserve: %s; keeping the last good configuration", exc)
            self._report(False)
        return problem


def _read_or_none(path: Path) -> bytes | None:
    try:
        return read_config_bytes(path)
    except ConfigError:
        return None
