"""Workers that died while loading a version: after `limit` deaths in a row it is to blame (master, no TensorFlow).

A worker writes which version it is loading into its state file (server.state); when it dies
(SIGKILL, OOM, a crash in TensorFlow, gunicorn's timeout after a hang), the master's child_exit
records where. A version no live worker serves that killed `limit` loading workers in a row is
marked failed, so gunicorn stops respawning workers into the same death. A worker that serves
the version clears its count: one unlucky OOM does not fail a version for good.
"""

from __future__ import annotations

from dataclasses import dataclass, field

VersionKey = tuple[str, int]


@dataclass
class Strikes:
    """Deaths per model version since a worker last served it."""

    limit: int
    _counts: dict[VersionKey, int] = field(default_factory=dict)
    _last: dict[VersionKey, str] = field(default_factory=dict)

    def add(self, version: VersionKey, what: str) -> bool:
        """Count one death while loading `version`; True when it reached the limit."""
        self._counts[version] = self._counts.get(version, 0) + 1
        self._last[version] = what
        return self._counts[version] >= self.limit

    def count(self, version: VersionKey) -> int:
        return self._counts.get(version, 0)

    def verdict(self, version: VersionKey) -> str:
        """Why the version is to blame, for failed.json."""
        return f"workers died loading it {self.count(version)} times in a row (last: {self._last.get(version, '?')})"

    def clear(self, version: VersionKey) -> None:
        """A worker serves it (or it was marked failed): start counting from zero."""
        self._counts.pop(version, None)
        self._last.pop(version, None)
