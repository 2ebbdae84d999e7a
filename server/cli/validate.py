"""Checking a version as a worker loads it, in a child process: `python -m server.cli.validate PATH`.

The child loads the model (safe_mode) and the version's handler with the model's settings from
conf/models.toml (passed as JSON by the parent), warms every batch bucket those settings give and
runs the handler's example, as a worker's load does (server.models.registry). Whatever the model
or the handler raises, BaseException included (a handler's `SystemExit(3)`), it ends with one JSON
verdict line on its stdout, `{"valid": true, "format", "signatures", "handler", "warnings"}` or
`{"valid": false, "reason"}`, and the same verdict as one line on stderr. Its stdout carries that
line alone (whatever else is printed there goes to stderr), so the parent reads the verdict and
drops TensorFlow's and absl's log lines. `run_in_child` is the parent's side (publish and
`python -m server validate`); it imports no TensorFlow, the child does.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, TextIO

from server.config import ConfigError, ModelConfig, as_table, load_config, parse_config
from server.repository import VersionSource, detect_format

NO_EXAMPLE_WARNING = (
    "handler.py has no example, so preprocess, the model call and postprocess were not checked; "
    "set Handler.example to a request body (a class attribute, or in setup) to have publish and warm-up run it"
)


class ValidationFailed(Exception):
    """The version would fail in the server; the message is the one-line reason."""


def model_settings(name: str, conf: Path) -> ModelConfig:
    """The settings the server applies to model `name` (conf/models.toml, or defaults without one)."""
    try:
        return load_config(conf).for_model(name)
    except ConfigError as exc:
        raise ValidationFailed(f"{exc} (the settings the server would apply to {name})") from None


def run_in_child(source: Path, name: str, config: ModelConfig, version: int, conf: Path, timeout: float = 600.0) -> dict[str, Any]:
    """The child's verdict on `source` as version `version` of `name`; ValidationFailed with its reason."""
    command = [sys.executable, "-m", "server.cli.validate", str(source), "--model", name, "--version", str(version),
               "--settings", json.dumps(as_table(config))]
    # NOTE: FORKSERVE_CONF names the file the settings came from, in reasons the worker's code gives.
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "FORKSERVE_CONF": str(conf)}
    try:
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise ValidationFailed(f"{source}: validation did not finish within {timeout:.0f}s") from None
    verdict = _verdict_of(done.stdout)
    if verdict is None:
        raise ValidationFailed(
            f"{source}: validation ended without a verdict ({_exit_status(done.returncode)}); "
            f"`python -m server.cli.validate {source} --model {name} --conf {conf}` shows its output"
        )
    if not verdict["valid"]:
        raise ValidationFailed(f"{source}: invalid model: {verdict['reason']}")
    return verdict


def _verdict_of(stdout: str) -> dict[str, Any] | None:
    """The child's verdict: the last line of its stdout, when it is one."""
    lines = stdout.strip().splitlines()
    try:
        verdict = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return verdict if isinstance(verdict, dict) and isinstance(verdict.get("valid"), bool) else None


def _exit_status(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


# --- the child ---------------------------------------------------------------------------------

def source_for(path: Path, name: str, version: int) -> VersionSource:
    """A VersionSource for a loose file or directory, as if it were version `version` of `name`."""
    if path.is_file():
        fmt = "keras" if path.suffix.lower() == ".keras" else "h5"
        return VersionSource(name, version, path.parent, fmt, problem="", file=path)
    fmt, problem = detect_format(path)
    return VersionSource(name, version, path, fmt, problem)


def _one_line(text: str) -> str:
    return " ".join(text.split())[:2000]


def check(source: VersionSource, config: ModelConfig) -> dict[str, Any]:
    """Load, warm and run the example as a worker does; the verdict, whatever the model or handler raises."""
    from server.models.handlers import HandlerError, check_example

    stage = "model"
    try:
        from server.models import (
            runtime,  # NOTE: TensorFlow's import, inside: a broken install is a verdict too
            warmup_records,
        )
        from server.models.registry import ModelVersion, load_version_handler

        servable = runtime.load_servable(source)
        stage = "handler"
        # NOTE: the registry's own rule (a handler.py needs `handler = true`), so publish gives its reason.
        handler = None if source.file is not None else load_version_handler(ModelVersion(source, config))
        stage = "warm-up"
        servable.warm_up(config.batch_buckets)
        stage = "warm-up records"
        records = warmup_records.replay(source, config, servable)
        stage = "example"
        if handler is not None:
            check_example(handler, servable.signatures, config, servable.run)
    except HandlerError as exc:
        return {"valid": False, "reason": _one_line(f"handler: {exc}")}
    except warmup_records.WarmupRecordFailed as exc:
        return {"valid": False, "reason": _one_line(f"warm-up records: {exc}")}
    except BaseException as exc:  # NOTE: SystemExit and KeyboardInterrupt from a handler are verdicts too
        # (server.models.handlers turns what a handler raises into a HandlerError with its handler.py
        # line; this is the net under it, so that no exception can leave the child without a verdict.)
        raised = f"{type(exc).__name__}{': ' if str(exc) else ''}{exc}"
        reason = {
            "handler": f"handler: Handler setup failed: {raised}",  # the import catches everything itself
            "warm-up": f"warm-up at the batch sizes {config.batch_buckets} failed: {raised}",
            "example": f"handler: Handler.example failed: {raised}",
        }.get(stage, raised)
        return {"valid": False, "reason": _one_line(reason)}
    signatures = {name: {"method": s.method, "inputs": list(s.inputs), "outputs": list(s.outputs)}
                  for name, s in servable.signatures.items()}
    warnings = [NO_EXAMPLE_WARNING] if handler is not None and handler.example is None else []
    return {"valid": True, "format": servable.platform, "signatures": signatures,
            "handler": handler.describe() if handler is not None else None, "warnings": warnings,
            "warmup_records": records}


def _verdict_stream() -> TextIO:
    """The real stdout, for the verdict alone; fd 1 becomes stderr for whatever else prints there."""
    sys.stdout.flush()
    verdict = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return verdict


def main(argv: list[str]) -> int:
    """Check argv's PATH; print the verdict (stdout: JSON, stderr: one line); 0 valid, 2 invalid."""
    parser = argparse.ArgumentParser(prog="python -m server.cli.validate", description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--model", default="candidate", help="the model's name (default: candidate)")
    parser.add_argument("--version", type=int, default=1, help="the version number it would get (default: 1)")
    settings = parser.add_mutually_exclusive_group()
    settings.add_argument("--settings", default="{}", help="the model's settings as JSON (what publish passes; default: every default)")
    settings.add_argument("--conf", type=Path, help="read the model's settings from this conf/models.toml instead")
    args = parser.parse_args(argv)
    out = _verdict_stream()
    try:
        if args.conf is not None:
            config = model_settings(args.model, args.conf)
        else:
            config = parse_config({"models": {args.model: json.loads(args.settings)}}).for_model(args.model)
        verdict = check(source_for(args.path, args.model, args.version), config)
    except (ValueError, ConfigError, ValidationFailed) as exc:
        verdict = {"valid": False, "reason": _one_line(f"settings: {exc}")}
    print(json.dumps(verdict), file=out, flush=True)
    for warning in verdict.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    print("valid" if verdict["valid"] else f"invalid model: {verdict['reason']}", file=sys.stderr, flush=True)
    return 0 if verdict["valid"] else 2


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # NOTE: a handler's non-daemon thread or TensorFlow's teardown must not hold the verdict
