"""Scan the model repository `<root>/<name>/<version>/` (no TensorFlow; the master may use it)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from server.config import ModelConfig

# NOTE: names are also URL path segments; this pattern is what keeps "..", "/" and "%2F" out.
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
VERSION_RE = re.compile(r"^[0-9]{1,18}$")
KERAS_SUFFIXES = (".keras",)
HDF5_SUFFIXES = (".h5", ".hdf5")


def is_model_name(name: str) -> bool:
    """A directory name that can be a model: URL-safe, no leading dot, not all digits."""
    return bool(MODEL_NAME_RE.fullmatch(name)) and not name.isdigit() and ".." not in name


def parse_version(name: str) -> int | None:
    """The positive integer a version directory stands for, or None to ignore it."""
    if not VERSION_RE.fullmatch(name):
        return None
    value = int(name)
    return value if value >= 1 else None


@dataclass(frozen=True)
class VersionSource:
    """One version directory and the model file format found in it."""

    model: str
    version: int
    path: Path
    format: str  # "keras", "h5", "savedmodel" or "" when nothing loadable is there
    problem: str = ""  # why the directory cannot be loaded, when format is ""
    file: Path | None = None  # the Keras file, when it is known already

    @property
    def model_path(self) -> Path:
        """What the loader opens: the SavedModel directory or the single Keras file."""
        if self.format == "savedmodel":
            return self.path
        if self.file is not None:
            return self.file
        return next(p for p in _model_files(self.path) if _format_of_file(p) == self.format)


def _format_of_file(path: Path) -> str:
    """Format of one file by its suffix, or ''."""
    suffix = path.suffix.lower()
    if suffix in KERAS_SUFFIXES:
        return "keras"
    if suffix in HDF5_SUFFIXES:
        return "h5"
    return ""


def _model_files(path: Path) -> list[Path]:
    """Visible regular files of a version directory with a Keras suffix."""
    return sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".") and _format_of_file(p))


def detect_format(path: Path) -> tuple[str, str]:
    """(format, problem) for a version directory."""
    if (path / "saved_model.pb").is_file() or (path / "saved_model.pbtxt").is_file():
        return "savedmodel", ""
    candidates = _model_files(path)
    if len(candidates) == 1:
        return _format_of_file(candidates[0]), ""
    if not candidates:
        return "", "no model file (expected saved_model.pb, *.keras, *.h5 or *.hdf5)"
    return "", f"several model files: {sorted(p.name for p in candidates)}"


def scan_model(root: Path, name: str) -> list[VersionSource]:
    """Versions of one model, newest first."""
    versions = []
    model_dir = root / name
    try:
        entries = list(model_dir.iterdir())
    except OSError:
        return []
    for entry in entries:
        version = parse_version(entry.name)
        if version is None or not entry.is_dir():
            continue
        fmt, problem = detect_format(entry)
        versions.append(VersionSource(name, version, entry, fmt, problem))
    return sorted(versions, key=lambda v: v.version, reverse=True)


def scan(root: Path) -> dict[str, list[VersionSource]]:
    """Every model in the repository with its versions, newest first."""
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return {}
    return {
        entry.name: scan_model(root, entry.name)
        for entry in entries
        if entry.is_dir() and is_model_name(entry.name)
    }


def select_versions(available: list[VersionSource], config: ModelConfig) -> tuple[list[VersionSource], int]:
    """(candidates in load order, how many to keep) under the model's version policy.

    The "latest" policy lists every version newest first and keeps the first `latest` that
    load, so a broken newest version falls back to the one before it (TF Serving's
    availability-preserving behaviour) instead of leaving the model without a version.
    """
    if config.version_policy == "all":
        return list(available), len(available)
    if config.version_policy == "specific":
        wanted = set(config.versions)
        chosen = [v for v in available if v.version in wanted]
        return chosen, len(chosen)
    return list(available), config.latest
