"""forkserve's command line: `python -m server publish NAME SOURCE` and `python -m server reload`."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from server.publish import PublishError, publish
from server.settings import Settings


def _publish(args: argparse.Namespace) -> int:
    """Validate and publish; print the new version."""
    models = args.models or Settings.from_env().models_dir
    try:
        version = publish(args.name, args.source, models)
    except PublishError as exc:
        print(f"publish failed: {exc}", file=sys.stderr)
        return 1
    print(version)
    return 0


def _reload(args: argparse.Namespace) -> int:
    """SIGHUP to the master: a readiness-gated rolling restart of every worker."""
    if args.pid:
        pid = args.pid
    else:
        run_dir = Path(args.run_dir) if args.run_dir else Settings.from_env().run_dir
        try:
            pid = int((run_dir / "gunicorn.pid").read_text().strip())
        except (OSError, ValueError) as exc:
            print(f"reload failed: no master pid in {run_dir}/gunicorn.pid ({exc}); pass --pid or --run-dir", file=sys.stderr)
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
    parser = argparse.ArgumentParser(prog="python -m server", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    pub = commands.add_parser("publish", help="validate a model and publish it as the next version")
    pub.add_argument("name", help="model name")
    pub.add_argument("source", type=Path, help=".keras / .h5 / .hdf5 file or SavedModel directory")
    pub.add_argument("--models", type=Path, help="model repository (default: $FORKSERVE_MODELS or ./models)")
    pub.set_defaults(run=_publish)
    rel = commands.add_parser("reload", help="rolling restart of a running server's workers")
    rel.add_argument("--pid", type=int, help="the gunicorn master's pid")
    rel.add_argument("--run-dir", help="the server's FORKSERVE_RUN_DIR (holds gunicorn.pid)")
    rel.set_defaults(run=_reload)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
