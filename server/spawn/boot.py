"""A new worker's first steps after fork, from the master's fork or the zygote's (server.spawn.zygote).

This is the child half of gunicorn 27's `Arbiter.spawn_worker`, copied so that a worker the zygote
forked boots exactly as one the master forked (server/compat.py lists it). Runs in the new worker;
the master imports this module, so no TensorFlow here.
"""

from __future__ import annotations

import os
import socket
import sys
import traceback
from typing import Any, NoReturn

from gunicorn import sock, util
from gunicorn.errors import AppImportError


def run_worker(arbiter: Any, worker: Any) -> NoReturn:
    """Boot and run `worker` in this process until it exits; never returns into the code that forked it."""
    try:
        _boot(arbiter, worker)
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # NOTE: never unwind into the zygote's loop or the master's: this process ends here
        code = 1
    status = 0 if code is None else code if isinstance(code, int) else 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:  # NOTE: a closed or broken stdout must not unwind this worker into the master's loop
        os._exit(status & 0xFF)


def _boot(arbiter: Any, worker: Any) -> None:
    """gunicorn's spawn_worker after its fork, line for line: the hooks see the exit in flight (worker_exit)."""
    worker.pid = os.getpid()
    try:
        util._setproctitle("worker [%s]" % arbiter.proc_name)
        arbiter.log.info("Booting worker with pid: %s", worker.pid)
        if arbiter.cfg.reuse_port and hasattr(socket, "SO_REUSEPORT"):
            worker.sockets = sock.create_sockets(arbiter.cfg, arbiter.log)
        arbiter.cfg.post_fork(arbiter, worker)
        worker.init_process()
        sys.exit(0)
    except SystemExit:
        raise
    except AppImportError as exc:
        arbiter.log.debug("Exception while loading the application", exc_info=True)
        print("%s" % exc, file=sys.stderr)
        sys.stderr.flush()
        sys.exit(arbiter.APP_LOAD_ERROR)
    except Exception as exc:
        arbiter.log.exception("Exception in worker process")
        print("%s" % exc, file=sys.stderr)
        sys.stderr.flush()
        if not worker.booted:
            sys.exit(arbiter.WORKER_BOOT_ERROR)
        sys.exit(-1)
    finally:
        arbiter.log.info("Worker exiting (pid: %s)", worker.pid)
        try:
            worker.tmp.close()
            arbiter.cfg.worker_exit(arbiter, worker)
        except Exception:
            arbiter.log.warning("Exception during worker exit:\n%s", traceback.format_exc())
