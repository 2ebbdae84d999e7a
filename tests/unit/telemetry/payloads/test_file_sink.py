"""The payload file sink against a hostile directory: planted links, FIFOs and other users' files are refused, modes set."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from server.cli.payloads import records
from server.telemetry.payloads import file_sink, record
from server.telemetry.payloads.file_sink import FileSink
from tests.unit.telemetry.payloads.test_writer import sampled


def sink_in(directory: Path, max_bytes: int = 1_000_000) -> FileSink:
    directory.mkdir(exist_ok=True)
    return FileSink(directory, max_bytes)


def test_a_planted_symlink_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_text("precious\n")
    sink = sink_in(tmp_path / "logs")
    sink.path.symlink_to(target)
    with pytest.raises(OSError, match="is a symbolic link"):
        sink.write(record.build(sampled("r1")))
    assert target.read_text() == "precious\n"
    sink.path.unlink()
    dangling = tmp_path / "nowhere"
    sink.path.symlink_to(dangling)  # O_CREAT would create the link's target
    with pytest.raises(OSError, match="is a symbolic link"):
        sink.write(record.build(sampled("r2")))
    assert not dangling.exists()


def test_a_symlink_swapped_in_while_writing_is_noticed_and_refused(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(file_sink, "RECHECK_S", 0.0)
    target = tmp_path / "victim"
    target.write_text("precious\n")
    sink = sink_in(tmp_path / "logs")
    sink.write(record.build(sampled("before")))
    sink.path.rename(tmp_path / "logs" / "shipped.jsonl")
    sink.path.symlink_to(target)
    with pytest.raises(OSError, match="is a symbolic link"):
        sink.write(record.build(sampled("after")))
    assert target.read_text() == "precious\n"


def test_a_precreated_file_of_ours_is_made_0600(tmp_path: Path) -> None:
    sink = sink_in(tmp_path / "logs")
    sink.path.write_text("")
    sink.path.chmod(0o644)
    sink.write(record.build(sampled("r1")))
    sink.close()
    assert stat.S_IMODE(sink.path.stat().st_mode) == 0o600
    assert [r["request_id"] for r in records(tmp_path / "logs")] == ["r1"]


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file of another user needs root")
def test_a_file_of_another_user_is_refused(tmp_path: Path) -> None:
    sink = sink_in(tmp_path / "logs")
    sink.path.write_text("theirs\n")
    sink.path.chmod(0o666)
    os.chown(sink.path, 65534, 65534)
    with pytest.raises(OSError, match="belongs to uid 65534"):
        sink.write(record.build(sampled("r1")))
    assert sink.path.read_text() == "theirs\n" and stat.S_IMODE(sink.path.stat().st_mode) == 0o666


def test_a_hard_link_and_a_fifo_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "our-other-file"
    other.write_text("ours\n")
    sink = sink_in(tmp_path / "logs")
    os.link(other, sink.path)
    with pytest.raises(OSError, match="2 hard links"):
        sink.write(record.build(sampled("r1")))
    assert other.read_text() == "ours\n"
    sink.path.unlink()
    os.mkfifo(sink.path)
    with pytest.raises(OSError):  # ENXIO: nobody reads it; never a hang
        sink.write(record.build(sampled("r2")))
    with open(os.open(sink.path, os.O_RDONLY | os.O_NONBLOCK), "rb") as reader:  # a reader: opens, then refused
        with pytest.raises(OSError, match="not a regular file"):
            sink.write(record.build(sampled("r3")))
        assert reader.read() in (b"", None)


def test_rotation_renames_a_planted_link_never_follows_it(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_text("precious\n")
    sink = sink_in(tmp_path / "logs", max_bytes=500)
    for number in range(1, file_sink.KEEP + 1):
        Path(f"{sink.path}.{number}").symlink_to(target)
    for number in range(40):
        sink.write(record.build(sampled(f"r{number}")))
    sink.close()
    assert target.read_text() == "precious\n"
    assert not any(Path(f"{sink.path}.{number}").is_symlink() for number in range(1, file_sink.KEEP + 1))
