"""The per-model queue and executor thread: the only thread that calls a model's TensorFlow code.

One executor per model version per worker. Request threads submit numpy inputs and wait on
a Future; the executor takes what is queued (up to max_batch_size rows, waiting at most
max_batch_delay), makes one call at the batch's own size (or padded up to one of the model's
`allowed_batch_sizes`, when it has them) and hands each caller its rows.

A requester that gives up (its deadline, a cancelled gRPC call) abandons its job: a queued job leaves
the queue, and a running call split into max_batch_size chunks stops before its next chunk once
every job in it is abandoned.

NOTE: no padding by default, as TensorFlow Serving: the functions have a free batch dimension, so a
new size never retraces; only its first call costs oneDNN some setup. Padding to powers of two cost
a batch of 17 a call of 32 (measured: bench/results/code-notes.md#executor-padding).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from server.errors import ApiError, ResourceExhausted
from server.models.reply import Reply
from server.telemetry import metrics, tracing
from server.telemetry.buffer import BUFFER

log = logging.getLogger("forkserve.batching")

RunFunction = Callable[[str, dict[str, np.ndarray]], dict[str, np.ndarray]]
BATCH_KINDS = ("compute_input", "compute_infer", "compute_output")  # Triton's batch statistics (server.telemetry.statistics)


def bucket_for(rows: int, sizes: list[int]) -> int:
    """The smallest bucket that holds `rows` (rows never exceed the largest)."""
    return next(size for size in sizes if size >= rows)


@dataclass(eq=False)  # identity: the queue removes a cancelled job by identity
class Job:
    """One request's inputs waiting for the executor."""

    signature: str
    inputs: dict[str, np.ndarray]
    rows: int
    batchable: bool
    future: Reply = field(default_factory=Reply)
    enqueued: float = field(default_factory=time.monotonic)
    started: float = 0.0  # set by the executor when the call that holds this job begins
    finished: float = 0.0
    key: tuple = ()  # jobs with equal keys can be concatenated into one call
    trace: Any = None  # the request's span context when it is traced (server.telemetry.tracing)
    abandoned: bool = False  # its requester gave up while it ran (ModelExecutor.abandon)

    def __post_init__(self) -> None:
        # Computed once, in the request thread: the executor compares keys while holding its lock.
        self.key = (self.signature,) + tuple(
            (name, array.dtype.str, array.shape[1:]) for name, array in sorted(self.inputs.items())
        )


class Abandoned(Exception):
    """Every job of a running call was abandoned: its remaining chunks were not run."""


