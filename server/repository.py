"""Scan the model repository `<root>/<name>/<version>/`, and models kept elsewhere (`base_path`) (no TensorFlow; the master may use it)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from server.config import ModelConfig, ServerConfig

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


SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
EXPECTED = "expected saved_model.pb, *.keras, *.h5 or *.hdf5 directly in the version directory"


def detect_format(path: Path) -> tuple[str, str]:
    """(format, problem) for a version directory; an unreadable one is a problem, never an exception."""
    try:
        saved_model = any((path / name).is_file() for name in SAVED_MODEL_FILES)
        candidates = _model_files(path)
    except OSError as exc:  # NOTE: Path.is_file raises EACCES inside a directory we may not search
        return "", f"cannot read the version directory: {exc.strerror or exc}"
    if saved_model and candidates:
        return "", (f"ambiguous: a SavedModel (saved_model.pb) and {', '.join(p.name for p in candidates)}; "
                    "keep one model per version directory")
    if saved_model:
        return "savedmodel", ""
    if len(candidates) == 1:
        return _format_of_file(candidates[0]), ""
    if candidates:
        return "", f"several model files: {sorted(p.name for p in candidates)}"
    nested = _nested_model(path)
    hint = f"; found {nested} one level down: move the content of {nested.split('/')[0]}/ up into {path.name}/" if nested else ""
    return "", f"no model file ({EXPECTED}){hint}"


def _nested_model(path: Path) -> str:
    """A model file in a subdirectory of `path` (`export/saved_model.pb`), or ""."""
    try:
        for sub in sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")):
            found = [p.name for p in sorted(sub.iterdir()) if p.is_file() and (p.name in SAVED_MODEL_FILES or _format_of_file(p))]
            if found:
                return f"{sub.name}/{found[0]}"
    except OSError:
        pass
    return ""


def stray_entries(model_dir: Path) -> dict[str, str]:
    """Entries of a model directory that are not versions and look meant to be, with what was expected.

    Hidden entries (publish's staging and lock) and other plain files (a README) are not listed.
    """
    try:
        entries = sorted(model_dir.iterdir())
    except OSError:
        return {}
    stray = {}
    for entry in entries:
        if entry.name.startswith(".") or parse_version(entry.name) is not None:
            continue
        try:
            is_dir, is_model_file = entry.is_dir(), entry.is_file() and bool(_format_of_file(entry))
        except OSError:
            continue
        digits = re.sub(r"\D", "", entry.name)
        if is_dir:
            guess = f" (did you mean {model_dir.name}/{int(digits)}?)" if digits and int(digits) >= 1 else ""
            stray[entry.name] = f"ignored: version directories are named by a positive integer{guess}"
        elif is_model_file:
            stray[entry.name] = f"ignored: a model file goes in a version directory ({model_dir.name}/1/{entry.name})"
    return stray


def model_dir(root: Path | None, config: ServerConfig, name: str) -> Path | None:
    """Where model `name`'s version directories are: its `base_path`, else `<root>/<name>` (None: nowhere)."""
    base_path = config.for_model(name).base_path if name in config.models else ""
    if base_path:
        return Path(base_path)
    return root / name if root is not None else None


def scan_model(root: Path, name: str) -> list[VersionSource]:
    """Versions of one model of the repository `root`, newest first."""
    return scan_versions(root / name, name)


def scan_versions(model_dir: Path, name: str) -> list[VersionSource]:
    """Versions of model `name` in `model_dir`, newest first."""
    versions = []
    try:
        entries = list(model_dir.iterdir())
    except OSError:
        return []
    for entry in entries:
        version = parse_version(entry.name)
        try:
            if version is None or not entry.is_dir():
                continue
        except OSError:
            continue
        fmt, problem = detect_format(entry)
        versions.append(VersionSource(name, version, entry, fmt, problem))
    return sorted(versions, key=lambda v: v.version, reverse=True)


def scan(root: Path | None, config: ServerConfig | None = None) -> dict[str, list[VersionSource]]:
    """Every model with its versions, newest first: the repository's (`root`, may be None) and those with a `base_path`.

    A model with a base_path is read there even when the repository has a directory of that name.
    """
    found: dict[str, list[VersionSource]] = {}
    if root is not None:
        try:
            entries = sorted(root.iterdir())
        except OSError:
            entries = []
        found = {entry.name: scan_model(root, entry.name) for entry in entries if is_model_name(entry.name) and _is_dir(entry)}
    for name, settings in (config.models if config is not None else {}).items():
        if settings.base_path:
            found[name] = scan_versions(Path(settings.base_path), name)
    return dict(sorted(found.items()))


def _is_dir(path: Path) -> bool:
    """Path.is_dir, False for a path we may not look at."""
    try:
        return path.is_dir()
    except OSError:
        return False


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
