"""conf/models.toml as the master follows it: the last good configuration, and what is wrong with the file now.

Runs in the master's rollout thread, which re-reads the file every poll. A broken edit never
reaches a worker (workers take the configuration from the target, server.target): the master
keeps the last configuration it accepted, logs the error once, sets
forkserve_config_last_reload_successful to 0 and names the problem in every worker's /readyz;
the next good version of the file is picked up and rolled out like a new model version.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from server.config import ConfigError, ServerConfig, load_config
from server.target import ConfigProblem

log = logging.getLogger("forkserve.config")


class ConfigWatch:
    """The accepted configuration and the current problem, if any."""

    def __init__(self, path: Path, accepted: ServerConfig, report: Callable[[bool], None] | None = None) -> None:
        self.path = path
        self.accepted = accepted  # what on_starting validated
        self.problem: ConfigProblem | None = None
        self._report = report or (lambda ok: None)
        self._report(True)

    def refresh(self) -> ServerConfig:
        """Read the file again; the new configuration when it is valid, else the last good one."""
        try:
            config = load_config(self.path)
        except ConfigError as exc:
            problem = ConfigProblem(str(exc), exc.model)
            if problem != self.problem:
                log.error("forkserve: %s; keeping the last good configuration", exc)
                self._report(False)
            self.problem = problem
            return self.accepted
        if self.problem is not None:
            log.info("forkserve: %s is valid again", self.path)
            self._report(True)
        self.problem = None
        self.accepted = config
        return config
