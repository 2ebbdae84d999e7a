"""Workers forked from the zygote against workers that import TensorFlow themselves (FORKSERVE_ZYGOTE=1 / 0), on the demo.

    .venv/bin/python -m bench.zygote restart [--rounds 7]        # SIGKILL a worker: kill -> its replacement loaded and ready
    .venv/bin/python -m bench.zygote memory [--rounds 3]         # smaps_rollup per worker right after start, 2 and 4 workers
    .venv/bin/python -m bench.zygote publish [--rounds 5]        # a new version renamed in: until every worker serves it
    .venv/bin/python -m bench.zygote soak [--minutes 10]         # both servers under the same mixed traffic, memory every 2 min

Every server serves the bundled models/ (publish: a copy of it) with conf/models.toml, 2 workers
unless said otherwise. restart, publish and soak run a zygote-on and a zygote-off server at once
(restart and publish alternate which side goes first each round, soak's clients alternate request
by request); memory starts one server at a time, alternating. Memory is /proc/PID/smaps_rollup
(KiB): Private_Dirty is what a worker alone holds; Pss_Anon splits the anonymous pages it shares
with its zygote and siblings, and no other program on the machine maps them (Pss also counts
TensorFlow's library pages, which every TensorFlow process on the machine shares). The zygote is
the master's child without a worker state file. Each part prints its medians and writes
zygote-PART.md and the raw figures zygote-PART.json into --out (default /tmp/forkserve-zygote).
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import os
import re
import shutil
import signal
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PIL import Image

from bench.common import save_table
from server.state import WorkerState, read_worker_states
from tests.support.harness import ROOT, Server, group_members, pid_alive, wait_until

SIDES = ("on", "off")
POLL = 0.02  # seconds between looks at the state files and the master's children
DEMO = ROOT / "models"
SOURCE_VERSION = DEMO / "digits" / "2"  # what a publish copies in: the newest demo version, handler and assets included
MEMORY_FIELDS = ("Rss", "Pss", "Pss_Anon", "Private_Dirty", "Private_Clean", "Shared_Dirty")
V2_INFER = "/inference.GRPCInferenceService/ModelInfer"


# --- servers ---------------------------------------------------------------------------------------------------


def demo_server(work: Path, side: str, workers: int = 2, models_dir: Path = DEMO, env: dict[str, str] | None = None) -> Server:
    """A server over `models_dir` with the demo's conf/models.toml, the zygote on or off; not started."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"run-{side}-", dir=work))
    return Server(models_dir=models_dir, run_dir=run_dir, conf_path=ROOT / "conf" / "models.toml", workers=workers,
                  env={"TF_CPP_MIN_LOG_LEVEL": "3", "FORKSERVE_ZYGOTE": "1" if side == "on" else "0", **(env or {})})


def ready_workers(server: Server) -> dict[int, WorkerState]:
    """Live workers whose state file says loaded and ready."""
    states = read_worker_states(server.run_dir)
    return {pid: state for pid, state in states.items() if state.loaded and state.ready and pid_alive(pid)}


def wait_ready(server: Server, count: int, timeout: float = 600.0) -> dict[int, WorkerState]:
    """Wait until exactly `count` live workers are loaded and ready (failing if the master exits)."""

    def ready() -> dict[int, WorkerState] | None:
        assert server.process is not None
        if server.process.poll() is not None:
            raise RuntimeError(f"gunicorn exited with {server.process.returncode}:\n{server.log()[-3000:]}")
        workers = ready_workers(server)
        return workers if len(workers) == count else None

    return wait_until(ready, timeout, f"{count} ready workers", interval=POLL)


def start_all(servers: dict[str, Server]) -> None:
    """Start the servers together and wait until each has all its workers ready."""
    for server in servers.values():
        server.start(timeout=0)
    for server in servers.values():
        wait_ready(server, server.workers)


def stop_all(servers: dict[str, Server]) -> None:
    """SIGTERM each master (KILL what is left of its group after 30 s)."""
    for server in servers.values():
        server.stop()


def server_processes(server: Server) -> set[int]:
    """Every live process of the server's group but the master: workers, the zygote, a fork in progress."""
    assert server.process is not None
    return set(group_members(server.process.pid)) - {server.process.pid}


