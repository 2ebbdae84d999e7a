"""forkserve's command line: `python -m server publish NAME SOURCE` and `python -m server reload`.

Runs in the caller's process, never with TensorFlow (publish validates in a child process).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from pathlib import Path

from server.publish import PublishError, publish
from server.settings import Settings


def _publish(args: argparse.Namespace) -> int:
    """Validate and publish; print the new version (stdout) and where it went (stderr)."""
    models = (args.models or Settings.from_env().models_dir).resolve()
    try:
        version = publish(args.name, args.source, models)
    except PublishError as exc:
        print(f"publish failed: {exc}", file=sys.stderr)
        return 1
    print(f"published {args.name} version {version} in {models / args.name / str(version)}", file=sys.stderr)
    print(version)
    return 0


def _is_master(pid: int) -> bool:
    """True when `pid` is a running gunicorn process (the only thing a reload may signal)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(part.endswith(b"gunicorn") or b"gunicorn/" in part for part in command)


def _recorded_pid(run_dir: Path) -> int | None:
    """The master pid a run directory records, if that master still runs."""
    try:
        pid = int((run_dir / "gunicorn.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _is_master(pid) else None


def running_masters(run_dir: str | None) -> dict[Path, int]:
    """Running forkserve masters by run directory: the one given, $FORKSERVE_RUN_DIR, or every $TMPDIR/forkserve-*."""
    given = run_dir or os.environ.get("FORKSERVE_RUN_DIR")
    candidates = [Path(given)] if given else sorted(Path(tempfile.gettempdir()).glob("forkserve-*"))
    found = {}
    for directory in candidates:
        pid = _recorded_pid(directory)
        if pid is not None:
            found[directory] = pid
    return found


def _reload(args: argparse.Namespace) -> int:
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


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one command."""
    parser = argparse.ArgumentParser(prog="python -m server", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    pub = commands.add_parser("publish", help="validate a model and publish it as the next version")
    pub.add_argument("name", help="model name")
    pub.add_argument("source", type=Path, help=".keras / .h5 / .hdf5 file or SavedModel directory")
    pub.add_argument("--models", type=Path, help="model repository (default: $FORKSERVE_MODELS or ./models)")
    pub.set_defaults(run=_publish)
    rel = commands.add_parser("reload", help="rolling restart of a running server's workers")
    rel.add_argument("--pid", type=int, help="the gunicorn master's pid (checked against its run directory)")
    rel.add_argument("--run-dir", help="the server's FORKSERVE_RUN_DIR (holds gunicorn.pid); "
                                       "default: $FORKSERVE_RUN_DIR, else the one running server found in $TMPDIR")
    rel.set_defaults(run=_reload)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
