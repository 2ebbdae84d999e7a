"""TF Serving's model configuration as the master follows it: which models, from where, with which versions and labels.

Runs in the master (on_starting, then the rollout thread), no TensorFlow. The models come from
--model_config_file (FORKSERVE_TFSERVING_MODEL_CONFIG), re-read every
--model_config_file_poll_wait_seconds (0: read once, as TF Serving), or from --model_name and
--model_base_path (FORKSERVE_TFSERVING_MODEL); a HandleReloadConfigRequest replaces them until
the file changes again. A file that changed is taken once two reads agree (never half-written);
a malformed one, or labels that break TF Serving's rule, keep the last good list: logged once and
named in /readyz, as a broken models.toml is.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server.config import ConfigError, ServerConfig, read_config_bytes, with_model_server_config
from server.protocols.tfserving import config_files

log = logging.getLogger("forkserve.config")

Tables = dict[str, dict[str, Any]]


@dataclass
class ModelServerConfigSource:
    """The served models' tables (base_path, version policy, labels) and the [defaults] TF Serving's flags set."""

    path: Path | None  # --model_config_file; None: the one model of `single`
    single: tuple[str, str] | None = None  # (--model_name, --model_base_path)
    poll_seconds: float = 0.0  # 0: the file is read once
    defaults: dict[str, Any] = field(default_factory=dict)  # batching parameters, request timeout
    labels_for_unavailable: bool = False  # --allow_version_labels_for_unavailable_models
    tables: Tables = field(default_factory=dict)
    problem: str = ""  # why the last read, poll or reload was refused ("" when none)
    _raw: bytes | None = None  # the file's bytes the tables came from
    _pending: bytes | None = None  # bytes read once, taken when the next read agrees
    _next_read: float = 0.0  # monotonic time of the next poll of the file
    _before: Tables | None = None  # a reload in progress: the tables it replaced (their models keep serving meanwhile)

    def initial(self) -> Tables:
        """The tables at start; ConfigError stops the start (a malformed file, a label on no served version)."""
        if self.path is None:
            name, base_path = self.single or ("", "")
            text = config_files.single_model_config(name, base_path)
            return self._accept(self._tables(text.encode(), "--model_name/--model_base_path"), set())
        raw = read_config_bytes(self.path)
        if raw is None:
            raise ConfigError(f"{self.path}: no such file (--model_config_file)")
        self._raw = raw
        self._next_read = time.monotonic() + self.poll_seconds
        return self._accept(self._tables(raw, self.path), set())

    def compose(self, config: ServerConfig) -> ServerConfig:
        """models.toml's configuration with these models and defaults over it (and, while a reload loads, the old ones)."""
        kept = {name: table for name, table in (self._before or {}).items() if name not in self.tables}
        return with_model_server_config(config, self.defaults, {**kept, **self.tables})

    def refresh(self, serving: set[tuple[str, int]]) -> Tables:
        """Poll the file when due; a change is taken once two reads agree and its labels pass TF Serving's rule."""
        if self.path is None or self.poll_seconds <= 0 or time.monotonic() < self._next_read or self._before is not None:
            return self.tables  # NOTE: never during a reload: its call is answered by what it asked for
        try:
            raw = read_config_bytes(self.path)
        except ConfigError as exc:
            return self._refuse(str(exc))
        if raw is None:
            return self._refuse(f"{self.path} is missing; serving the models it listed before")
        if raw == self._raw:  # back to what is served: nothing to change
            if self.problem:
                log.info("forkserve: the model configuration is valid again")
            self._pending, self._next_read, self.problem = None, time.monotonic() + self.poll_seconds, ""
            return self.tables
        if raw != self._pending:  # NOTE: a file being written is read again at the next pass, not taken half-way
            self._pending = raw
            return self.tables
        self._pending, self._next_read = None, time.monotonic() + self.poll_seconds
        try:  # NOTE: a refused file is read again at each poll, as TF Serving does: its labels may pass later
            tables = self._accept(self._tables(raw, self.path), serving)
        except ConfigError as exc:
            return self._refuse(str(exc))
        self._raw = raw
        log.info("forkserve: %s changed: serving %s", self.path, ", ".join(sorted(tables)) or "no model")
        return tables

    def replace(self, text: str, serving: set[tuple[str, int]]) -> Tables:
        """A HandleReloadConfigRequest's ModelServerConfig, served until the file changes; ConfigError refuses it.

        NOTE: the models it drops keep serving until it is settled: a reload whose new model cannot
        load leaves the old set serving throughout (settle(False) puts it back).
        """
        before = self.tables if self._before is None else self._before
        tables = self._accept(self._tables(text.encode(), "HandleReloadConfigRequest"), serving)
        self._before = before
        return tables

    def settle(self, ok: bool) -> None:
        """The reload in progress succeeded (the models it dropped go at the next pass) or failed (the old tables return)."""
        if self._before is not None and not ok:
            self.tables = self._before
        self._before = None

    def _tables(self, raw: bytes, where: Path | str) -> Tables:
        return config_files.model_tables(config_files.model_server_config(raw, where), str(where))

    def _accept(self, tables: Tables, serving: set[tuple[str, int]]) -> Tables:
        """Take `tables` if their labels pass TF Serving's rule (ServerCore::UpdateModelVersionLabelMap)."""
        for name, table in tables.items():
            for label, version in table.get("labels", {}).items():
                before = self.tables.get(name, {}).get("labels", {}).get(label)
                allowed = self.labels_for_unavailable and before in (None, version)
                if not allowed and (name, version) not in serving:
                    raise ConfigError(f"Request to assign label to version {version} of model {name}, which is not "
                                      "currently available for inference", name)
        if self.problem:
            log.info("forkserve: the model configuration is valid again")
        self.tables, self.problem = tables, ""
        return tables

    def _refuse(self, why: str) -> Tables:
        """Keep the last good tables; log a new problem once."""
        if why != self.problem:
            log.error("forkserve: %s; keeping the models configured before", why)
        self.problem = why
        return self.tables
