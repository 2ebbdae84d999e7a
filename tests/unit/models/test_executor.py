"""The per-model executor: batching, exact sizes or padding to allowed sizes, splitting, queue limits, failures."""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

import numpy as np
import pytest

from server.config import ModelConfig
from server.errors import ApiError, ResourceExhausted
from server.models.executor import Abandoned, Job, ModelExecutor, bucket_for
from server.models.reply import Reply as Future

TIMEOUT = 10.0  # seconds any single wait may take before the test fails instead of hanging


class Model:
    """A numpy stand-in for a model: y = 2x + 1; records each call; 'block' calls wait for `gate`."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.blocked = threading.Event()
        self.lock = threading.Lock()
        self.calls: list[tuple[str, np.ndarray]] = []

    def __call__(self, signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one call: record it, maybe block, refuse negative inputs, answer 2x + 1."""
        x = inputs["x"]
        with self.lock:
            self.calls.append((signature, x.copy()))
        if signature == "block":
            self.blocked.set()
            assert self.gate.wait(TIMEOUT), "the test never released the executor"
        if (x < 0).any():
            raise ValueError("negative input")
        return {"y": x * 2 + 1}

    def sizes(self, signature: str = "serving_default") -> list[int]:
        """Batch sizes of the calls made for `signature`, in call order."""
        with self.lock:
            return [len(x) for sig, x in self.calls if sig == signature]

    def seen(self) -> np.ndarray:
        """Every input value any call received."""
        with self.lock:
            return np.concatenate([x.reshape(-1) for _, x in self.calls])


def bucket_sizes(max_batch_size: int) -> list[int]:
    """The warm-up sizes of a model whose max_batch_size is `max_batch_size` (the padded executor's buckets here)."""
    return ModelConfig(max_batch_size=max_batch_size, max_queue_rows=max(1024, max_batch_size)).batch_buckets


def test_configured_batch_sizes_replace_the_powers_of_two() -> None:
    config = ModelConfig(max_batch_size=48, allowed_batch_sizes=(4, 16, 48))
    assert config.batch_buckets == [4, 16, 48] and config.padded_batch_sizes == [4, 16, 48]


def test_by_default_batches_are_warmed_at_powers_of_two_and_never_padded() -> None:
    config = ModelConfig(max_batch_size=64)
    assert config.batch_buckets == [1, 2, 4, 8, 16, 32, 64] and config.padded_batch_sizes == []


@pytest.mark.parametrize(("sizes", "calls"), [([3], [3]), ([2, 3, 2], [7]), ([5, 5, 7], [5, 5, 7]), ([1] * 9, [8, 1])])
def test_an_executor_without_padded_sizes_calls_the_model_at_each_batch_own_size(
    model: Model, sizes: list[int], calls: list[int]
) -> None:
    executor = ModelExecutor("m/1", model, 8, 0.0, 10_000, buckets=ModelConfig(max_batch_size=8).padded_batch_sizes)
    executor.start()
    try:
        block(executor, model)
        inputs = [rows(100 * i, size) for i, size in enumerate(sizes)]
        futures = [enqueue(executor, "serving_default", {"x": x}, len(x), True) for x in inputs]
        model.gate.set()
        for future, x in zip(futures, inputs):
            np.testing.assert_array_equal(result(future), x * 2 + 1)
    finally:
        model.gate.set()
    assert model.sizes() == calls  # queued jobs batched up to max_batch_size, each call at the batch's own size


@pytest.fixture
def model() -> Model:
    """A fresh recording model."""
    return Model()


@pytest.fixture
def make_executor(model: Model) -> Iterator[Callable[..., ModelExecutor]]:
    """Factory for started executors over `model`; all are stopped at teardown."""
    started: list[ModelExecutor] = []

    def make(max_batch_size: int = 8, max_batch_delay_s: float = 0.0, max_queue_rows: int = 10_000,
             padded: bool = True) -> ModelExecutor:
        """A started executor over `model` with these limits, padding to the power-of-two sizes or (padded=False) not."""
        executor = ModelExecutor(
            "m/1", model, max_batch_size, max_batch_delay_s, max_queue_rows,
            buckets=bucket_sizes(max_batch_size) if padded else [],
        )
        executor.start()
        started.append(executor)
        return executor

    yield make
    model.gate.set()  # NOTE: executor threads are daemons that live as long as their worker (here: the test run)


