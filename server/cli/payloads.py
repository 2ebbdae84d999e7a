"""`python -m server payloads DIR`: the payload log's files (rotated ones too) as one table, CSV or JSON lines (no TensorFlow)."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

COLUMNS = ("time", "request_id", "trace_id", "model", "version", "api", "protocol", "status", "latency_ms",
           "inputs", "outputs", "error", "redact_error")
FILE_RE = re.compile(r"payloads-.+\.jsonl(?:\.([0-9]+))?")


def log_files(directory: Path) -> list[Path]:
    """Every worker's file and its rotated ones, oldest first within a worker (.5 .. .1, then the live one)."""
    if not directory.is_dir():
        return []
    found = [path for path in directory.iterdir() if FILE_RE.fullmatch(path.name)]
    return sorted(found, key=lambda path: (path.name.split(".jsonl")[0], -int(FILE_RE.fullmatch(path.name)[1] or 0)))


def records(directory: Path, model: str | None = None) -> Iterator[dict[str, Any]]:
    """The records in arrival-time order; a line a full disk cut short is skipped."""
    found = []
    for path in log_files(directory):
        with open(path, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(record, dict) and (model is None or record.get("model") == model):
                    found.append(record)
    found.sort(key=lambda record: str(record.get("time", "")))
    yield from found


def write_table(rows: Iterator[dict[str, Any]], out: TextIO, form: str) -> int:
    """Write `rows` as CSV (nested values as JSON text) or JSON lines; returns how many."""
    count = 0
    writer = csv.DictWriter(out, COLUMNS, extrasaction="ignore") if form == "csv" else None
    if writer is not None:
        writer.writeheader()
    for row in rows:
        if writer is None:
            out.write(json.dumps(row, separators=(",", ":")) + "\n")
        else:
            writer.writerow({key: _cell(row.get(key)) for key in COLUMNS})
        count += 1
    return count


def _cell(value: Any) -> Any:
    """A CSV cell: nested values as compact JSON, None as empty."""
    if value is None:
        return ""
    return json.dumps(value, separators=(",", ":")) if isinstance(value, dict | list) else value