class ModelExecutor:
    """A bounded queue of jobs and the thread that runs them in batches."""

    def __init__(
        self,
        name: str,
        run: RunFunction,
        max_batch_size: int,
        max_batch_delay_s: float,
        max_queue_rows: int,
        traces: Callable[[], int] | None = None,
        model: str = "",
        buckets: list[int] | None = None,
        version: str = "",
    ) -> None:
        self.name = name
        self._run = run
        self._traces = traces
        self._traces_seen = traces() if traces else 0
        self.model = model or name
        self.version = version  # the statistics' label (server.telemetry.statistics)
        for reason in ("queue_full", "deadline"):
            metrics.record(lambda reason=reason: metrics.REJECTED_REQUESTS.labels(self.model, reason))  # at 0
        self.max_batch_size = max_batch_size
        self.max_batch_delay_s = max_batch_delay_s
        self.max_queue_rows = max_queue_rows
        self.buckets = buckets or []  # sizes to pad up to; empty: none
        self._jobs: collections.deque[Job] = collections.deque()
        self._queued_rows = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=f"executor-{name}", daemon=True)

    def start(self) -> None:
        """Start the executor thread (after warm-up, in the worker)."""
        self._thread.start()

    @property
    def queued_rows(self) -> int:
        """Rows waiting (not yet running)."""
        return self._queued_rows

    def submit(self, signature: str, inputs: dict[str, np.ndarray], rows: int, batchable: bool, trace: Any = None) -> Job:
        """Queue one request; raise ResourceExhausted at once when the queue is full."""
        job = Job(signature, inputs, rows, batchable, trace=trace)
        with self._cond:
            if self._queued_rows and self._queued_rows + rows > self.max_queue_rows:
                metrics.record(lambda: metrics.REJECTED_REQUESTS.labels(self.model, "queue_full").inc())
                raise ResourceExhausted(
                    f"model {self.name} queue is full ({self._queued_rows} rows waiting, limit {self.max_queue_rows})"
                )
            self._jobs.append(job)
            self._queued_rows += rows
            self._cond.notify()
        BUFFER.add(metrics.QUEUE_ROWS, (self.model,), rows)
        return job

    def cancel(self, job: Job) -> bool:
        """Requester, past its deadline: withdraw a job that has not started; False when it runs already.

        NOTE: the job leaves the queue here, not when the executor would have skipped it: a burst of
        timed-out jobs left in place would keep counting toward max_queue_rows and 503 live requests.
        """
        if not job.future.cancel():
            return False
        with self._cond:
            try:
                self._jobs.remove(job)
            except ValueError:  # taken into a batch already: its rows were counted out then
                return True
            self._queued_rows -= job.rows
        BUFFER.add(metrics.QUEUE_ROWS, (self.model,), -job.rows)
        return True

    def abandon(self, job: Job) -> None:
        """Requester, gone (past its deadline, or its client cancelled): withdraw the job, or stop its call at a chunk boundary.

        A queued job leaves the queue (cancel); a running one is marked, and the call that holds it
        stops before its next max_batch_size chunk once every job in that call is abandoned. A
        non-batchable job runs in one call, which nothing stops.
        """
        if not self.cancel(job):
            job.abandoned = True  # NOTE: read by the executor thread between chunks; a bool store is atomic

    def _take(self) -> list[Job]:
        """Block for the next job, then gather compatible queued jobs up to max_batch_size rows."""
        with self._cond:
            while True:
                while not self._jobs:
                    self._cond.wait()
                first = self._jobs.popleft()
                if not first.future.done():
                    break
                self._queued_rows -= first.rows  # cancelled while its cancel() waited for this lock
                BUFFER.add(metrics.QUEUE_ROWS, (self.model,), -first.rows)
            batch, rows = [first], first.rows
            if first.batchable:
                key = first.key
                deadline = time.monotonic() + self.max_batch_delay_s
                while rows < self.max_batch_size:
                    candidate = self._first_fitting(key, self.max_batch_size - rows)
                    if candidate is not None:
                        batch.append(candidate)
                        rows += candidate.rows
                        continue
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
            taken = sum(job.rows for job in batch)
            self._queued_rows -= taken
        BUFFER.add(metrics.QUEUE_ROWS, (self.model,), -taken)
        return batch

    def _first_fitting(self, key: tuple, room: int) -> Job | None:
        """Remove and return the oldest queued job that fits the batch (FIFO otherwise kept)."""
        for index, job in enumerate(self._jobs):
            if job.batchable and job.rows <= room and job.key == key:
                del self._jobs[index]
                return job
            if index >= 64:  # do not scan a long queue on every take
                return None
        return None

    def _loop(self) -> None:
        """Executor thread body: run batches for the worker's life; a bug fails its batch, not the thread."""
        while True:
            batch = self._take()
            try:
                self._run_live(batch)
            except Exception as exc:  # NOTE: a dead executor would time out every later request
                log.exception("executor %s: unexpected error", self.name)
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(ApiError(f"executor error: {exc}", status=500))

    def _run_live(self, batch: list[Job]) -> None:
        """Run the jobs of a batch that were not cancelled while they waited."""
        live = [job for job in batch if job.future.set_running_or_notify_cancel()]
        if not live:
            return
        started = time.monotonic()
        for job in live:
            job.started = started
        self._run_batch(live)
        if tracing.ENABLED:
            tracing.batch(self.model, live)
        self._count_retraces()

    def _count_retraces(self) -> None:
        """A trace after warm-up is a latency spike; count it so it shows (it should never happen)."""
        if self._traces is None:
            return
        traces = self._traces()
        if traces > self._traces_seen:
            metrics.record(lambda: metrics.MODEL_RETRACES.labels(self.model).inc(traces - self._traces_seen))
            self._traces_seen = traces

    def _run_batch(self, batch: list[Job]) -> None:
        """One padded call for the batch; on failure, each job alone so one bad input fails only itself."""
        if len(batch) == 1:
            self._run_one(batch[0])
            return
        try:
            inputs = {name: np.concatenate([job.inputs[name] for job in batch]) for name in batch[0].inputs}
            outputs = self.call_padded(batch[0].signature, inputs, sum(job.rows for job in batch), batch)
        except Abandoned as exc:  # nobody waits for these rows: not worth running each job alone either
            finished = time.monotonic()
            for job in batch:
                job.finished = finished
                job.future.set_exception(exc)
            return
        except Exception:
            for job in batch:
                self._run_one(job)
            return
        offset = 0
        finished = time.monotonic()
        for job in batch:
            job.finished = finished
            job.future.set_result({k: v[offset : offset + job.rows] for k, v in outputs.items()})
            offset += job.rows

    def _run_one(self, job: Job) -> None:
        """Run one job and resolve its future with the outputs or the error."""
        try:
            if job.batchable:
                result = self.call_padded(job.signature, job.inputs, job.rows, (job,))
            else:
                BUFFER.add(metrics.BATCH_ROWS, (self.model,), job.rows)
                started = time.perf_counter()
                result = self._run(job.signature, job.inputs)
                self._count_execution(job.rows, 0.0, time.perf_counter() - started, 0.0)
        except Exception as exc:  # handed to the request thread, which maps it to a status
            job.finished = time.monotonic()
            job.future.set_exception(exc)
        else:
            job.finished = time.monotonic()
            job.future.set_result(result)

    def _count_execution(self, rows: int, assembling: float, running: float, splitting: float) -> None:
        """One model execution of `rows` rows, for Triton's batch statistics (execution and inference counts too)."""
        labels = (self.model, self.version, str(rows))
        BUFFER.add(metrics.BATCH_EXECUTIONS, labels, 1)
        BUFFER.add_vector(metrics.BATCH_SECONDS, labels, BATCH_KINDS, (assembling, running, splitting))

    def call_padded(self, signature: str, inputs: dict[str, np.ndarray], rows: int, jobs: Sequence[Job] = ()
                    ) -> dict[str, np.ndarray]:
        """Run `rows` rows in chunks of at most max_batch_size, each padded up to a bucket size when there are buckets.

        Raises Abandoned before a chunk once every one of `jobs` (the jobs these rows are from) is abandoned.
        """
        chunks = []
        for start in range(0, rows, self.max_batch_size):
            if jobs and all(job.abandoned for job in jobs):
                raise Abandoned(f"abandoned by its requester after {start} of {rows} rows")
            assembling = time.perf_counter()
            count = min(self.max_batch_size, rows - start)
            size = bucket_for(count, self.buckets) if self.buckets else count
            chunk = {}
            for name, array in inputs.items():
                part = array[start : start + count]
                if size > count:  # repeat the last row: padding never makes NaN or new shapes
                    part = np.concatenate([part, np.repeat(part[-1:], size - count, axis=0)])
                chunk[name] = part
            BUFFER.add(metrics.BATCH_ROWS, (self.model,), count)
            running = time.perf_counter()
            outputs = self._run(signature, chunk)
            splitting = time.perf_counter()
            for name, value in outputs.items():
                if value.ndim == 0 or value.shape[0] != size:
                    raise ApiError(f"output {name!r} has no batch dimension; cannot split a batch", status=500)
            chunks.append({name: value[:count] for name, value in outputs.items()})
            self._count_execution(count, running - assembling, splitting - running, time.perf_counter() - splitting)
        if len(chunks) == 1:
            return chunks[0]
        return {name: np.concatenate([c[name] for c in chunks]) for name in chunks[0]}
