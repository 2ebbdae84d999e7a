"""`python -m server payloads`: records of every worker's files, in arrival order, cut lines skipped."""

from __future__ import annotations

import json
from pathlib import Path

from server.cli.payloads import records


def line(request_id: str, time: str, model: str = "mlp") -> str:
    return json.dumps({"time": time, "request_id": request_id, "model": model}) + "\n"


def test_records_of_all_files_come_in_arrival_order(tmp_path: Path) -> None:
    (tmp_path / "payloads-h-1.jsonl.1").write_text(line("a", "2026-12-06T00:00:01.000Z") + line("c", "2026-12-06T00:00:03.000Z"))
    (tmp_path / "payloads-h-1.jsonl").write_text(line("e", "2026-12-06T00:00:05.000Z") + '{"time": "2026-12-06T00:0')
    (tmp_path / "payloads-h-2.jsonl").write_text(line("d", "2026-12-06T00:00:04.000Z", "cnn") + line("b", "2026-12-06T00:00:02.000Z"))
    (tmp_path / "notes.txt").write_text(line("x", "2026-12-06T00:00:00.000Z"))
    assert [r["request_id"] for r in records(tmp_path)] == ["a", "b", "c", "d", "e"]
    assert [r["request_id"] for r in records(tmp_path, model="cnn")] == ["d"]
    assert list(records(tmp_path / "missing")) == []
