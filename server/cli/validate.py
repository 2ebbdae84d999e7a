"""`python -m server.cli.validate PATH`: load a model the way a worker does (safe_mode) and warm it.

Run by publish in a child process, so the caller never imports TensorFlow. Exit status 0 and a
JSON summary of the signatures on stdout, or status 2 and `invalid model: ...` on stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from server.repository import VersionSource, detect_format


def source_for(path: Path) -> VersionSource:
    """A VersionSource for a loose file or directory, as if it were a version directory."""
    if path.is_file():
        fmt = "keras" if path.suffix.lower() == ".keras" else "h5"
        return VersionSource("candidate", 1, path.parent, fmt, problem="", file=path)
    fmt, problem = detect_format(path)
    return VersionSource("candidate", 1, path, fmt, problem)


def main(argv: list[str]) -> int:
    """Validate argv[0]; print the outcome."""
    if len(argv) != 1:
        print("usage: python -m server.cli.validate PATH", file=sys.stderr)
        return 64
    from server.config import ModelConfig
    from server.worker import runtime
    from server.worker.handlers import HandlerError, check_example, has_handler, load_handler

    source = source_for(Path(argv[0]))
    handler = None
    try:
        servable = runtime.load_servable(source)
        if source.file is None and has_handler(source.path):  # a version directory with its handler
            handler = load_handler(source.path, "forkserve_handler_candidate")
        servable.warm_up([1])
        if handler is not None:
            check_example(handler, servable.signatures, ModelConfig(), servable.run)
    except HandlerError as exc:
        print(f"invalid model: handler: {exc}".replace("\n", " ")[:2000], file=sys.stderr)
        return 2
    except Exception as exc:  # every failure is a verdict about the model
        print(f"invalid model: {type(exc).__name__}: {exc}".replace("\n", " ")[:2000], file=sys.stderr)
        return 2
    summary = {name: {"method": s.method, "inputs": list(s.inputs), "outputs": list(s.outputs)} for name, s in servable.signatures.items()}
    described = handler.describe() if handler is not None else None
    print(json.dumps({"format": servable.platform, "signatures": summary, "handler": described}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
