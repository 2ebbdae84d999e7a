"""The run directory's control files: a worker's request, the master's answer, the index; nothing else is taken for one."""

from __future__ import annotations

import os
from pathlib import Path

from server import control


def test_a_request_goes_to_the_master_and_its_answer_back_once(tmp_path: Path) -> None:
    request_id = control.ask(tmp_path, "load", "m", {"max_batch_size": 8})
    assert control.waiting(tmp_path, set()) and not control.waiting(tmp_path, {request_id})
    (request,) = control.pending(tmp_path)
    assert (request.id, request.action, request.model, request.override, request.pid) == (
        request_id, "load", "m", {"max_batch_size": 8}, os.getpid())
    assert control.take_answer(tmp_path, request_id) is None
    control.answer(tmp_path, request, True, "loaded 'm'", retiring=True)
    assert not control.waiting(tmp_path, set()) and control.pending(tmp_path) == []
    assert control.take_answer(tmp_path, request_id) == (True, "loaded 'm'", True)
    assert control.take_answer(tmp_path, request_id) is None  # taken once


def test_a_withdrawn_request_is_gone(tmp_path: Path) -> None:
    request_id = control.ask(tmp_path, "unload", "m", {})
    control.withdraw(tmp_path, request_id)
    assert control.pending(tmp_path) == []


def test_the_index_reads_back_and_is_empty_before_the_master_wrote_it(tmp_path: Path) -> None:
    assert control.read_index(tmp_path) == {}
    control.write_index(tmp_path, "explicit", {"m": {"state": control.READY, "reason": "", "versions": [1]}})
    assert control.read_index(tmp_path) == {"m": {"state": "READY", "reason": "", "versions": [1]}}
    (tmp_path / control.INDEX).write_text("[not an index]")
    assert control.read_index(tmp_path) == {}


def test_answers_nobody_took_are_dropped_when_stale_and_a_new_master_starts_clean(tmp_path: Path) -> None:
    request_id = control.ask(tmp_path, "load", "m", {})
    (request,) = control.pending(tmp_path)
    control.answer(tmp_path, request, True, "loaded 'm'")
    control.drop_stale_answers(tmp_path, 60)
    assert control.take_answer(tmp_path, request_id) is not None
    control.answer(tmp_path, request, True, "loaded 'm'")
    old = tmp_path / control.ANSWERS / f"{request_id}.json"
    os.utime(old, (0, 0))
    control.drop_stale_answers(tmp_path, 60)
    assert not old.exists()
    control.ask(tmp_path, "unload", "m", {})
    control.clear(tmp_path)
    assert control.pending(tmp_path) == [] and not (tmp_path / "control").exists()


def test_planted_entries_named_like_requests_are_removed_unread(tmp_path: Path) -> None:
    """A FIFO would block the master's read, a link to /dev/zero fill its memory, a directory never go."""
    requests = tmp_path / control.REQUESTS
    requests.mkdir(parents=True)
    names = [f"{i:020d}-1-0000000{i}.json" for i in range(4)]
    os.mkfifo(requests / names[0])
    (requests / names[1]).symlink_to("/dev/zero")
    (requests / names[2]).mkdir()
    (requests / names[3]).write_text('{"action": "load", "model": "m", "override": {}, "pid": 1, "pad": "'
                                     + "x" * control.MAX_FILE_BYTES + '"}')
    assert control.pending(tmp_path) == []
    assert list(requests.iterdir()) == []
    os.mkfifo(tmp_path / control.INDEX)
    assert control.read_index(tmp_path) == {}
