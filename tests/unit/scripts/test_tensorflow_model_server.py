"""scripts/tensorflow_model_server, TF Serving's command by name: forkserve's launcher with the same flags, in the same process."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.harness import ROOT


def test_it_execs_the_launcher_with_every_flag_unchanged(tmp_path: Path) -> None:
    (tmp_path / "python3").write_text('#!/bin/sh\nprintf "%s\\n" "$$" "$(basename "$0")" "$@"\n')
    (tmp_path / "python3").chmod(0o755)
    flags = ["--port=9000", "--rest_api_port=8080", "--model_name=my model", "--model_base_path=/mnt/models"]
    process = subprocess.Popen([str(ROOT / "scripts" / "tensorflow_model_server"), *flags],
                               env={"PATH": f"{tmp_path}:{os.environ['PATH']}"}, stdout=subprocess.PIPE, text=True)
    out, _ = process.communicate(timeout=30)
    pid, *argv = out.splitlines()
    assert process.returncode == 0 and int(pid) == process.pid
    assert argv == ["python3", "-m", "server", "tfserving", *flags]
