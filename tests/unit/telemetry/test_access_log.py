"""server.telemetry.access_log: the buffered line is the one gunicorn's own formatter writes."""

from __future__ import annotations

import datetime
from pathlib import Path
from types import SimpleNamespace

from gunicorn.config import Config
from gunicorn.glogging import Logger

from server.telemetry.access_log import FORMAT, AccessLogger


def test_buffered_line_equals_gunicorns_and_reaches_the_file_on_flush(tmp_path: Path) -> None:
    log_file = tmp_path / "access.log"
    cfg = Config()
    cfg.set("accesslog", str(log_file))
    cfg.set("access_log_format", FORMAT)
    logger = AccessLogger(cfg)
    response = SimpleNamespace(
        status="200 OK", sent=152, headers=[("Content-Type", "application/json"), ("X-Request-Id", "abc-1"), ("X-Model-Version", "3")]
    )
    request = SimpleNamespace(headers=[("HOST", "x")])
    environ = {"REMOTE_ADDR": "127.0.0.1", "REQUEST_METHOD": "POST", "RAW_URI": "/v1/models/m:predict", "SERVER_PROTOCOL": "HTTP/1.1"}
    took = datetime.timedelta(milliseconds=12, microseconds=345)

    Logger.access(logger, response, request, environ, took)  # gunicorn's formatter, written at once
    expected = log_file.read_text().splitlines()
    logger.access(response, request, environ, took)
    assert log_file.read_text().splitlines() == expected  # buffered: nothing written yet
    logger.flush_access()
    lines = log_file.read_text().splitlines()
    assert lines == expected * 2
    assert lines[0] == '127.0.0.1 "POST /v1/models/m:predict HTTP/1.1" 200 152 12ms rid=abc-1 version=3'


def test_missing_headers_are_dashes_as_in_gunicorn(tmp_path: Path) -> None:
    log_file = tmp_path / "access.log"
    cfg = Config()
    cfg.set("accesslog", str(log_file))
    logger = AccessLogger(cfg)
    response = SimpleNamespace(status="404 NOT FOUND", sent=30, headers=[])
    environ = {"REMOTE_ADDR": "10.0.0.1", "REQUEST_METHOD": "GET", "RAW_URI": "/nope", "SERVER_PROTOCOL": "HTTP/1.1"}
    cfg.set("access_log_format", FORMAT)
    Logger.access(logger, response, SimpleNamespace(headers=[]), environ, datetime.timedelta(seconds=1))
    logger.access(response, SimpleNamespace(headers=[]), environ, datetime.timedelta(seconds=1))
    logger.flush_access()
    first, second = log_file.read_text().splitlines()
    assert first == second == '10.0.0.1 "GET /nope HTTP/1.1" 404 30 1000ms rid=- version=-'
