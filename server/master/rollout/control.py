"""Explicit model control in the master: which models are loaded, the load and unload calls, the repository index.

Runs in the master's rollout thread (server.master.rollout.controller), no TensorFlow. In explicit
mode (FORKSERVE_MODEL_CONTROL=explicit) the target holds only the loaded models, each with the
configuration override its load carried; a pass takes the calls waiting (server.control), rolls
the workers over through the same readiness-gated rollout, and answers each call by what the
workers then run. In poll mode it only writes the index and refuses the calls.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from server import control
from server.config import ConfigError, ModelConfig, ServerConfig, with_overrides
from server.control import ControlRequest
from server.repository import is_model_name, model_dir
from server.target import Target

if TYPE_CHECKING:  # NOTE: imported only with TF Serving's configuration: protobuf stays out of the master otherwise
    from server.master.model_server_config import ModelServerConfigSource

log = logging.getLogger("forkserve.repository")

STALE_ANSWER_SECONDS = 3600.0  # an answer nobody took in an hour: its worker died or gave up waiting
POLL_REFUSAL = ("explicit model load / unload is not allowed: FORKSERVE_MODEL_CONTROL=poll serves every model of "
                "the repository (publish or remove a version directory instead); start with "
                "FORKSERVE_MODEL_CONTROL=explicit to load and unload models by call")


class ModelControl:
    """The loaded set (explicit mode), the calls of one pass, and the index the workers answer from."""

    def __init__(self, run_dir: Path, models_dir: Path | None, mode: str, startup: tuple[str, ...],
                 model_server: ModelServerConfigSource | None = None, composable: Callable[[], str] = lambda: "") -> None:
        self.run_dir = run_dir
        self.model_server = model_server  # TF Serving's model configuration: HandleReloadConfigRequest replaces it
        self._composable = composable  # why models.toml cannot go under the models now ("" when it can)
        self._queued: set[str] = set()  # reloads waiting for the one in progress (taken: they wake no pass)
        self.models_dir = models_dir
        self.explicit = mode == "explicit"
        self.mode = mode
        self.loaded: dict[str, dict[str, Any]] = {name: {} for name in startup}  # name -> its load's override
        self.reasons: dict[str, str] = {}  # why a model is not loaded: "unloaded", or its last load's failure
        self.calls: list[ControlRequest] = []  # taken this pass, not yet answered
        self._before: dict[str, dict[str, Any] | None] = {}  # a load's model as it was loaded before (None: it was not)
        self._index: dict[str, dict[str, Any]] | None = None  # as last written
        self._names: set[str] = set()  # the repository's models at the last index write
        self._unservable: dict[str, str] = {}  # ... and those the master left out, with why
        control.clear(run_dir)

    def selection(self) -> dict[str, dict[str, Any]] | None:
        """The loaded models and their overrides (explicit mode), None when the repository is the selection."""
        return self.loaded if self.explicit else None

    def take(self, config: ServerConfig, serving: set[tuple[str, int]] | None = None) -> None:
        """Take the calls waiting: refuse what cannot be done at once, apply the rest to the loaded set.

        `serving`: the versions workers serve now (a reload's labels may name only those, TF Serving's rule).
        """
        control.drop_stale_answers(self.run_dir, STALE_ANSWER_SECONDS)
        taken = self.taken()
        for request in control.pending(self.run_dir):
            if request.id in taken and request.id not in self._queued:  # NOTE: taken by an earlier pass that is not
                continue  # over (a rollout held for a copy)
            if request.id not in self._queued:
                log.info("forkserve: %s asked by worker %d (request %s)", _call(request), request.pid, request.id)
            if request.action == control.RELOAD_CONFIG:
                self._take_reload(request, serving or set())
                continue
            refusal = self._refusal(request, config)
            if refusal:
                self._answer(request, False, refusal)
                continue
            if request.action == "load":
                self._before.setdefault(request.model, self.loaded.get(request.model))
                self.loaded[request.model] = request.override
                self.reasons.pop(request.model, None)
            elif self.loaded.pop(request.model, None) is not None:
                self._before.setdefault(request.model, None)
                self.reasons[request.model] = "unloaded"
            self.calls.append(request)

    def _take_reload(self, request: ControlRequest, serving: set[tuple[str, int]]) -> None:
        """A HandleReloadConfigRequest: its models replace TF Serving's configuration (one reload at a time)."""
        if self.model_server is None:
            self._answer(request, False, "the server was not started with TF Serving's model configuration "
                                         "(python -m server tfserving --model_config_file=...)")
            return
        if any(call.action == control.RELOAD_CONFIG for call in self.calls):
            self._queued.add(request.id)  # NOTE: taken once this reload is settled; meanwhile it wakes no pass
            return
        self._queued.discard(request.id)
        try:
            tables = self.model_server.replace(str(request.override.get("model_config", "")), serving)
        except ConfigError as exc:
            self._answer(request, False, str(exc))
            return
        clash = self._composable()
        if clash:
            self.model_server.settle(False)
            self._answer(request, False, f"the configuration does not apply: {clash}")
            return
        log.info("forkserve: reload of the model configuration (request %s): serving %s", request.id,
                 ", ".join(sorted(tables)) or "no model")
        self.calls.append(request)

    def _refusal(self, request: ControlRequest, config: ServerConfig) -> str:
        """Why a call fails before any rollout, or ''."""
        if not self.explicit:
            return POLL_REFUSAL
        if request.action == "unload":
            return ""
        directory = model_dir(self.models_dir, config, request.model) if is_model_name(request.model) else None
        if directory is None or not directory.is_dir():
            return f"failed to load '{request.model}': the repository {self.models_dir} has no model {request.model!r}"
        try:
            with_overrides(config, {**self.loaded, request.model: request.override})
        except ConfigError as exc:
            return f"failed to load '{request.model}': its config does not apply: {exc}"
        return ""

    def callers(self) -> set[int]:
        """Workers holding a call of this pass: the rollout replaces them last."""
        return {request.pid for request in self.calls}

    def taken(self) -> set[str]:
        """Ids of the calls taken and not yet answered (queued reloads too)."""
        return {request.id for request in self.calls} | self._queued

    def holding_untaken(self) -> set[int]:
        """Workers holding a call that arrived after this pass took its own: the rollout leaves them to the next pass.

        NOTE: retired now, such a worker would wait graceful_timeout for an answer only the next pass
        gives, and the rollout with it; left alone, it is a straggler the next pass replaces last.
        """
        taken, callers = self.taken(), self.callers()
        return {request.pid for request in control.pending(self.run_dir)
                if request.id not in taken and request.pid not in callers}  # NOTE: a caller of this pass must go

    def before_retire(self, pid: int, target: Target) -> None:
        """The rollout retires `pid`, every other worker on `target`: answer the calls it holds now.

        NOTE: the worker answers its client while it stops (after it stopped accepting, so the
        client's next request reaches a worker on `target`); answered after the rollout, the call
        would have died with it. With calls held by several workers, all but the last are answered
        one worker start early (the last workers are still being replaced).
        """
        held = [r for r in self.calls if r.pid == pid]
        if held:
            self.write_index(target, self._names, self._unservable, taken=[r for r in self.calls if r not in held])
        for request in held:
            self._settle(request, target, "", retiring=True)

    def settle(self, current: Target, unservable: dict[str, str], detail: str) -> None:
        """After the pass: answer every call by what the workers now run (a failed load puts back what was loaded)."""
        self._unservable = {**self._unservable, **unservable}
        for request in list(self.calls):
            why = unservable.get(request.model) or detail or "the workers did not take it up"
            if request.action == control.RELOAD_CONFIG:
                why = detail or "the workers did not take it up"
            self._settle(request, current, why)
        self._before.clear()

    def _settle(self, request: ControlRequest, target: Target, why: str, retiring: bool = False) -> None:
        """Answer one call: done when `target` serves (load) or leaves out (unload) its model, or every model (reload)."""
        if request.action == control.RELOAD_CONFIG:
            self._settle_reload(request, target, why, retiring)
            return
        served = request.model in target.models
        if request.action == "load" and served:
            self._answer(request, True, f"loaded '{request.model}'", retiring)
        elif request.action == "unload" and not served:
            self._answer(request, True, f"unloaded '{request.model}'", retiring)
        elif request.action == "load":
            previous = self._before.get(request.model)
            if previous is None:
                self.loaded.pop(request.model, None)
                self.reasons[request.model] = why
            else:
                self.loaded[request.model] = previous
            self._answer(request, False, f"failed to load '{request.model}': {why}")
        else:
            self._answer(request, False, f"failed to unload '{request.model}': {why}")

    def _settle_reload(self, request: ControlRequest, target: Target, why: str, retiring: bool) -> None:
        """A reload is done when `target` serves every model it names as it names it; else the configuration before returns.

        NOTE: as it names it (base_path, versions, labels): a rollout that gave up leaves the old
        target, in which a changed model still serves as it was.
        """
        assert self.model_server is not None
        missing = {}
        why = why or "the workers did not take it up"
        for name, table in self.model_server.tables.items():
            if not target.intended().get(name):
                missing[name] = target.unservable.get(name) or self._unservable.get(name) or why
            elif not _configured_as(target.config.for_model(name), table):
                missing[name] = why
        self.model_server.settle(not missing)
        if missing:
            self._answer(request, False, "; ".join(f"failed to load model {name}: {reason}"
                                                   for name, reason in sorted(missing.items())))
        else:
            self._answer(request, True, f"serving {', '.join(sorted(self.model_server.tables)) or 'no model'}", retiring)

    def refuse_hopeless_reloads(self, desired: Target) -> bool:
        """Answer before any rollout a reload whose new models cannot be served at all (no version directory...)."""
        refused = False
        for request in [r for r in self.calls if r.action == control.RELOAD_CONFIG]:
            assert self.model_server is not None
            if any(name in desired.unservable for name in self.model_server.tables):
                self._settle_reload(request, desired, "", False)
                refused = True
        return refused

    def _answer(self, request: ControlRequest, ok: bool, message: str, retiring: bool = False) -> None:
        """Write the answer for the waiting worker, and log it."""
        if request in self.calls:
            self.calls.remove(request)
        (log.info if ok else log.error)("forkserve: %s (request %s): %s", _call(request), request.id, message)
        try:
            control.answer(self.run_dir, request, ok, message, retiring)
        except OSError:  # reported by write_json; the worker's call times out
            pass

    def write_index(self, current: Target, names: set[str], unservable: dict[str, str],
                    taken: list[ControlRequest] | None = None) -> None:
        """Every model of the repository with its state, when it changed: what the index calls answer.

        `taken`: the calls still in progress (default: every call of this pass).
        """
        self._names, self._unservable = names, unservable
        models: dict[str, dict[str, Any]] = {}
        loading = {request.model: request.action for request in (self.calls if taken is None else taken)}
        for name in sorted(names | set(self.loaded) | set(current.models)):
            intended = current.intended().get(name)
            if name in loading:
                state, reason = (control.LOADING if loading[name] == "load" else control.UNLOADING), ""
            elif intended:
                state, reason = control.READY, ""
            elif name in unservable:
                state, reason = control.UNAVAILABLE, unservable[name]
            elif name in self.reasons:
                state, reason = control.UNAVAILABLE, self.reasons[name]
            else:
                state, reason = "", ""  # never loaded (explicit mode)
            models[name] = {"state": state, "reason": reason, "versions": sorted(intended or [])}
        if models != self._index:
            try:
                control.write_index(self.run_dir, self.mode, models)
            except OSError:  # reported by write_json; written again at the next pass
                return
            self._index = models


def _call(request: ControlRequest) -> str:
    """A call as the log names it: "load of model 'x'", "reload of the model configuration"."""
    if request.action == control.RELOAD_CONFIG:
        return "reload of the model configuration"
    return f"{request.action} of model {request.model!r}"


def _configured_as(config: ModelConfig, table: dict[str, Any]) -> bool:
    """A model's settings in a target hold what its TF Serving table says (base_path, version policy, labels)."""
    return all((tuple(value) if isinstance(value, list) else value) == getattr(config, key) for key, value in table.items())
