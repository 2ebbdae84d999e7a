from pathlib import Path

from bench.spy import share


def test_share_counts_the_samples_whose_stack_holds_a_match(tmp_path: Path) -> None:
    profile = tmp_path / "raw.txt"
    profile.write_text(
        "thread (1): ThreadPoolExecutor-0_0;handle (server/http/fast_predict.py:80);end (server/telemetry/tracing.py:340) 3\n"
        "thread (2): OtelBatchSpanRecordProcessor;worker (opentelemetry/sdk/_shared_internal/__init__.py:159) 2\n"
        "thread (1): ThreadPoolExecutor-0_0;handle (server/http/fast_predict.py:80) 10\n"
        "not a sample line\n"
    )
    assert share(profile, ["telemetry/tracing.py", "OtelBatchSpan"]) == (5, 15)
    assert share(profile, []) == (0, 15)