def enqueue(executor: ModelExecutor, signature: str, inputs: dict[str, np.ndarray], rows: int, batchable: bool) -> Future:
    """Submit a job and return the reply its caller waits on."""
    return executor.submit(signature, inputs, rows, batchable).future


def block(executor: ModelExecutor, model: Model) -> Future:
    """Occupy the executor thread with a call that waits for model.gate; return once it is running."""
    future = enqueue(executor, "block", {"x": np.zeros((1, 1), np.float32)}, 1, True)
    assert model.blocked.wait(TIMEOUT)
    return future


def rows(start: float, count: int, width: int = 2) -> np.ndarray:
    """`count` rows of `width` float32 values starting at `start`."""
    return (np.arange(count * width, dtype=np.float32) + start).reshape(count, width)


def result(future: Future) -> np.ndarray:
    """The 'y' output of a finished job."""
    return future.result(timeout=TIMEOUT)["y"]


# --- bucket sizes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_batch_size", "expected"),
    [(1, [1]), (2, [1, 2]), (8, [1, 2, 4, 8]), (10, [1, 2, 4, 8, 10]), (64, [1, 2, 4, 8, 16, 32, 64]), (65, [1, 2, 4, 8, 16, 32, 64, 65])],
)
def test_bucket_sizes_are_powers_of_two_and_the_maximum(max_batch_size: int, expected: list[int]) -> None:
    assert bucket_sizes(max_batch_size) == expected


@pytest.mark.parametrize(("rows_", "expected"), [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 10), (10, 10)])
def test_bucket_for_is_the_smallest_bucket_that_holds_the_rows(rows_: int, expected: int) -> None:
    assert bucket_for(rows_, bucket_sizes(10)) == expected


def test_batch_key_separates_signatures_dtypes_and_example_shapes() -> None:
    base = Job("s", {"x": np.zeros((2, 3), np.float32)}, 2, True)
    assert base.key == Job("s", {"x": np.ones((5, 3), np.float32)}, 5, True).key
    assert base.key != Job("t", {"x": np.zeros((2, 3), np.float32)}, 2, True).key
    assert base.key != Job("s", {"x": np.zeros((2, 3), np.float64)}, 2, True).key
    assert base.key != Job("s", {"x": np.zeros((2, 4), np.float32)}, 2, True).key


# --- executor ---------------------------------------------------------------------------------


def test_single_job_is_padded_to_its_bucket_and_answered_with_its_own_rows(make_executor: Callable[..., ModelExecutor], model: Model) -> None:
    executor = make_executor(max_batch_size=8)
    x = rows(0, 3)
    np.testing.assert_array_equal(result(enqueue(executor, "serving_default", {"x": x}, 3, True)), x * 2 + 1)
    assert model.sizes() == [4]
    padded = model.calls[-1][1]
    np.testing.assert_array_equal(padded[3], x[2])  # padding repeats the last row


def test_queued_jobs_are_concatenated_into_one_padded_call(make_executor: Callable[..., ModelExecutor], model: Model) -> None:
    executor = make_executor(max_batch_size=8)
    block(executor, model)
    inputs = [rows(10 * i, 2) for i in range(3)]
    futures = [enqueue(executor, "serving_default", {"x": x}, 2, True) for x in inputs]
    assert executor.queued_rows == 6
    model.gate.set()
    for future, x in zip(futures, inputs):
        np.testing.assert_array_equal(result(future), x * 2 + 1)
    assert model.sizes() == [8]  # 2 + 2 + 2 rows in one call, padded to the 8 bucket
    assert executor.queued_rows == 0


@pytest.mark.parametrize("padded", [True, False])
def test_concurrent_mixed_size_jobs_get_the_same_results_as_unbatched_calls(
    make_executor: Callable[..., ModelExecutor], model: Model, padded: bool
) -> None:
    executor = make_executor(max_batch_size=8, padded=padded)
    block(executor, model)
    rng = random.Random(1234)
    sizes = [rng.randint(1, 8) for _ in range(80)]
    starts = np.cumsum([0] + sizes[:-1]) * 2
    inputs = [rows(float(start), size) for start, size in zip(starts, sizes)]

    def submit(i: int) -> Future:
        """Submit job i from a pool thread."""
        return enqueue(executor, "serving_default", {"x": inputs[i]}, sizes[i], True)

    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = list(pool.map(submit, range(len(inputs))))
    assert executor.queued_rows == sum(sizes)
    model.gate.set()
    for future, x in zip(futures, inputs):
        y = result(future)
        assert y.shape == x.shape and y.dtype == np.float32
        np.testing.assert_array_equal(y, x * 2 + 1)
    calls = model.sizes()
    if padded:
        assert set(calls) <= set(bucket_sizes(8))  # every call was padded to a bucket size
        assert sum(calls) >= sum(sizes)
    else:
        assert sum(calls) == sum(sizes)  # every call at its batch's own size
    assert len(calls) < len(sizes)  # jobs shared calls
    assert max(calls) <= 8


