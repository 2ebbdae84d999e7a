"""`python -m server reload`: find the running server's master and ask it for a rolling restart (caller's process)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from server import run_dir as run_directory
from server.settings import given_run_dir


def _is_master(pid: int) -> bool:
    """True when `pid` is a running gunicorn process (the only thing a reload may signal)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(part.endswith(b"gunicorn") or b"gunicorn/" in part for part in command)


def _recorded_pid(run_dir: Path) -> int | None:
    """The master pid a run directory records, if this user wrote the pid file (no symlink) and that master still runs."""
    pid_file = run_dir / "gunicorn.pid"
    pid = run_directory.trusted_pid(pid_file)
    if pid is None and os.path.lexists(pid_file):
        print(f"reload: ignoring {pid_file}: not a pid file this user wrote (a symlink, another user's file, "
              "or no pid in it)", file=sys.stderr)
    return pid if pid is not None and _is_master(pid) else None


def running_masters(run_dir: str | None) -> dict[Path, int]:
    """Running forkserve masters by run directory: the one given, $FORKSERVE_RUN_DIR, or this user's $TMPDIR/forkserve-*."""
    given = run_dir or given_run_dir()
    candidates = [Path(given)] if given else run_directory.candidates()
    found = {}
    for directory in candidates:
        pid = _recorded_pid(directory)
        if pid is not None:
            found[directory] = pid
    return found


def reload(args: argparse.Namespace) -> int:
    """SIGHUP to the master: a readiness-gated rolling restart of every worker."""
    masters = running_masters(args.run_dir)
    if args.pid:
        if args.pid not in masters.values():
            print(f"reload failed: pid {args.pid} is not a running forkserve master (none of "
                  f"{', '.join(map(str, masters)) or 'the run directories found'} records it); "
                  "pass --run-dir with the master's FORKSERVE_RUN_DIR", file=sys.stderr)
            return 1
        pid = args.pid
    elif len(masters) == 1:
        (pid,) = masters.values()
    else:
        where = "; ".join(f"--run-dir {d} (master {p})" for d, p in masters.items())
        print(("reload failed: several forkserve servers run; choose one: " + where) if masters else
              "reload failed: no running forkserve master found (its run directory, logged at start as "
              "'forkserve: run directory ...', holds gunicorn.pid); pass --run-dir", file=sys.stderr)
        return 1
    try:
        os.kill(pid, signal.SIGHUP)
    except OSError as exc:
        print(f"reload failed: cannot signal master {pid}: {exc}", file=sys.stderr)
        return 1
    print(f"rolling restart requested from master {pid}")
    return 0
