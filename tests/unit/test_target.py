"""The target and failed files: what the generation covers, and round trips through the run directory."""

from __future__ import annotations

from pathlib import Path

from server.config import load_config, parse_config
from server.repository import VersionSource
from server.target import (
    ConfigProblem,
    FailedVersion,
    Target,
    compute_target,
    describe_problem,
    failed_reason,
    read_failed,
    read_target,
    write_failed,
    write_target,
)


def sources(name: str, *numbers: int) -> list[VersionSource]:
    return [VersionSource(name, n, Path(f"/m/{name}/{n}"), "keras") for n in numbers]


def test_the_policy_picks_candidates_newest_first() -> None:
    config = parse_config({"models": {"b": {"version_policy": "all"}}})
    target = compute_target({"a": sources("a", 3, 2), "b": sources("b", 2, 1)}, config)
    assert target.intended() == {"a": [3], "b": [2, 1]}
    assert target.models["a"].candidates == (3, 2)  # 2 is the fallback when 3 fails to load


def test_the_generation_covers_versions_and_configuration_but_not_a_config_problem() -> None:
    plain = compute_target({"a": sources("a", 1)}, parse_config({}))
    assert plain.generation == compute_target({"a": sources("a", 1)}, parse_config({})).generation
    assert plain.generation != compute_target({"a": sources("a", 2, 1)}, parse_config({})).generation
    batched = compute_target({"a": sources("a", 1)}, parse_config({"defaults": {"max_batch_size": 8}}))
    assert batched.generation != plain.generation
    with_problem = compute_target({"a": sources("a", 1)}, parse_config({}), config_problem=ConfigProblem("bad"))
    assert with_problem.generation == plain.generation


def test_a_target_round_trips_with_its_configuration_and_problem(tmp_path: Path) -> None:
    config_file = tmp_path / "models.toml"
    config_file.write_text("[models.a]\nmax_batch_size = 8\nlabels = { stable = 1 }\n")
    target = compute_target({"a": sources("a", 2, 1)}, load_config(config_file), "test",
                            ConfigProblem("[models.b]: broken", "b"))
    write_target(tmp_path, target)
    again = read_target(tmp_path)
    assert again is not None
    assert again.generation == target.generation and again.models == target.models
    assert again.config.for_model("a").max_batch_size == 8 and again.config.for_model("a").labels == {"stable": 1}
    assert again.config_problem == ConfigProblem("[models.b]: broken", "b")


def test_an_unreadable_target_reads_as_none(tmp_path: Path) -> None:
    assert read_target(tmp_path) is None
    (tmp_path / "target.json").write_text('{"models": {"a": {"candidates": ["x"]}}}')
    assert read_target(tmp_path) is None
    (tmp_path / "target.json").write_text('{"models": {}, "config": {"defaults": {"max_batch_size": "eight"}}}')
    assert read_target(tmp_path) is None


def test_failed_versions_round_trip_and_answer_lookups(tmp_path: Path) -> None:
    write_failed(tmp_path, {"a": {3: FailedVersion("rollout aborted: boom", "k1")}, "b": {}})
    assert read_failed(tmp_path) == {"a": {3: FailedVersion("rollout aborted: boom", "k1")}}
    assert failed_reason(tmp_path, "a", 3) == "rollout aborted: boom"
    assert failed_reason(tmp_path, "a", 2) is None


def test_a_config_problem_is_described_for_the_models_it_affects() -> None:
    assert describe_problem(None, "a") == {}
    only_b = ConfigProblem("[models.b]: broken", "b")
    assert describe_problem(only_b, "a") == {}
    assert "[models.b]: broken" in describe_problem(only_b, "b")["config_error"]
    assert "last good configuration" in describe_problem(ConfigProblem("toml syntax"), "a")["config_error"]
    assert Target().generation == Target().generation
