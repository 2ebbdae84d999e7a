"""forkserve's command line: `python -m server publish NAME SOURCE`, `validate`, `reload`, `payloads` and `tfserving FLAGS`.

Runs in the caller's process, never with TensorFlow (publish and validate check in a child process).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from server.cli.publish import PublishError, default_conf, next_version, publish, source_kind
from server.cli.reload import reload
from server.cli.validate import ValidationFailed, model_settings, run_in_child
from server.settings import Settings


def _report_to_stderr(command: str) -> None:
    """publish's warnings and notes as `<command>: ...` lines on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{command}: %(message)s"))
    logger = logging.getLogger("forkserve.publish")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _warn_about_a_missing_conf(args: argparse.Namespace, command: str) -> None:
    """A --conf that names no file: checked with the defaults, as the server would, but likely a typo or a missing mount."""
    if args.conf is not None and not args.conf.exists():
        print(f"{command}: warning: {args.conf} does not exist: checking with the default settings", file=sys.stderr)


def _models(args: argparse.Namespace) -> Path:
    models = args.models or Settings.from_env().models_dir
    if models is None:
        raise PublishError("no model repository: give --models DIR (FORKSERVE_MODELS is empty)")
    return models.resolve()


def _publish(args: argparse.Namespace) -> int:
    """Validate and publish; print the new version (stdout) and where it went (stderr).

    Every failure is one line, `publish failed: <reason>`, and exit status 1.
    """
    _report_to_stderr("publish")
    _warn_about_a_missing_conf(args, "publish")
    try:
        models = _models(args)
        version = publish(args.name, args.source, models, conf=args.conf, change_request_shape=args.change_request_shape)
    except PublishError as exc:
        return _failed("publish failed", str(exc))
    except KeyboardInterrupt:
        return _failed("publish failed", "interrupted")
    except Exception as exc:  # NOTE: the promise is one line whatever happens, never a traceback
        return _failed("publish failed", f"{type(exc).__name__}: {exc}")
    print(f"published {args.name} version {version} in {models / args.name / str(version)}", file=sys.stderr)
    print(version)
    return 0


def _validate(args: argparse.Namespace) -> int:
    """Check SOURCE as the next version of NAME without publishing; always print the verdict."""
    _report_to_stderr("validate")
    _warn_about_a_missing_conf(args, "validate")
    try:
        source = args.source.resolve()
        source_kind(source)
        conf = (args.conf or default_conf()).resolve()
        verdict = run_in_child(source, args.name, model_settings(args.name, conf), next_version(_models(args) / args.name), conf)
    except (PublishError, ValidationFailed) as exc:
        return _failed("validate", str(exc))
    except KeyboardInterrupt:
        return _failed("validate", "interrupted")
    except Exception as exc:
        return _failed("validate", f"{type(exc).__name__}: {exc}")
    for warning in verdict["warnings"]:
        print(f"validate: warning: {warning}", file=sys.stderr)
    print(json.dumps({key: verdict.get(key) for key in ("format", "signatures", "handler", "warmup_records")}))
    print(f"validate: {source} is valid as the next version of {args.name} (settings from {conf})", file=sys.stderr)
    return 0


def _failed(prefix: str, reason: str) -> int:
    print(f"{prefix}: {' '.join(reason.split())}", file=sys.stderr)
    return 1


def _source_and_settings(command: argparse.ArgumentParser) -> None:
    """The arguments publish and validate share."""
    command.add_argument("name", help="model name")
    command.add_argument("source", type=Path, help=".keras / .h5 / .hdf5 file, SavedModel directory, or a directory "
                                                   "holding one model (file or SavedModel) with handler.py and its files")
    command.add_argument("--models", type=Path, help="model repository (default: $FORKSERVE_MODELS or ./models)")
    command.add_argument("--conf", type=Path, help="the server's per-model settings, which the check applies "
                                                   "(default: $FORKSERVE_CONF or ./conf/models.toml)")


def _payloads(args: argparse.Namespace) -> int:
    from server.cli.payloads import records, write_table

    if not args.directory.is_dir():
        print(f"payloads: {args.directory} is not a directory", file=sys.stderr)
        return 2
    count = write_table(records(args.directory, args.model), sys.stdout, args.format)
    print(f"payloads: {count} records", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run one command."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["tfserving"]:  # NOTE: TF Serving's flags (--name=value), not argparse's: server.cli.tfserving parses them
        from server.cli.tfserving import main as tfserving

        return tfserving(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m server", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    pub = commands.add_parser("publish", help="validate a model and publish it as the next version")
    _source_and_settings(pub)
    pub.add_argument("--change-request-shape", action="store_true",
                     help="publish even though the newest version has a handler.py and this one has none, or the reverse "
                          "(the clients of the old request shape get 400 once it is served)")
    pub.set_defaults(run=_publish)
    val = commands.add_parser("validate", help="check a model as publish would, without publishing it")
    _source_and_settings(val)
    val.set_defaults(run=_validate)
    rel = commands.add_parser("reload", help="rolling restart of a running server's workers")
    rel.add_argument("--pid", type=int, help="the gunicorn master's pid (checked against its run directory)")
    rel.add_argument("--run-dir", help="the server's FORKSERVE_RUN_DIR (holds gunicorn.pid); "
                                       "default: $FORKSERVE_RUN_DIR, else the one running server found in $TMPDIR")
    rel.set_defaults(run=reload)
    pay = commands.add_parser("payloads", help="the payload log's files as one table (CSV or JSON lines) on stdout")
    pay.add_argument("directory", type=Path, help="the DIR of FORKSERVE_PAYLOAD_LOG=file:DIR")
    pay.add_argument("--format", choices=("csv", "jsonl"), default="csv", help="csv (nested values as JSON text) or jsonl")
    pay.add_argument("--model", help="only this model's records")
    pay.set_defaults(run=_payloads)
    commands.add_parser("tfserving", help="start the server with tensorflow_model_server's flags (--port=8500 ...)",
                        add_help=False)
    args = parser.parse_args(argv)
    return args.run(args)
