"""What the fleet should serve, and what must never be served (no TensorFlow here).

`<run_dir>/target.json` (master writes, workers read at boot) lists per model the versions to
try newest first and how many to keep, with the configuration the master accepted. Its
`generation` names the versions and the configuration together: an edit to conf/models.toml
is a new generation and rolls the workers like a new version does. A worker never reads
conf/models.toml itself, so the fleet never runs two configurations once a rollout is over.

`<run_dir>/failed.json` (master writes) holds versions that must not be served, with the reason,
the content (a digest of their files' bytes) and the model's settings they had when they failed:
a version whose files or settings change afterwards (a copy that completes, `handler = true`
added) is tried again.

Models of the repository that the target leaves out because nothing of theirs can be served
(every version failed, no version directory, a policy that selects none) are listed in the
target with the reason, as a report: they are not part of the generation and never make a
worker unready unless strict readiness is on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server.config import ConfigError, ModelConfig, ServerConfig, parse_config
from server.repository import VersionSource, select_versions
from server.state import read_json, write_json

TARGET_FILE = "target.json"
FAILED_FILE = "failed.json"


@dataclass(frozen=True)
class ModelTarget:
    """Versions of one model to try, newest first, and how many of them to serve."""

    candidates: tuple[int, ...]
    keep: int

    @property
    def intended(self) -> tuple[int, ...]:
        """The versions a healthy worker serves."""
        return self.candidates[: self.keep]


@dataclass(frozen=True)
class ConfigProblem:
    """conf/models.toml as the master last read it could not be used: which models it affects."""

    message: str
    model: str | None = None  # None: the whole file

    def affects(self, model: str) -> bool:
        return self.model is None or self.model == model


@dataclass(frozen=True)
class Target:
    """The whole fleet's target."""

    models: dict[str, ModelTarget] = field(default_factory=dict)
    config: ServerConfig = field(default_factory=ServerConfig)
    reason: str = ""
    config_problem: ConfigProblem | None = None  # reported, never part of the generation
    unservable: dict[str, str] = field(default_factory=dict)  # models left out, with why (reported only)

    @property
    def generation(self) -> str:
        """A short name for the content (equal targets have equal generations)."""
        content = json.dumps(
            {"models": {m: [list(t.candidates), t.keep] for m, t in sorted(self.models.items())},
             "config": self.config.source},
            sort_keys=True,
        )
        return hashlib.sha256(content.encode()).hexdigest()[:12]

    def intended(self) -> dict[str, list[int]]:
        """Per model, the versions a healthy worker serves."""
        return {name: list(t.intended) for name, t in self.models.items()}


def compute_target(
    versions: dict[str, list[VersionSource]], config: ServerConfig, reason: str = "",
    config_problem: ConfigProblem | None = None, why_empty: dict[str, str] | None = None,
) -> Target:
    """Apply each model's version policy to its usable (settled, not failed) versions.

    A model left with no candidate is not part of the target: a worker would serve nothing of
    it. It is listed in `unservable` with `why_empty[name]` (or what the policy selected).
    """
    models, unservable = {}, {}
    for name, sources in sorted(versions.items()):
        candidates, keep = select_versions(sources, config.for_model(name))
        if candidates:
            models[name] = ModelTarget(tuple(s.version for s in candidates), keep)
        else:
            unservable[name] = (why_empty or {}).get(name) or _nothing_selected(sources, config.for_model(name))
    return Target(models, config, reason, config_problem, unservable)


def _nothing_selected(sources: list[VersionSource], config: ModelConfig) -> str:
    """Why a model with usable versions has no candidate: its policy selects none of them."""
    if not sources:
        return "no version directory to serve"
    return (f"version_policy {config.version_policy!r} selects versions {list(config.versions)}, "
            f"the repository has {sorted(s.version for s in sources)}")


def config_key(config: ModelConfig) -> str:
    """A short name for a model's settings: a failed version is tried again when they change."""
    return hashlib.sha256(json.dumps(dataclasses.asdict(config), sort_keys=True).encode()).hexdigest()[:16]


def write_target(run_dir: Path, target: Target) -> None:
    """Master: publish the target that workers started from now on load."""
    problem = target.config_problem
    write_json(run_dir / TARGET_FILE, {
        "generation": target.generation,
        "reason": target.reason,
        "models": {m: {"candidates": list(t.candidates), "keep": t.keep} for m, t in target.models.items()},
        "config": target.config.source,
        "config_problem": None if problem is None else {"message": problem.message, "model": problem.model},
        "unservable": target.unservable,
    })


def read_target(run_dir: Path) -> Target | None:
    """Worker: the target to load, or None when the master published none (or an unreadable one)."""
    data = read_json(run_dir / TARGET_FILE)
    if not isinstance(data, dict):
        return None
    try:
        models = {
            name: ModelTarget(tuple(int(v) for v in entry["candidates"]), int(entry["keep"]))
            for name, entry in data.get("models", {}).items()
        }
        problem = data.get("config_problem")
        return Target(
            models,
            parse_config(data.get("config") or {}),
            data.get("reason", ""),
            ConfigProblem(problem["message"], problem.get("model")) if problem else None,
            {str(name): str(why) for name, why in (data.get("unservable") or {}).items()},
        )
    except (ConfigError, KeyError, TypeError, ValueError):
        return None


@dataclass(frozen=True)
class FailedVersion:
    """A version that must not be served: why, and the content and settings it had when it failed."""

    reason: str
    content: str = ""  # digest of its directory's files then (server.master.scanner); "" matches any content
    config: str = ""  # config_key() of the model's settings then; "" matches any settings


def read_failed(run_dir: Path) -> dict[str, dict[int, FailedVersion]]:
    """Versions marked failed: {model: {version: FailedVersion}}."""
    data = read_json(run_dir / FAILED_FILE)
    failed: dict[str, dict[int, FailedVersion]] = {}
    if not isinstance(data, dict):
        return failed
    for model, versions in data.items():
        if isinstance(versions, dict):
            failed[model] = {
                int(v): FailedVersion(str(entry.get("reason", "")), str(entry.get("content", "")),
                                      str(entry.get("config", "")))
                for v, entry in versions.items() if isinstance(entry, dict) and v.isdigit()
            }
    return failed


def write_failed(run_dir: Path, failed: dict[str, dict[int, FailedVersion]]) -> None:
    """Master: replace the failed versions (only the master writes this file)."""
    write_json(run_dir / FAILED_FILE, {
        model: {str(v): {"reason": f.reason, "content": f.content, "config": f.config} for v, f in versions.items()}
        for model, versions in failed.items() if versions
    })


def failed_reason(run_dir: Path, model: str, version: int) -> str | None:
    """Worker: why a version was marked failed, or None."""
    entry = read_failed(run_dir).get(model, {}).get(version)
    return None if entry is None else entry.reason


def describe_problem(problem: ConfigProblem | None, model: str) -> dict[str, Any]:
    """The config problem of `model` for a status report ({} when there is none)."""
    if problem is None or not problem.affects(model):
        return {}
    return {"config_error": f"{problem.message} (serving with the last good configuration)"}
