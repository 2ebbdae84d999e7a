"""forkserve's command line run as a user runs it: `python -m server ...` in a child process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.harness import ROOT


def forkserve(*args: str, conf: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `python -m server ARGS` from the repository root; `conf` is FORKSERVE_CONF, `env` goes over this environment."""
    overrides = {**({"FORKSERVE_CONF": str(conf)} if conf else {}), **(env or {})}
    return subprocess.run([sys.executable, "-m", "server", *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **overrides})
