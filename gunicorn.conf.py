"""gunicorn settings for forkserve: `gunicorn -c gunicorn.conf.py` from the repository root.

Command-line flags override these (`-b 127.0.0.1:PORT`, `-w N`). This file runs in the master:
it must not import tensorflow or keras, directly or through what it imports.
"""

from server.run_dir import RunDirError
from server.settings import Settings

try:
    _settings = Settings.current()  # a malformed FORKSERVE_* variable is a ValueError naming it
    _settings.export()  # NOTE: before the hooks import prometheus_client (multiprocess mode)
except (RunDirError, ValueError) as exc:  # one line, not gunicorn's "Failed to read config file" and a traceback
    raise SystemExit(f"forkserve: cannot start: {exc}") from None

import ssl as _ssl  # noqa: E402

from server import tls  # noqa: E402
from server.master import hooks as master  # noqa: E402
from server.telemetry.access_log import FORMAT  # noqa: E402
from server.worker import hooks as worker  # noqa: E402

wsgi_app = "server.http.app:create_app()"
bind = [_settings.bind]
workers = _settings.workers
worker_class = "server.worker.gthread.ForkserveWorker"  # gthread that leaves Ctrl-C to the master
threads = _settings.threads
preload_app = False  # NOTE: True would import the app, and with it TensorFlow, in the master
timeout = 30  # heartbeat (kept during model loads up to FORKSERVE_BOOT_TIMEOUT); requests have their own deadline
graceful_timeout = 30
keepalive = 75  # above nginx's upstream keepalive_timeout (60 s) so nginx closes first
control_socket_disable = True  # several instances on one host would share ~/.gunicorn/gunicorn.ctl
pidfile = str(_settings.run_dir / "gunicorn.pid")  # `python -m server reload` signals this pid
loglevel = _settings.log_level
accesslog = "-" if _settings.access_log else None
access_log_format = FORMAT
logger_class = "server.telemetry.access_log.AccessLogger"  # writes access lines in bulk (see its docstring)
if _settings.tls:  # FORKSERVE_TLS_*: HTTPS on REST (gRPC: server.rpc.tls); the master checks the files in on_starting
    certfile = str(_settings.tls_cert)
    keyfile = str(_settings.tls_key)
    ca_certs = str(_settings.tls_client_ca) if _settings.tls_client_ca else None
    cert_reqs = _ssl.CERT_REQUIRED if _settings.tls_client_ca else _ssl.CERT_NONE
    ssl_context = tls.gunicorn_ssl_context  # NOTE: the context the master built once, not gunicorn's per connection

# Hooks run in the master (the arbiter) ...
on_starting = master.on_starting
when_ready = master.when_ready
pre_fork = master.pre_fork
child_exit = master.child_exit
on_exit = master.on_exit
# ... and in each worker, after fork.
post_fork = worker.post_fork
post_worker_init = worker.post_worker_init
worker_exit = worker.worker_exit