def parent(pid: int) -> int:
    """A process's parent pid (0 once it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def zygote_pid(server: Server) -> int | None:
    """The master's child that has no worker state file: the zygote (None with the zygote off)."""
    assert server.process is not None
    states = read_worker_states(server.run_dir)
    others = [pid for pid in server_processes(server) if pid not in states and parent(pid) == server.process.pid]
    return others[0] if len(others) == 1 else None


def forks(server: Server) -> dict[str, int]:
    """forkserve_worker_forks_total by `by` (zygote, master), from /metrics."""
    text = server.get("/metrics").text
    pattern = r'^forkserve_worker_forks_total\{[^}]*by="(\w+)"[^}]*\} (\S+)'
    return {match[1]: int(float(match[2])) for match in re.finditer(pattern, text, re.M)}


def warnings(server: Server) -> list[str]:
    """The log's warning, error and traceback lines (gunicorn's and forkserve's)."""
    marks = ("[WARNING]", "[ERROR]", "[CRITICAL]", "Traceback", "warning:", "Error")
    return [line for line in server.log().splitlines() if any(mark in line for mark in marks)]


def order(round_number: int) -> tuple[str, ...]:
    """on, off in even rounds; off, on in odd ones."""
    return SIDES if round_number % 2 == 0 else SIDES[::-1]


# --- memory ----------------------------------------------------------------------------------------------------


def memory(pid: int) -> dict[str, int]:
    """MEMORY_FIELDS of one process in KiB, from /proc/PID/smaps_rollup."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0])
    return {name: fields.get(name, 0) for name in MEMORY_FIELDS}


def server_memory(server: Server) -> dict[str, Any]:
    """smaps_rollup of each ready worker, the zygote and the master, and the whole server's sums."""
    assert server.process is not None
    workers = {pid: memory(pid) for pid in sorted(ready_workers(server))}
    zygote = zygote_pid(server)
    parts = [*workers.values(), memory(server.process.pid), *([memory(zygote)] if zygote else [])]
    return {"workers": workers, "zygote": memory(zygote) if zygote else None, "master": memory(server.process.pid),
            "whole": {name: sum(part[name] for part in parts) for name in MEMORY_FIELDS}}


def mib(kib: float) -> str:
    """KiB as MiB, no decimals."""
    return f"{kib / 1024:.0f}"


# --- the machine -----------------------------------------------------------------------------------------------


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine so far, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def load_average() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def descendants() -> set[int]:
    """This process and every live process below it (the servers, their workers and zygotes, wrk)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2])
            except OSError:
                continue
    mine, grew = {os.getpid()}, True
    while grew:
        found = {pid for pid, parent in parents.items() if parent in mine} - mine
        mine |= found
        grew = bool(found)
    return mine


def others_busy() -> list[str]:
    """Other people's python, gunicorn, wrk and pytest processes now (the shared machine's neighbours)."""
    mine, found = descendants(), collections.Counter()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in mine:
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            for name in ("pytest", "gunicorn", "wrk", "h2load", "python"):
                if name in command:
                    found[name] += 1
                    break
    return [f"{count} {name}" for name, count in found.most_common()]


@dataclass
class Conditions:
    """The machine over one part: load averages, how busy both cores were, who else ran."""

    started: float = field(default_factory=time.time)
    jiffies: tuple[int, int] = field(default_factory=cpu_jiffies)
    load_before: str = field(default_factory=lambda: load_average())
    neighbours: list[str] = field(default_factory=others_busy)

    def finish(self) -> dict[str, Any]:
        """The conditions from the start until now."""
        busy, total = cpu_jiffies()
        return {"seconds": round(time.time() - self.started), "loadavg_before": self.load_before,
                "loadavg_after": load_average(),
                "machine_cpu_busy": round((busy - self.jiffies[0]) / max(total - self.jiffies[1], 1), 3),
                "neighbours_at_start": self.neighbours, "neighbours_at_end": others_busy()}


def conditions_line(conditions: dict[str, Any]) -> str:
    """One line for a results table's footer."""
    return (f"{conditions['seconds']} s; load average {conditions['loadavg_before']} -> {conditions['loadavg_after']}; "
            f"both cores {conditions['machine_cpu_busy'] * 100:.0f} % busy on average (everything, ours included); "
            f"other people's processes at start: {', '.join(conditions['neighbours_at_start']) or 'none'}, "
            f"at end: {', '.join(conditions['neighbours_at_end']) or 'none'}")