def test_request_larger_than_max_batch_size_is_split_and_answered_whole(make_executor: Callable[..., ModelExecutor], model: Model) -> None:
    executor = make_executor(max_batch_size=4)
    x = rows(0, 11)
    y = result(enqueue(executor, "serving_default", {"x": x}, 11, True))
    np.testing.assert_array_equal(y, x * 2 + 1)
    assert model.sizes() == [4, 4, 4]  # 4 + 4 + 3 padded to 4


def test_request_larger_than_max_batch_size_uses_a_non_power_of_two_bucket(make_executor: Callable[..., ModelExecutor], model: Model) -> None:
    executor = make_executor(max_batch_size=6)
    x = rows(0, 11)
    np.testing.assert_array_equal(result(enqueue(executor, "serving_default", {"x": x}, 11, True)), x * 2 + 1)
    assert model.sizes() == [6, 6]


def test_full_queue_raises_resource_exhausted(make_executor: Callable[..., ModelExecutor], model: Model) -> None:
    executor = make_executor(max_batch_size=4, max_queue_rows=4)
    block(executor, model)
    first = enqueue(executor, "serving_default", {"x": rows(0, 3)}, 3, True)
    with pytest.raises(ResourceExhausted, match=r"queue is full \(3 rows waiting, limit 4\)") as caught:
        enqueue(executor, "serving_default", {"x": rows(0, 2)}, 2, True)
    assert caught.value.status == 503
    fits = enqueue(executor, "serving_default", {"x": rows(100, 1)}, 1, True)
    model.gate.set()
    np.testing.assert_array_equal(result(first), rows(0, 3) * 2 + 1)
    np.testing.assert_array_equal(result(fits), rows(100, 1) * 2 + 1)


def test_oversized_request_is_accepted_into_an_empty_queue(make_executor: Callable[..., ModelExecutor], model: Model) -> None:
    executor = make_executor(max_batch_size=4, max_queue_rows=4)
    block(executor, model)
    big = enqueue(executor, "serving_default", {"x": rows(0, 9)}, 9, True)
    with pytest.raises(ResourceExhausted):
        enqueue(executor, "serving_default", {"x": rows(0, 1)}, 1, True)
    model.gate.set()
    np.testing.assert_array_equal(result(big), rows(0, 9) * 2 + 1)


def test_failing_job_in_a_batch_fails_only_itself(make_executor: Callable[..., ModelExecutor], model: Model) -> None:
    executor = make_executor(max_batch_size=8)
    block(executor, model)
    good1 = enqueue(executor, "serving_default", {"x": rows(1, 2)}, 2, True)
    bad = enqueue(executor, "serving_default", {"x": -rows(1, 1)}, 1, True)
    good2 = enqueue(executor, "serving_default", {"x": rows(50, 2)}, 2, True)
    model.gate.set()
    np.testing.assert_array_equal(result(good1), rows(1, 2) * 2 + 1)
    np.testing.assert_array_equal(result(good2), rows(50, 2) * 2 + 1)
    with pytest.raises(ValueError, match="negative input"):
        bad.result(timeout=TIMEOUT)
    assert model.sizes()[0] == 8  # they were tried together first (5 rows padded to 8) ...
    assert sorted(model.sizes()[1:]) == [1, 2, 2]  # ... then each alone


