"""gunicorn's logger with a cheaper access log: one line per request, formatted directly and written in bulk.

Runs in every process (gunicorn's `logger_class`); only workers write access lines. gunicorn's
own access() builds a dict of every header and formats through a case-insensitive wrapper,
then writes one line per request under the handler's lock, a measurable CPU cost per request
(bench/results/code-notes.md#access-log). Here a request appends its line to a deque and a
flusher thread writes what is there every FLUSH_INTERVAL_S in one write (as nginx's
`access_log ... buffer= flush=`). The worker_exit hook flushes the rest.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

from gunicorn.glogging import Logger

from server.telemetry.flusher import Flusher

FLUSH_INTERVAL_S = 0.5
# The line FORMAT produces, built without gunicorn's atoms; any other access_log_format is left to gunicorn.
FORMAT = '%(h)s "%(r)s" %(s)s %(B)s %(M)sms rid=%({x-request-id}o)s version=%({x-model-version}o)s'


class AccessLogger(Logger):
    """gunicorn.glogging.Logger whose access() buffers lines in FORMAT."""

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self._lines: collections.deque[str] = collections.deque()
        self._flushing = threading.Lock()
        # One record of many lines suits a plain stream; logconfig or syslog handlers want one record per line.
        self._one_record = not (cfg.logconfig or cfg.logconfig_dict or cfg.logconfig_json or cfg.syslog)
        self._flusher = Flusher("access-log-flusher", self.flush_access, FLUSH_INTERVAL_S)

    def access(self, resp: Any, req: Any, environ: dict, request_time: Any) -> None:
        """Queue one line for the request (gunicorn calls this after the response is sent)."""
        if not self.access_log_enabled:
            return
        if self.cfg.access_log_format != FORMAT:
            super().access(resp, req, environ, request_time)
            return
        request_id = version = "-"
        trace_id = ""
        for name, value in resp.headers:
            lowered = name.lower()
            if lowered == "x-request-id":
                request_id = value
            elif lowered == "x-model-version":
                version = value
            elif lowered == "x-trace-id":  # only when tracing is on (server.telemetry.tracing)
                trace_id = f" trace={value}"
        status = resp.status.split(None, 1)[0] if isinstance(resp.status, str) else resp.status
        milliseconds = request_time.seconds * 1000 + request_time.microseconds // 1000
        self._lines.append(
            f'{environ.get("REMOTE_ADDR", "-")} "{environ["REQUEST_METHOD"]} {environ["RAW_URI"]} '
            f'{environ["SERVER_PROTOCOL"]}" {status} {getattr(resp, "sent", None)} {milliseconds}ms '
            f"rid={request_id} version={version}{trace_id}"
        )
        self._flusher.ensure_started()

    def access_line(self, line: str) -> None:
        """Queue a line made elsewhere (the gRPC server's calls, server.rpc.calls), in FORMAT's shape."""
        if self.access_log_enabled:
            self._lines.append(line)
            self._flusher.ensure_started()

    def flush_access(self) -> None:
        """Write every queued line (in one log record for a plain stream)."""
        with self._flushing:
            lines = [self._lines.popleft() for _ in range(len(self._lines))]
            if lines:
                try:
                    for record in ["\n".join(lines)] if self._one_record else lines:
                        self.access_log.info(record)
                except Exception:  # as gunicorn's access(): a logging failure must not fail requests
                    self.exception("access log write failed")
