"""Which version directories count as settled: new ones wait, settled ones stay, changes are reported once."""

from __future__ import annotations

import os
from pathlib import Path

from server.master.scanner import SettledScanner, read_files
from server.repository import VersionSource


def version(models: Path, name: str, number: int, data: bytes = b"weights") -> Path:
    directory = models / name / str(number)
    directory.mkdir(parents=True)
    (directory / "model.keras").write_bytes(data)
    return directory


def versions(found: dict[str, list[VersionSource]]) -> dict[str, list[int]]:
    return {name: [s.version for s in sources] for name, sources in found.items()}


def test_the_first_scan_trusts_everything_and_later_ones_wait_one_poll(tmp_path: Path) -> None:
    version(tmp_path, "a", 1)
    scanner = SettledScanner(tmp_path)
    assert versions(scanner.scan(trust_all=True)) == {"a": [1]}
    version(tmp_path, "a", 2)
    assert versions(scanner.scan()) == {"a": [1]}  # seen once: not settled yet
    assert versions(scanner.scan()) == {"a": [2, 1]}


def test_a_directory_still_being_written_is_not_settled(tmp_path: Path) -> None:
    version(tmp_path, "a", 1)
    scanner = SettledScanner(tmp_path)
    scanner.scan(trust_all=True)
    growing = version(tmp_path, "a", 2, b"x")
    for size in range(2, 6):
        (growing / "model.keras").write_bytes(b"x" * size)
        assert versions(scanner.scan()) == {"a": [1]}
    assert versions(scanner.scan()) == {"a": [2, 1]}


def test_a_new_model_whose_only_version_is_changing_is_left_out(tmp_path: Path) -> None:
    scanner = SettledScanner(tmp_path)
    scanner.scan(trust_all=True)
    version(tmp_path, "b", 1)
    assert versions(scanner.scan()) == {}
    assert versions(scanner.scan()) == {"b": [1]}


def test_touch_and_identical_rewrites_keep_a_settled_version_without_a_report(tmp_path: Path) -> None:
    directory = version(tmp_path, "a", 1)
    reports: list[tuple[int, str]] = []
    scanner = SettledScanner(tmp_path, lambda source, what: reports.append((source.version, what)) or False)
    scanner.scan(trust_all=True)
    os.utime(directory / "model.keras", (1, 1))
    assert versions(scanner.scan()) == {"a": [1]}
    (directory / "model.keras").write_bytes(b"weights")  # same bytes, new mtime
    assert versions(scanner.scan()) == {"a": [1]}
    assert reports == []


def test_a_real_change_of_a_settled_version_is_reported_once_and_it_stays(tmp_path: Path) -> None:
    directory = version(tmp_path, "a", 1)
    reports: list[tuple[int, str]] = []
    scanner = SettledScanner(tmp_path, lambda source, what: reports.append((source.version, what)) or False)
    scanner.scan(trust_all=True)
    (directory / "model.keras").write_bytes(b"other weights")
    (directory / "assets.txt").write_text("labels")
    for _ in range(3):
        assert versions(scanner.scan()) == {"a": [1]}
    assert reports == [(1, "added assets.txt; resized model.keras")]


def test_a_change_the_callback_asks_to_resettle_waits_again(tmp_path: Path) -> None:
    directory = version(tmp_path, "a", 2)
    version(tmp_path, "a", 1)
    scanner = SettledScanner(tmp_path, lambda source, what: True)  # as for a failed version
    scanner.scan(trust_all=True)
    (directory / "model.keras").write_bytes(b"the rest of the copy")
    assert versions(scanner.scan()) == {"a": [1]}
    assert versions(scanner.scan()) == {"a": [2, 1]}


def test_content_keys_ignore_mtimes_but_not_sizes(tmp_path: Path) -> None:
    directory = version(tmp_path, "a", 1)
    key = read_files(directory).key
    os.utime(directory / "model.keras", (1, 1))
    assert read_files(directory).key == key
    (directory / "model.keras").write_bytes(b"weights!")
    assert read_files(directory).key != key
    scanner = SettledScanner(tmp_path)
    scanner.scan(trust_all=True)
    assert scanner.content_key(directory) == read_files(directory).key and scanner.content_key(tmp_path) == ""


def test_the_content_digest_reads_bytes_but_never_blocks_on_a_fifo(tmp_path: Path) -> None:
    directory = version(tmp_path, "a", 1, b"weights")
    scanner = SettledScanner(tmp_path)
    scanner.scan(trust_all=True)
    first = scanner.content_digest(directory)
    (directory / "model.keras").write_bytes(b"Weights")  # same name and size, other bytes
    scanner.scan()
    assert scanner.content_digest(directory) != first
    os.mkfifo(directory / "variables.index")  # a load would block on it; the master's digest must not
    scanner.scan()
    assert len(scanner.content_digest(directory)) == 16


def test_without_new_versions_each_model_keeps_the_versions_it_had_when_first_seen(tmp_path: Path) -> None:
    version(tmp_path, "a", 1)
    scanner = SettledScanner(tmp_path, new_versions=False)  # TF Serving's --file_system_poll_wait_seconds=0
    assert versions(scanner.scan(trust_all=True)) == {"a": [1]}
    version(tmp_path, "a", 2)
    version(tmp_path, "b", 5)
    scanner.scan()
    assert versions(scanner.scan()) == {"a": [1], "b": [5]}  # a model seen later: its versions then


def test_a_digest_reads_no_more_than_the_size_the_poll_saw() -> None:
    """/proc's files say 0 bytes and never end (pagemap: 256 GiB of zeros): the master's thread must not read them."""
    from server.master.scanner import DirectoryFiles, digest_files

    files = DirectoryFiles((("pagemap", 0), ("status", 0)), (0, 0))
    assert len(digest_files(Path("/proc/self"), files)) == 16  # at once: with no bound it reads for hours
