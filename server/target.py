"""What the fleet should serve: the master writes it, every worker loads exactly it (no TF here).

`<run_dir>/target.json` lists, per model, the versions to try newest first and how many to keep
(the version policy applied to settled directories, minus versions marked failed). Its
`generation` names the content, so a worker's state file can say which target it loaded.
`<run_dir>/failed.json` holds the versions a rollout marked failed, with the reason.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from server.config import ServerConfig
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
class Target:
    """The whole fleet's target."""

    models: dict[str, ModelTarget] = field(default_factory=dict)
    reason: str = ""

    @property
    def generation(self) -> str:
        """A short name for the content (equal targets have equal generations)."""
        content = json.dumps({m: [list(t.candidates), t.keep] for m, t in sorted(self.models.items())})
        return hashlib.sha256(content.encode()).hexdigest()[:12]

    def intended(self) -> dict[str, list[int]]:
        """Per model, the versions a healthy worker serves."""
        return {name: list(t.intended) for name, t in self.models.items()}


def compute_target(
    versions: dict[str, list[VersionSource]], config: ServerConfig, failed: dict[str, dict[str, str]], reason: str = ""
) -> Target:
    """Apply each model's version policy to its (settled) versions, skipping failed ones."""
    models = {}
    for name, sources in sorted(versions.items()):
        usable = [s for s in sources if str(s.version) not in failed.get(name, {})]
        candidates, keep = select_versions(usable, config.for_model(name))
        models[name] = ModelTarget(tuple(s.version for s in candidates), keep)
    return Target(models, reason)


def write_target(run_dir: Path, target: Target) -> None:
    """Master: publish the target that workers started from now on load."""
    data = {
        "generation": target.generation,
        "reason": target.reason,
        "models": {m: {"candidates": list(t.candidates), "keep": t.keep} for m, t in target.models.items()},
    }
    write_json(run_dir / TARGET_FILE, data)


def read_target(run_dir: Path) -> Target | None:
    """Worker: the target to load, or None when the master published none."""
    data = read_json(run_dir / TARGET_FILE)
    if not isinstance(data, dict):
        return None
    models = {
        name: ModelTarget(tuple(int(v) for v in entry["candidates"]), int(entry["keep"]))
        for name, entry in data.get("models", {}).items()
    }
    return Target(models, data.get("reason", ""))


def read_failed(run_dir: Path) -> dict[str, dict[str, str]]:
    """Versions marked failed by a rollout: {model: {version: reason}}."""
    data = read_json(run_dir / FAILED_FILE)
    return data if isinstance(data, dict) else {}


def mark_failed(run_dir: Path, model: str, version: int, reason: str) -> None:
    """Master: remember that a version must not be served, and why."""
    failed = read_failed(run_dir)
    failed.setdefault(model, {})[str(version)] = reason
    write_json(run_dir / FAILED_FILE, failed)