def test_output_without_batch_dimension_fails_the_job() -> None:
    def scalar_model(signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A model whose output has lost the batch dimension."""
        return {"y": np.float32(inputs["x"].sum())}

    executor = ModelExecutor("m/1", scalar_model, 4, 0.0, 100, buckets=bucket_sizes(4))
    executor.start()
    future = enqueue(executor, "serving_default", {"x": rows(0, 2)}, 2, True)
    with pytest.raises(ApiError, match="no batch dimension") as caught:
        future.result(timeout=TIMEOUT)
    assert caught.value.status == 500


def test_non_batchable_jobs_run_alone_and_unpadded(make_executor: Callable[..., ModelExecutor], model: Model) -> None:
    executor = make_executor(max_batch_size=8)
    block(executor, model)
    a = enqueue(executor, "serving_default", {"x": rows(0, 3)}, 3, False)
    b = enqueue(executor, "serving_default", {"x": rows(10, 3)}, 3, False)
    c = enqueue(executor, "serving_default", {"x": rows(20, 2)}, 2, True)
    d = enqueue(executor, "serving_default", {"x": rows(30, 1)}, 1, True)
    model.gate.set()
    for future, x in ((a, rows(0, 3)), (b, rows(10, 3)), (c, rows(20, 2)), (d, rows(30, 1))):
        np.testing.assert_array_equal(result(future), x * 2 + 1)
    assert model.sizes() == [3, 3, 4]  # a and b alone and unpadded; c and d together, padded 3 -> 4


def test_non_batchable_job_larger_than_max_batch_size_is_not_split(make_executor: Callable[..., ModelExecutor], model: Model) -> None:
    executor = make_executor(max_batch_size=4)
    x = rows(0, 7)
    np.testing.assert_array_equal(result(enqueue(executor, "serving_default", {"x": x}, 7, False)), x * 2 + 1)
    assert model.sizes() == [7]


def test_jobs_with_different_signatures_or_shapes_are_not_mixed(make_executor: Callable[..., ModelExecutor], model: Model) -> None:
    executor = make_executor(max_batch_size=8)
    block(executor, model)
    narrow = enqueue(executor, "serving_default", {"x": rows(0, 2, width=2)}, 2, True)
    wide = enqueue(executor, "serving_default", {"x": rows(0, 2, width=3)}, 2, True)
    narrow2 = enqueue(executor, "serving_default", {"x": rows(5, 2, width=2)}, 2, True)
    other = enqueue(executor, "other", {"x": rows(0, 2, width=2)}, 2, True)
    model.gate.set()
    for future, x in ((narrow, rows(0, 2)), (wide, rows(0, 2, width=3)), (narrow2, rows(5, 2)), (other, rows(0, 2))):
        np.testing.assert_array_equal(result(future), x * 2 + 1)
    assert model.sizes() == [4, 2]  # the two narrow jobs together, then the wide one
    assert model.sizes("other") == [2]


def test_cancelled_jobs_are_skipped(make_executor: Callable[..., ModelExecutor], model: Model) -> None:
    executor = make_executor(max_batch_size=8)
    block(executor, model)
    cancelled = enqueue(executor, "serving_default", {"x": np.full((2, 2), 777, np.float32)}, 2, True)
    kept = enqueue(executor, "serving_default", {"x": rows(0, 2)}, 2, True)
    assert cancelled.cancel()
    model.gate.set()
    np.testing.assert_array_equal(result(kept), rows(0, 2) * 2 + 1)
    assert cancelled.cancelled()
    assert 777 not in model.seen()
    assert model.sizes() == [2]


def test_a_cancelled_job_leaves_the_queue_and_its_rows_stop_counting(make_executor: Callable[..., ModelExecutor], model: Model) -> None:
    executor = make_executor(max_batch_size=4, max_queue_rows=4)
    block(executor, model)
    timed_out = executor.submit("serving_default", {"x": np.full((4, 2), 777, np.float32)}, 4, True)
    with pytest.raises(ResourceExhausted):
        enqueue(executor, "serving_default", {"x": rows(0, 1)}, 1, True)
    assert executor.cancel(timed_out) and timed_out.future.cancelled()
    assert executor.queued_rows == 0
    live = enqueue(executor, "serving_default", {"x": rows(0, 3)}, 3, True)  # fits now
    model.gate.set()
    np.testing.assert_array_equal(result(live), rows(0, 3) * 2 + 1)
    assert 777 not in model.seen()


def test_a_job_cancelled_first_in_the_queue_does_not_hold_a_batch_open(make_executor: Callable[..., ModelExecutor], model: Model) -> None:
    executor = make_executor(max_batch_size=4, max_batch_delay_s=3.0)  # only a full batch goes before 3 s
    block(executor, model)  # (the blocking call itself waits out the delay first)
    cancelled = executor.submit("serving_default", {"x": rows(0, 1)}, 1, True)
    assert cancelled.future.cancel()  # cancelled, but its cancel() has not removed it from the queue yet
    full = enqueue(executor, "serving_default", {"x": rows(10, 4)}, 4, True)
    model.gate.set()
    np.testing.assert_array_equal(full.result(timeout=1.5)["y"], rows(10, 4) * 2 + 1)
    assert executor.queued_rows == 0


def test_a_running_job_cannot_be_withdrawn(make_executor: Callable[..., ModelExecutor], model: Model) -> None:
    executor = make_executor(max_batch_size=4)
    running = executor.submit("block", {"x": np.zeros((1, 1), np.float32)}, 1, True)
    assert model.blocked.wait(TIMEOUT)
    assert not executor.cancel(running)
    model.gate.set()
    assert result(running.future).shape == (1, 1)


def test_batch_delay_waits_for_more_rows_but_not_past_a_full_batch(make_executor: Callable[..., ModelExecutor], model: Model) -> None:
    executor = make_executor(max_batch_size=4, max_batch_delay_s=TIMEOUT)
    first = enqueue(executor, "serving_default", {"x": rows(0, 2)}, 2, True)
    second = enqueue(executor, "serving_default", {"x": rows(10, 2)}, 2, True)
    # The batch is full after the second job, so neither waits for the (long) delay.
    np.testing.assert_array_equal(first.result(timeout=TIMEOUT / 2)["y"], rows(0, 2) * 2 + 1)
    np.testing.assert_array_equal(second.result(timeout=TIMEOUT / 2)["y"], rows(10, 2) * 2 + 1)
    assert model.sizes() == [4]


def test_integer_and_multi_input_jobs_are_batched_per_input() -> None:
    seen: list[int] = []

    def add(signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Two int inputs, two outputs."""
        seen.append(len(inputs["a"]))
        return {"sum": inputs["a"] + inputs["b"], "a_first": inputs["a"][:, :1]}

    executor = ModelExecutor("m/1", add, 4, 0.0, 100, buckets=bucket_sizes(4))
    executor.start()
    a = np.arange(6, dtype=np.int64).reshape(3, 2)
    b = np.full((3, 2), 10, dtype=np.int64)
    out = enqueue(executor, "serving_default", {"a": a, "b": b}, 3, True).result(timeout=TIMEOUT)
    np.testing.assert_array_equal(out["sum"], a + b)
    np.testing.assert_array_equal(out["a_first"], a[:, :1])
    assert seen == [4]


# --- abandoned jobs ---------------------------------------------------------------------------


class Chunks:
    """A run function that counts its calls (chunks); the first waits for `gate`, so a test can abandon meanwhile."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.first = threading.Event()
        self.calls = 0

    def __call__(self, signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        if self.calls == 1:
            self.first.set()
            assert self.gate.wait(TIMEOUT), "the test never released the executor"
        return {"y": inputs["x"] * 2 + 1}


@pytest.fixture
def chunks() -> Iterator[Chunks]:
    counting = Chunks()
    yield counting
    counting.gate.set()


def test_an_abandoned_job_stops_its_call_at_the_next_chunk(chunks: Chunks) -> None:
    executor = ModelExecutor("m/1", chunks, 2, 0.0, 10_000)
    executor.start()
    job = executor.submit("serving_default", {"x": rows(0, 20)}, 20, True)  # 10 chunks of 2 rows
    assert chunks.first.wait(TIMEOUT)
    executor.abandon(job)
    chunks.gate.set()
    with pytest.raises(Abandoned, match="after 2 of 20 rows"):
        job.future.result(timeout=TIMEOUT)
    assert chunks.calls == 1
    later = executor.submit("serving_default", {"x": rows(0, 3)}, 3, True)  # the executor goes on
    np.testing.assert_array_equal(result(later.future), rows(0, 3) * 2 + 1)
    assert chunks.calls == 3


def test_an_abandoned_queued_job_is_withdrawn_and_a_finished_one_is_left_alone(chunks: Chunks) -> None:
    executor = ModelExecutor("m/1", chunks, 2, 0.0, 10_000)
    executor.start()
    running = executor.submit("serving_default", {"x": rows(0, 1)}, 1, True)
    assert chunks.first.wait(TIMEOUT)
    queued = executor.submit("serving_default", {"x": rows(100, 4)}, 4, True)
    executor.abandon(queued)
    assert queued.future.cancelled() and executor.queued_rows == 0
    chunks.gate.set()
    np.testing.assert_array_equal(result(running.future), rows(0, 1) * 2 + 1)
    executor.abandon(running)  # too late to matter: its answer stays
    np.testing.assert_array_equal(result(running.future), rows(0, 1) * 2 + 1)
    assert chunks.calls == 1  # the queued job never ran
