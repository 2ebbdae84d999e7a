"""The image's entrypoint (scripts/docker-entrypoint) run outside the image, with fakes of the commands it starts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.harness import ROOT

ENTRYPOINT = ROOT / "scripts" / "docker-entrypoint"
# Prints the process it runs in, the model repository it was given, and what it was started as.
FAKE = '#!/bin/sh\nprintf "%s\\n" "$$" "${FORKSERVE_MODELS-(unset)}" "$(basename "$0")" "$@"\n'


def fake_commands(directory: Path) -> Path:
    """Fake tensorflow_model_server, gunicorn and python3 in `directory`/bin."""
    bin_dir = directory / "bin"
    bin_dir.mkdir()
    for name in ("tensorflow_model_server", "gunicorn", "python3"):
        (bin_dir / name).write_text(FAKE)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def run_entrypoint(fakes: Path, *args: str, **env: str) -> tuple[str, list[str], str]:
    """Run the entrypoint in a clean environment, fakes first on PATH; (FORKSERVE_MODELS, argv of what it execs, stderr)."""
    process = subprocess.Popen([str(ENTRYPOINT), *args], env={"PATH": f"{fakes}:{os.environ['PATH']}", **env},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    pid, models, *argv = out.splitlines()
    assert int(pid) == process.pid  # exec'd: the server replaces the script and gets its signals
    return models, argv, err


def flag(argv: list[str], name: str) -> str:
    """The value of `--name=value` as tensorflow_model_server reads it: the last one given wins."""
    return [arg.split("=", 1)[1] for arg in argv if arg.startswith(f"--{name}=")][-1]
