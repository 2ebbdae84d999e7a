"""`python -m server payloads DIR`: the payload log's files (rotated ones too) as one table, CSV or JSON lines (no TensorFlow)."""

from __future__ import annotations

import contextlib
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
    """The records in arrival-time order; a line a full disk cut short is skipped.

    Two passes, so memory holds an index entry per record, not the records (a worker keeps up to
    6 x FORKSERVE_PAYLOAD_LOG_MAX_MB): read every line for its time, sort, then read each again.
    """
    with contextlib.ExitStack() as stack:
        opened = [stack.enter_context(open(path, "rb")) for path in log_files(directory)]
        index: list[tuple[str, int, int]] = []  # (time, file, offset)
        for number, lines in enumerate(opened):
            offset = 0
            for line in lines:
                record = _parsed(line)
                if record is not None and (model is None or record.get("model") == model):
                    index.append((str(record.get("time", "")), number, offset))
                offset += len(line)
        index.sort()
        for _, number, offset in index:
            opened[number].seek(offset)
            record = _parsed(opened[number].readline())
            if record is not None:
                yield record


def _parsed(line: bytes) -> dict[str, Any] | None:
    """One line's record; None for a line that is not one (cut short, not JSON, not an object)."""
    try:
        record = json.loads(line.decode("utf-8", "replace"))
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


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