def save(out: Path, part: str, raw: dict[str, Any], table: str) -> None:
    """zygote-PART.json (raw figures) and zygote-PART.md (the table) into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"zygote-{part}.json").write_text(json.dumps(raw, indent=1, default=str))
    save_table(out, f"zygote-{part}.md", table)


def median_row(values: list[float], digits: int = 2) -> str:
    """median [min-max]."""
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


# --- 1. a killed worker's replacement ---------------------------------------------------------------------------


def new_process(server: Server, known: set[int]) -> int | None:
    """A process of the server not in `known` (a fork for a new worker under way), or None."""
    fresh = server_processes(server) - known
    return min(fresh) if fresh else None


def replace_one(server: Server) -> dict[str, Any]:
    """SIGKILL the lowest-pid worker; seconds from the kill until a fork for its replacement, then until it is ready."""
    before = wait_ready(server, server.workers)
    known = server_processes(server)
    victim = min(before)
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: new_process(server, known), 60, "the replacement's fork", interval=POLL / 4)
    forked = time.monotonic()

    def replaced() -> set[int]:
        ready = ready_workers(server)
        return set(ready) - set(before) if len(ready) == server.workers else set()

    replacement = wait_until(replaced, 600, "the replacement to be ready", interval=POLL).pop()
    ready = time.monotonic()
    return {"victim": victim, "replacement": replacement, "fork_s": forked - killed, "ready_s": ready - killed,
            "readyz": server.get("/readyz").status_code}


def interleaved_rounds(servers: dict[str, Server], rounds: int, step: Any, describe: Any) -> tuple[dict, dict, dict]:
    """Start both servers, run `step(side, round)` on each side per round (the first side alternating), stop them.

    Returns the runs per side, the fork counts and the warnings each server logged.
    """
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    try:
        start_all(servers)
        time.sleep(3)  # NOTE: settle after the start, not a wait for readiness (start_all waits for that)
        for round_number in range(rounds):
            for side in order(round_number):
                run = step(side, round_number)
                runs[side].append(run)
                print(f"round {round_number + 1} {describe({**run, 'side': side})}", flush=True)
                time.sleep(2)
        counted = {side: forks(server) for side, server in servers.items()}
        logged = {side: warnings(server) for side, server in servers.items()}
    finally:
        stop_all(servers)
    return runs, counted, logged


def restart_part(work: Path, rounds: int) -> tuple[dict[str, Any], str]:
    """Part 1: `rounds` SIGKILLs per side, the sides alternating, both servers up at once."""
    conditions = Conditions()
    servers = {side: demo_server(work, side) for side in SIDES}
    runs, counted, logged = interleaved_rounds(
        servers, rounds, lambda side, _: replace_one(servers[side]),
        lambda run: f"restart {run['side']:3s} fork {run['fork_s'] * 1000:6.1f} ms ready {run['ready_s']:6.2f} s "
                    f"/readyz {run['readyz']}")
    raw = {"runs": runs, "forks": counted, "warnings": logged, "conditions": conditions.finish()}
    lines = ["| zygote | kill -> replacement forked, ms | kill -> replacement loaded and ready, s | /readyz after | "
             "forks by zygote / master (whole run) |", "|---|---|---|---|---|"]
    for side in SIDES:
        fork_ms = [run["fork_s"] * 1000 for run in runs[side]]
        lines.append(f"| {side} | {median_row(fork_ms, 1)} | {median_row([run['ready_s'] for run in runs[side]])} | "
                     f"{', '.join(sorted({str(run['readyz']) for run in runs[side]}))} | "
                     f"{counted[side].get('zygote', 0)} / {counted[side].get('master', 0)} |")
    ratio = statistics.median(r["ready_s"] for r in runs["on"]) / statistics.median(r["ready_s"] for r in runs["off"])
    lines += ["", f"{rounds} rounds per side, median [min-max]; on / off (ready): {ratio:.2f}",
              "", f"Machine: {conditions_line(raw['conditions'])}"]
    return raw, "\n".join(lines) + "\n"


# --- 2. memory right after start ------------------------------------------------------------------------------


def start_and_measure(work: Path, side: str, workers: int) -> dict[str, Any]:
    """Start one server alone, time it until every worker is ready, take its memory a second later, stop it."""
    server = demo_server(work, side, workers)
    started = time.monotonic()
    try:
        server.start(timeout=0)
        wait_ready(server, workers)
        ready = time.monotonic() - started
        time.sleep(1)
        measured = server_memory(server)
        measured.update(start_s=ready, forks=forks(server), warnings=warnings(server))
    finally:
        server.stop()
    return measured


def memory_part(work: Path, rounds: int, counts: tuple[int, ...]) -> tuple[dict[str, Any], str]:
    """Part 2: per worker and whole-server memory right after start, `rounds` starts per side and worker count."""
    conditions = Conditions()
    runs: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for workers in counts:
        for round_number in range(rounds):
            for side in order(round_number):
                run = start_and_measure(work, side, workers)
                runs[f"{side}-{workers}"].append(run)
                per_worker = [m["Private_Dirty"] for m in run["workers"].values()]
                print(f"memory {workers} workers round {round_number + 1} {side:3s} start {run['start_s']:5.1f} s "
                      f"worker Private_Dirty {' '.join(mib(v) for v in per_worker)} MiB "
                      f"whole Pss {mib(run['whole']['Pss'])} MiB Pss_Anon {mib(run['whole']['Pss_Anon'])} MiB "
                      f"forks {run['forks']}", flush=True)
    raw = {"runs": dict(runs), "conditions": conditions.finish()}
    return raw, memory_table(runs, rounds, raw["conditions"])


def memory_table(runs: dict[str, list[dict[str, Any]]], rounds: int, conditions: dict[str, Any]) -> str:
    """Medians over the starts (each start: its workers' median) of the per-worker and whole-server figures, MiB."""
    lines = ["| workers | zygote | start, s | worker Private_Dirty | worker Pss_Anon | worker Pss | worker Rss | "
             "zygote Private_Dirty / Pss | whole server Pss | whole server Pss_Anon |", "|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(runs, key=lambda k: (int(k.split("-")[1]), k)):
        side, workers = key.split("-")
        starts = runs[key]

        def per_worker(name: str) -> str:
            return mib(statistics.median(statistics.median(m[name] for m in run["workers"].values()) for run in starts))

        zygotes = [run["zygote"] for run in starts if run["zygote"]]
        zygote = (f"{mib(statistics.median(z['Private_Dirty'] for z in zygotes))} / {mib(statistics.median(z['Pss'] for z in zygotes))}"
                  if zygotes else "-")
        lines.append(f"| {workers} | {side} | {statistics.median(run['start_s'] for run in starts):.1f} | "
                     f"{per_worker('Private_Dirty')} | {per_worker('Pss_Anon')} | {per_worker('Pss')} | {per_worker('Rss')} | "
                     f"{zygote} | {mib(statistics.median(run['whole']['Pss'] for run in starts))} | "
                     f"{mib(statistics.median(run['whole']['Pss_Anon'] for run in starts))} |")
    lines += ["", f"MiB; {rounds} starts per row (one server at a time, the sides alternating), median; "
              "start: from launching gunicorn until every worker's state file says loaded and ready; "
              "whole server: master + zygote + workers", "", f"Machine: {conditions_line(conditions)}"]
    return "\n".join(lines) + "\n"


# --- 3. a publish ------------------------------------------------------------------------------------------------


def rename_in(model_dir: Path, version: int) -> float:
    """Copy SOURCE_VERSION into a hidden directory beside the versions, rename it to `version`; the rename's time."""
    staging = model_dir / f".zygote-bench-{version}"
    shutil.copytree(SOURCE_VERSION, staging)
    os.rename(staging, model_dir / str(version))
    return time.monotonic()


def rename_out(model_dir: Path, version: int) -> float:
    """Take `version` out of the repository at once (rename to a hidden name), then delete it; the rename's time."""
    hidden = model_dir / f".zygote-bench-gone-{version}"
    os.rename(model_dir / str(version), hidden)
    renamed = time.monotonic()
    shutil.rmtree(hidden)
    return renamed


def roll_times(server: Server, versions: list[int], since: float, known: set[int], timeout: float = 600.0) -> dict[str, float]:
    """Seconds from `since` until the first new worker forks, the first worker serves `versions`, then all of them do."""
    marks: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = time.monotonic()
        if "fork_s" not in marks and new_process(server, known) is not None:
            marks["fork_s"] = now - since
        ready = ready_workers(server)
        serving = [pid for pid, state in ready.items() if sorted(state.serving("digits")) == versions]
        if serving and "first_s" not in marks:
            marks["first_s"] = now - since
        if len(serving) == len(ready) == server.workers:
            marks["all_s"] = now - since
            return marks
        time.sleep(POLL)
    raise TimeoutError(f"the workers did not all serve digits {versions} in {timeout} s:\n{server.log()[-3000:]}")


def publish_once(server: Server, model_dir: Path, version: int) -> dict[str, Any]:
    """Publish `version` and time the roll-out; then take it out again and time that roll-out too."""
    wait_ready(server, server.workers)
    known = server_processes(server)
    published = roll_times(server, [1, 2, version], rename_in(model_dir, version), known)
    served = server.get("/v1/models/digits").json()
    wait_ready(server, server.workers)
    time.sleep(1)
    known = server_processes(server)
    removed = roll_times(server, [1, 2], rename_out(model_dir, version), known)
    return {"version": version, "publish": published, "remove": removed,
            "status_versions": sorted(int(v["version"]) for v in served.get("model_version_status", []))}


def publish_part(work: Path, rounds: int, poll_interval: str) -> tuple[dict[str, Any], str]:
    """Part 3: `rounds` publishes per side into each side's own copy of the repository, the sides alternating."""
    conditions = Conditions()
    repositories = {side: work / f"models-{side}" for side in SIDES}
    for repository in repositories.values():
        shutil.copytree(DEMO, repository)
    servers = {side: demo_server(work, side, models_dir=repositories[side], env={"FORKSERVE_POLL_INTERVAL": poll_interval})
               for side in SIDES}
    runs, counted, logged = interleaved_rounds(
        servers, rounds, lambda side, round_number: publish_once(servers[side], repositories[side] / "digits", 3 + round_number),
        lambda run: f"publish {run['side']:3s} v{run['version']} {run['publish']} status {run['status_versions']} "
                    f"| removed {run['remove']}")
    raw = {"runs": runs, "forks": counted, "warnings": logged, "poll_interval": poll_interval,
           "conditions": conditions.finish()}
    return raw, publish_table(runs, counted, raw)


def publish_table(runs: dict[str, list[dict[str, Any]]], counted: dict[str, dict[str, int]], raw: dict[str, Any]) -> str:
    """Medians [min-max] of the publish and removal roll-outs, per side."""
    lines = ["| zygote | roll-out | -> first new worker forked, s | -> first worker serves it, s | "
             "-> every worker serves it, s |", "|---|---|---|---|---|"]
    for side in SIDES:
        for kind in ("publish", "remove"):
            marks = [run[kind] for run in runs[side]]
            lines.append(f"| {side} | {kind} | {median_row([m['fork_s'] for m in marks])} | "
                         f"{median_row([m['first_s'] for m in marks])} | {median_row([m['all_s'] for m in marks])} |")
    ratio = (statistics.median(r["publish"]["all_s"] for r in runs["on"])
             / statistics.median(r["publish"]["all_s"] for r in runs["off"]))
    lines += ["", f"{len(runs['on'])} publishes per side, median [min-max], from the rename; "
              f"FORKSERVE_POLL_INTERVAL={raw['poll_interval']}; on / off (every worker serves the new version): {ratio:.2f}; "
              f"forks by zygote / master over the run: on {counted['on']}, off {counted['off']}",
              "", f"Machine: {conditions_line(raw['conditions'])}"]
    return "\n".join(lines) + "\n"


# --- 4. memory under traffic ----------------------------------------------------------------------------------


def digit_pixels() -> list[list[list[list[float]]]]:
    """examples/digit.png as the plain model's input: 8x8 grayscale in [0, 1], shape [1, 8, 8, 1]."""
    with Image.open(ROOT / "examples" / "digit.png") as image:
        pixels = np.asarray(image.convert("L").resize((8, 8), Image.BOX), dtype=np.float32) / 255
    return pixels.reshape(1, 8, 8, 1).tolist()


def request_kinds() -> dict[str, Callable[[Server, Any, Any], bool]]:
    """Each kind of request of the soak: name -> send(server, requests session, gRPC ModelInfer stub) -> answered OK."""
    from server.protocols.v2.protos import open_inference_pb2

    png = base64.b64encode((ROOT / "examples" / "digit.png").read_bytes()).decode()
    pixels = digit_pixels()
    infer = open_inference_pb2.ModelInferRequest(model_name="digits", model_version="1")
    infer.inputs.add(name="image", datatype="FP32", shape=[1, 8, 8, 1])
    infer.raw_input_contents.append(np.asarray(pixels, dtype="<f4").tobytes())
    infer_bytes = infer.SerializeToString()
    v2_body = {"inputs": [{"name": "image", "shape": [1, 8, 8, 1], "datatype": "FP32", "data": pixels}]}

    def post(path: str, body: dict[str, Any]) -> Callable[[Server, Any, Any], bool]:
        return lambda server, session, stub: session.post(server.url + path, json=body, timeout=30).status_code == 200

    return {
        "rest_handler": post("/v1/models/digits:predict", {"image": png}),
        "rest_plain": post("/v1/models/digits/versions/1:predict", {"instances": [{"b64": png}]}),
        "v2_rest": post("/v2/models/digits/versions/1/infer", v2_body),
        "v2_grpc": lambda server, session, stub: bool(stub(infer_bytes, timeout=30)),
    }


def client(servers: dict[str, Server], stop: threading.Event, counts: collections.Counter, pause: float) -> None:
    """One client: every request kind in turn, each to both servers (the order flips each time), until `stop`."""
    import grpc
    import requests

    kinds = request_kinds()
    sessions = {side: requests.Session() for side in servers}
    channels = {side: grpc.insecure_channel(server.grpc_target) for side, server in servers.items()}
    stubs = {side: channel.unary_unary(V2_INFER) for side, channel in channels.items()}
    flip = False
    try:
        while not stop.is_set():
            for kind, send in kinds.items():
                for side in (SIDES[::-1] if flip else SIDES):
                    try:
                        ok = send(servers[side], sessions[side], stubs[side])
                    except Exception:  # noqa: BLE001 - a refused or failed call is counted, the soak goes on
                        ok = False
                    counts[(side, kind, ok)] += 1
                flip = not flip
                stop.wait(pause)
    finally:
        for channel in channels.values():
            channel.close()


def soak_sample(servers: dict[str, Server]) -> dict[str, Any]:
    """Each server's per-worker and whole memory now."""
    return {side: server_memory(server) for side, server in servers.items()}


def soak_part(work: Path, minutes: float, every: float, clients: int, pause: float) -> tuple[dict[str, Any], str]:
    """Part 4: both servers at once under the same traffic for `minutes`; memory at start and every `every` minutes."""
    conditions = Conditions()
    servers = {side: demo_server(work, side) for side in SIDES}
    counts: collections.Counter = collections.Counter()
    samples: list[dict[str, Any]] = []
    stop = threading.Event()
    threads = [threading.Thread(target=client, args=(servers, stop, counts, pause), daemon=True) for _ in range(clients)]
    try:
        start_all(servers)
        time.sleep(3)
        began = time.monotonic()
        samples.append({"minute": 0.0, **soak_sample(servers)})
        for thread in threads:
            thread.start()
        checkpoints = [every * (i + 1) for i in range(int(round(minutes / every)))]
        for checkpoint in checkpoints:
            time.sleep(max(0.0, began + checkpoint * 60 - time.monotonic()))
            samples.append({"minute": checkpoint, **soak_sample(servers)})
            print(f"soak {checkpoint:g} min: " + "; ".join(
                f"{side} Private_Dirty {' '.join(mib(m['Private_Dirty']) for m in samples[-1][side]['workers'].values())} MiB"
                for side in SIDES) + f"; requests {sum(counts.values())}", flush=True)
        elapsed = time.monotonic() - began
        stop.set()
        for thread in threads:
            thread.join(60)
        counted = {side: forks(server) for side, server in servers.items()}
        logged = {side: warnings(server) for side, server in servers.items()}
    finally:
        stop.set()
        stop_all(servers)
    requests_by = {f"{side} {kind} {'ok' if ok else 'failed'}": n for (side, kind, ok), n in sorted(counts.items())}
    raw = {"samples": samples, "requests": requests_by, "seconds": elapsed, "clients": clients, "pause": pause,
           "forks": counted, "warnings": logged, "conditions": conditions.finish()}
    return raw, soak_table(raw)


def soak_table(raw: dict[str, Any]) -> str:
    """Each worker's Private_Dirty (MiB) at every sample, the sides' medians and their ratio, and the traffic."""
    samples = raw["samples"]
    pids = {side: list(samples[0][side]["workers"]) for side in SIDES}
    header = " | ".join(f"{s['minute']:g} min" for s in samples)
    lines = [f"| zygote | worker | {header} |", "|---|---|" + "---|" * len(samples)]
    for side in SIDES:
        for pid in pids[side]:
            cells = " | ".join(mib(s[side]["workers"][pid]["Private_Dirty"]) if pid in s[side]["workers"] else "gone"
                               for s in samples)
            lines.append(f"| {side} | {pid} | {cells} |")
        medians = " | ".join(mib(statistics.median(m["Private_Dirty"] for m in s[side]["workers"].values())) for s in samples)
        lines.append(f"| {side} | median | {medians} |")
    ratios = " | ".join(
        f"{statistics.median(m['Private_Dirty'] for m in s['on']['workers'].values()) / statistics.median(m['Private_Dirty'] for m in s['off']['workers'].values()) * 100:.0f} %"
        for s in samples)
    lines.append(f"| on / off | median | {ratios} |")
    whole = " | ".join(f"{mib(s['on']['whole']['Pss'])} / {mib(s['off']['whole']['Pss'])}" for s in samples)
    lines += [f"| whole Pss on / off | | {whole} |", ""]
    totals = collections.Counter()
    for key, n in raw["requests"].items():
        side, _kind, outcome = key.split()
        totals[(side, outcome)] += n
    lines.append(f"Private_Dirty, MiB, per worker; traffic for {raw['seconds'] / 60:.1f} min from {raw['clients']} clients "
                 f"(each: REST predict through v2's handler, REST predict of v1, V2 REST infer, V2 gRPC infer, each to both "
                 f"servers, the order flipping, {raw['pause'] * 1000:.0f} ms pause after each pair): "
                 + ", ".join(f"{side} {totals[(side, 'ok')]} answered ({totals[(side, 'ok')] / raw['seconds']:.0f}/s), "
                             f"{totals[(side, 'failed')]} failed" for side in SIDES))
    lines += ["", f"Machine: {conditions_line(raw['conditions'])}"]
    return "\n".join(lines) + "\n"


# --- the command line ------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("restart", "memory", "publish", "soak"))
    parser.add_argument("--rounds", type=int, default=None, help="restart 7, memory 3, publish 5 by default")
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4], help="memory: the worker counts")
    parser.add_argument("--poll-interval", default="0.5", help="publish: FORKSERVE_POLL_INTERVAL of both servers")
    parser.add_argument("--minutes", type=float, default=10.0, help="soak: how long the traffic runs")
    parser.add_argument("--every", type=float, default=2.0, help="soak: minutes between memory samples")
    parser.add_argument("--clients", type=int, default=4, help="soak: client threads")
    parser.add_argument("--pause", type=float, default=0.01, help="soak: seconds each client waits after each pair")
    parser.add_argument("--out", type=Path, default=Path("/tmp/forkserve-zygote"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="forkserve-zygote-") as scratch:
        work = Path(scratch)
        if args.part == "restart":
            raw, table = restart_part(work, args.rounds or 7)
        elif args.part == "memory":
            raw, table = memory_part(work, args.rounds or 3, tuple(args.workers))
        elif args.part == "publish":
            raw, table = publish_part(work, args.rounds or 5, args.poll_interval)
        else:
            raw, table = soak_part(work, args.minutes, args.every, args.clients, args.pause)
    save(args.out, args.part, raw, table)


if __name__ == "__main__":
    main()
