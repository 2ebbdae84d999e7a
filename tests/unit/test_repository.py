"""Model repository scanning: names, versions, format detection and version policies."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from server.config import ModelConfig
from server.repository import (
    VersionSource,
    detect_format,
    is_model_name,
    parse_version,
    scan,
    scan_model,
    select_versions,
    stray_entries,
)


def make_version(root: Path, model: str, version: str, *files: str) -> Path:
    """Create <root>/<model>/<version>/ holding empty `files` (a trailing '/' makes a directory)."""
    directory = root / model / version
    directory.mkdir(parents=True, exist_ok=True)
    for name in files:
        if name.endswith("/"):
            (directory / name).mkdir()
        else:
            (directory / name).write_bytes(b"")
    return directory


@pytest.mark.parametrize("name", ["resnet", "half_plus_two", "model-1.v2", "_private", "A", "a" * 128, "1a", "v1"])
def test_is_model_name_accepts_url_safe_names(name: str) -> None:
    assert is_model_name(name)


@pytest.mark.parametrize(
    "name",
    ["", "..", ".", ".hidden", "123", "0", "a/b", "a\\b", "a..b", "-dash", "a b", "a%2Fb", "a:predict", "a" * 129, "é"],
)
def test_is_model_name_rejects_unsafe_names(name: str) -> None:
    assert not is_model_name(name)


def test_is_model_name_rejects_a_trailing_newline() -> None:
    assert not is_model_name("model\n")


@pytest.mark.parametrize(("name", "expected"), [("1", 1), ("007", 7), ("42", 42), ("999999999999999999", 999999999999999999)])
def test_parse_version_reads_positive_integers(name: str, expected: int) -> None:
    assert parse_version(name) == expected


@pytest.mark.parametrize("name", ["0", "000", "tmp", "-1", "+1", "1.0", "", " 1", "1e3", "1234567890123456789", "٣"])
def test_parse_version_ignores_everything_else(name: str) -> None:
    assert parse_version(name) is None


def test_parse_version_ignores_a_trailing_newline() -> None:
    assert parse_version("7\n") is None


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (["saved_model.pb", "variables/"], "savedmodel"),
        (["saved_model.pbtxt"], "savedmodel"),
        (["model.keras"], "keras"),
        (["x.h5"], "h5"),
        (["x.hdf5"], "h5"),
        (["X.H5"], "h5"),
        (["model.keras", "README.md", ".model.h5"], "keras"),  # other and hidden files are ignored
    ],
)
def test_detect_format_finds_the_single_model_file(tmp_path: Path, files: list[str], expected: str) -> None:
    directory = make_version(tmp_path, "m", "1", *files)
    assert detect_format(directory) == (expected, "")


def test_detect_format_reports_a_directory_without_model_file(tmp_path: Path) -> None:
    directory = make_version(tmp_path, "m", "1", "notes.txt", "weights.h5/")
    fmt, problem = detect_format(directory)
    assert fmt == ""
    assert "no model file" in problem


@pytest.mark.parametrize("files", [["saved_model.pb", "model.keras"], ["saved_model.pbtxt", "variables/", "old.h5"]])
def test_detect_format_refuses_a_saved_model_beside_a_keras_file(tmp_path: Path, files: list[str]) -> None:
    directory = make_version(tmp_path, "m", "1", *files)
    fmt, problem = detect_format(directory)
    assert fmt == "" and problem.startswith("ambiguous: a SavedModel") and "keep one model" in problem


def test_detect_format_points_at_a_model_one_directory_down(tmp_path: Path) -> None:
    directory = make_version(tmp_path, "m", "1", "export/", "export/saved_model.pb", "export/variables/")
    fmt, problem = detect_format(directory)
    assert fmt == "" and "no model file" in problem
    assert "found export/saved_model.pb one level down: move the content of export/ up into 1/" in problem


def test_stray_entries_name_what_was_expected(tmp_path: Path) -> None:
    make_version(tmp_path, "m", "1", "model.keras")
    for name in ("v2", "latest", ".publish-x", "_tmp"):
        (tmp_path / "m" / name).mkdir()
    for name in ("model.keras", "README.md", ".publish.lock"):
        (tmp_path / "m" / name).write_text("x")
    stray = stray_entries(tmp_path / "m")
    assert sorted(stray) == ["_tmp", "latest", "model.keras", "v2"]  # hidden entries and a README are not stray
    assert stray["v2"].endswith("(did you mean m/2?)")
    assert "positive integer" in stray["latest"] and "did you mean" not in stray["latest"]
    assert stray["model.keras"] == "ignored: a model file goes in a version directory (m/1/model.keras)"


def test_an_unreadable_version_directory_is_a_problem_not_an_exception(tmp_path: Path) -> None:
    """As a user who may not read a 0700 version (root reads everything, so the check runs as nobody)."""
    shared = Path(tempfile.mkdtemp(prefix="forkserve-perm-", dir="/tmp"))
    try:
        shared.chmod(0o755)
        version = make_version(shared, "m", "1", "model.keras")
        (shared / "m").chmod(0o755)
        version.chmod(0o700)
        script = ("import json, pathlib; from server.repository import detect_format, scan; "
                  f"print(json.dumps([detect_format(pathlib.Path({str(version)!r})), "
                  f"[[s.version, s.problem] for s in scan(pathlib.Path({str(shared)!r}))['m']]]))")
        result = subprocess.run(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-c", script],
            capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2], timeout=60,
        )
        assert result.returncode == 0, result.stderr
        (fmt, problem), scanned = json.loads(result.stdout)
        assert fmt == "" and problem == "cannot read the version directory: Permission denied"
        assert scanned == [[1, problem]]
    finally:
        shutil.rmtree(shared)


@pytest.mark.parametrize("files", [["a.h5", "b.h5"], ["model.keras", "model.h5"], ["a.keras", "b.hdf5"]])
def test_detect_format_reports_several_model_files(tmp_path: Path, files: list[str]) -> None:
    directory = make_version(tmp_path, "m", "1", *files)
    fmt, problem = detect_format(directory)
    assert fmt == ""
    assert problem == f"several model files: {sorted(files)}"


def test_scan_finds_models_and_versions_newest_first(tmp_path: Path) -> None:
    make_version(tmp_path, "resnet", "1", "saved_model.pb")
    make_version(tmp_path, "resnet", "10", "model.keras")
    make_version(tmp_path, "resnet", "2", "m.h5")
    make_version(tmp_path, "resnet", "tmp", "model.keras")  # not a version
    make_version(tmp_path, "resnet", "0", "model.keras")  # not a version
    make_version(tmp_path, "resnet", ".3", "model.keras")  # hidden
    (tmp_path / "resnet" / "4").write_bytes(b"")  # a file named like a version
    make_version(tmp_path, ".hidden", "1", "model.keras")
    make_version(tmp_path, "123", "1", "model.keras")  # all digits: not a model name
    (tmp_path / "loose.h5").write_bytes(b"")  # a file at the top level
    found = scan(tmp_path)
    assert list(found) == ["resnet"]
    versions = found["resnet"]
    assert [v.version for v in versions] == [10, 2, 1]
    assert [v.format for v in versions] == ["keras", "h5", "savedmodel"]
    assert all(v.model == "resnet" and v.problem == "" for v in versions)
    assert versions[0].path == tmp_path / "resnet" / "10"


def test_scan_orders_versions_numerically_with_leading_zeros(tmp_path: Path) -> None:
    for name in ("9", "010", "2"):
        make_version(tmp_path, "m", name, "model.keras")
    assert [v.version for v in scan_model(tmp_path, "m")] == [10, 9, 2]


def test_scan_records_problem_versions_instead_of_dropping_them(tmp_path: Path) -> None:
    make_version(tmp_path, "m", "1", "model.keras")
    make_version(tmp_path, "m", "2")
    make_version(tmp_path, "m", "3", "a.h5", "b.keras")
    versions = {v.version: v for v in scan(tmp_path)["m"]}
    assert versions[1].format == "keras" and versions[1].problem == ""
    assert versions[2].format == "" and "no model file" in versions[2].problem
    assert versions[3].format == "" and "several model files" in versions[3].problem


def test_scan_lists_a_model_without_versions_as_empty(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert scan(tmp_path) == {"empty": []}


def test_scan_of_missing_root_is_empty(tmp_path: Path) -> None:
    assert scan(tmp_path / "nope") == {}
    assert scan_model(tmp_path, "nope") == []


def test_scan_returns_models_sorted_by_name(tmp_path: Path) -> None:
    for name in ("zeta", "alpha", "Mid"):
        make_version(tmp_path, name, "1", "model.keras")
    assert list(scan(tmp_path)) == ["Mid", "alpha", "zeta"]


def test_model_path_is_the_directory_for_savedmodel_and_the_file_otherwise(tmp_path: Path) -> None:
    saved = make_version(tmp_path, "a", "1", "saved_model.pb")
    keras = make_version(tmp_path, "b", "1", "notes.txt", "model.keras")
    h5 = make_version(tmp_path, "c", "1", "weights.hdf5")
    found = scan(tmp_path)
    assert found["a"][0].model_path == saved
    assert found["b"][0].model_path == keras / "model.keras"
    assert found["c"][0].model_path == h5 / "weights.hdf5"


@pytest.mark.parametrize("decoy", ["._model.h5", "0_old.h5/"], ids=["hidden-file", "directory"])
def test_model_path_is_the_file_detect_format_counted(tmp_path: Path, decoy: str) -> None:
    directory = make_version(tmp_path, "m", "1", decoy, "model.h5")
    (source,) = scan(tmp_path)["m"]
    assert source.format == "h5" and source.problem == ""
    assert source.model_path == directory / "model.h5"


def sources(*versions: int) -> list[VersionSource]:
    """VersionSources of model 'm', newest first as scan returns them."""
    return [VersionSource("m", v, Path(f"/models/m/{v}"), "keras") for v in sorted(versions, reverse=True)]


def test_select_latest_lists_every_version_newest_first_and_keeps_latest() -> None:
    available = sources(1, 2, 3)
    candidates, keep = select_versions(available, ModelConfig(version_policy="latest", latest=2))
    assert [v.version for v in candidates] == [3, 2, 1]  # older ones are fallbacks if a newer fails to load
    assert keep == 2


def test_select_latest_default_keeps_one() -> None:
    candidates, keep = select_versions(sources(5, 7), ModelConfig())
    assert [v.version for v in candidates] == [7, 5] and keep == 1


def test_select_all_keeps_every_version() -> None:
    candidates, keep = select_versions(sources(1, 2, 3), ModelConfig(version_policy="all"))
    assert [v.version for v in candidates] == [3, 2, 1] and keep == 3


def test_select_specific_keeps_only_listed_versions_that_exist() -> None:
    config = ModelConfig(version_policy="specific", versions=(1, 3, 9))
    candidates, keep = select_versions(sources(1, 2, 3), config)
    assert [v.version for v in candidates] == [3, 1] and keep == 2


def test_select_on_no_versions_is_empty() -> None:
    for policy in ("latest", "all"):
        candidates, _ = select_versions([], ModelConfig(version_policy=policy))
        assert candidates == []
    assert select_versions([], ModelConfig(version_policy="specific", versions=(1,))) == ([], 0)


def test_select_does_not_alias_the_input_list() -> None:
    available = sources(1, 2)
    candidates, _ = select_versions(available, ModelConfig(version_policy="all"))
    candidates.pop()
    assert len(available) == 2


def test_a_model_with_a_base_path_is_read_there_beside_the_repository(tmp_path: Path) -> None:
    from server.config import parse_config
    from server.repository import model_dir

    (tmp_path / "repo" / "local" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "moved" / "1").mkdir(parents=True)  # shadowed: the base_path wins
    (tmp_path / "elsewhere" / "7").mkdir(parents=True)
    config = parse_config({"models": {"moved": {"base_path": str(tmp_path / "elsewhere")}}})
    found = scan(tmp_path / "repo", config)
    assert {name: [v.version for v in versions] for name, versions in found.items()} == {"local": [1], "moved": [7]}
    assert found["moved"][0].path == tmp_path / "elsewhere" / "7"
    assert {name: [v.version for v in versions] for name, versions in scan(None, config).items()} == {"moved": [7]}
    assert model_dir(None, config, "local") is None and model_dir(tmp_path, config, "local") == tmp_path / "local"
