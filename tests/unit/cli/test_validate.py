"""The parent's side of validation: the settings it passes and how it reads the child's verdict."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from server.cli.validate import ValidationFailed, _exit_status, _verdict_of, model_settings
from server.config import ModelConfig


def test_the_verdict_is_the_last_line_of_the_child_s_stdout() -> None:
    verdict = {"valid": False, "reason": "handler: SystemExit: 3"}
    assert _verdict_of("noise\n" + json.dumps(verdict) + "\n") == verdict
    assert _verdict_of(json.dumps(verdict) + "\nprinted after it\n") is None
    assert _verdict_of("") is None
    assert _verdict_of('{"something": "else"}') is None


def test_a_child_without_a_verdict_is_described_by_how_it_ended() -> None:
    assert _exit_status(3) == "exit status 3"
    assert _exit_status(-signal.SIGKILL) == "killed by SIGKILL"


def test_the_settings_are_the_model_s_table_over_the_defaults(tmp_path: Path) -> None:
    conf = tmp_path / "models.toml"
    conf.write_text("[defaults]\nmax_batch_size = 8\n[models.a]\nhandler = true\nimage_mode = \"L\"\n")
    assert model_settings("a", conf) == ModelConfig(max_batch_size=8, handler=True, image_mode="L")
    assert model_settings("b", conf) == ModelConfig(max_batch_size=8)
    assert model_settings("a", tmp_path / "missing.toml") == ModelConfig()  # as the server: every default
    conf.write_text("[models.a]\nhandler = 1\n")
    with pytest.raises(ValidationFailed, match=r"handler must be true or false.*the settings the server would apply to a"):
        model_settings("a", conf)


def test_a_conf_given_that_does_not_exist_is_warned_about(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from server.cli.main import main

    assert main(["validate", "digits", str(tmp_path / "no-such-model"), "--conf", str(tmp_path / "missing.toml")]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"validate: warning: {tmp_path / 'missing.toml'} does not exist: checking with the default settings"
    assert lines[1].startswith("validate: ") and "no such file or directory" in lines[1]
