"""forkserve's command line: `python -m server publish NAME SOURCE` and `python -m server reload`.

Runs in the caller's process, never with TensorFlow (publish validates in a child process).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from server.cli.publish import PublishError, publish
from server.cli.reload import reload
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


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one command."""
    parser = argparse.ArgumentParser(prog="python -m server", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    pub = commands.add_parser("publish", help="validate a model and publish it as the next version")
    pub.add_argument("name", help="model name")
    pub.add_argument("source", type=Path, help=".keras / .h5 / .hdf5 file, SavedModel directory, or a directory holding one model "
                                            "(file or SavedModel) with handler.py and its files")
    pub.add_argument("--models", type=Path, help="model repository (default: $FORKSERVE_MODELS or ./models)")
    pub.set_defaults(run=_publish)
    rel = commands.add_parser("reload", help="rolling restart of a running server's workers")
    rel.add_argument("--pid", type=int, help="the gunicorn master's pid (checked against its run directory)")
    rel.add_argument("--run-dir", help="the server's FORKSERVE_RUN_DIR (holds gunicorn.pid); "
                                       "default: $FORKSERVE_RUN_DIR, else the one running server found in $TMPDIR")
    rel.set_defaults(run=reload)
    args = parser.parse_args(argv)
    return args.run(args)
