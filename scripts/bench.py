"""The platform's benchmark: backlog, Spark fold vs reference fold, latency.

    python scripts/bench.py                                   # everything, 12,000 messages
    python scripts/bench.py --parts backlog --messages 12000 --messages 120000
    python scripts/bench.py --parts fold --fold-messages 12000
    python scripts/bench.py --parts latency --latency-rates 0.42,4.2 --latency-seconds 120

Prints one table of every figure with its target and pass/fail, and writes the same as
`results.json` and a plot `bench.png` into `--out` (default bench-out/, not committed).

backlog  The embedded queue preloaded by the simulator with N messages, then the platform run
         until every master is current (every landed batch folded and the model refreshed):
         wall time (not counting the preload), messages/s, and the peak memory of the whole
         process tree (Python, the Spark JVM and its Python workers; sum of PSS, and of RSS).
         `--mode inprocess` (default): sensor ticks and runs in one process through Dagster's
         APIs, one Spark session for all runs; batches are landed by a thread while runs
         run, within the daemon's backpressure (`--landing serial`: land, run, land...).
         `--mode daemon`: a real dagster-daemon
         launching each run in its own process with its own Spark driver, as scripts/run.sh.
fold     The same simulated feed landed and classified (raw_messages, message_items), then
         the Spark fold (`fold_step` over every batch, one step) timed alone, against the
         pure-Python reference fold (`fold_master` per master, one process) on the same items:
         items/s of each and the ratio Spark / reference, measured in the same run.
latency  dagster-daemon running (sensor every SIS_SENSOR_INTERVAL_SECONDS, 1 s here) while
         `sis-feed publish --rate R` publishes for --latency-seconds; per message, the time
         from its put on the queue (put_time) to the Delta commit of the fold step that
         applied it (the fold_steps commit's timestamp in the Delta log): p50, p95, max.

Each measurement runs in its own child process (so one Spark driver at a time, and peak memory
is that measurement's alone). The machine's load average is recorded with every figure. The
platform runs on its defaults, except for SIS_* settings in the caller's environment, which
every measurement takes (a new data folder each, whatever SIS_DATA_DIR says):

    SIS_BATCH_MAX_BYTES=268435456 SIS_BATCH_MAX_SECONDS=40 SIS_LEASE_SECONDS=120 \
        python scripts/bench.py --parts backlog --messages 1200000 --batch 200000
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import platform
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# The performance targets (2 cores, 24 GB).
TARGET_12K_S = 60.0
TARGET_1M2_S = 15 * 60.0
TARGET_GROWTH = 11.0  # wall(1.2 M) / wall(120 k)
TARGET_PEAK_MIB = 4096.0
TARGET_FOLD_RATIO = 1.0
TARGET_P50_S = 10.0
TARGET_P95_S = 20.0

BASE_ENV = {
    "SIS_SPARK_MASTER": "local[*]",
    "SIS_GET_WAIT_SECONDS": "0.2",
    # The caller's own SIS_* settings win (e.g. SIS_SPARK_CONF to have Spark write an event log
    # of each measurement's jobs, or SIS_BATCH_MAX_* and SIS_LEASE_SECONDS for other batch
    # bounds), except the data folder: each measurement has a new one.
    **{k: v for k, v in os.environ.items() if k.startswith("SIS_") and k != "SIS_DATA_DIR"},
}


# --- measuring ---------------------------------------------------------------------------------


class PeakMemory(threading.Thread):
    """Samples the memory of a process and all its descendants every 0.25 s: the sum of RSS
    (counts pages shared between forked Python workers once per worker: an upper bound) and
    the sum of PSS (shared pages divided among their sharers: the tree's real footprint)."""

    def __init__(self, root: psutil.Process) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.peak = 0  # RSS sum
        self.peak_pss = 0
        self.at_peak: dict[str, int] = {}  # PSS by process kind at the PSS peak
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.25):
            rss = pss = 0
            kinds: dict[str, int] = {}
            try:
                tree = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                continue
            for p in tree:
                try:
                    info = p.memory_full_info()
                    name = (
                        "java"
                        if p.name().startswith("java")
                        else (
                            "spark python worker"
                            if "pyspark" in " ".join(p.cmdline()[:4])
                            else "python / other"
                        )
                    )
                except psutil.Error:
                    continue
                rss += info.rss
                pss += getattr(info, "pss", info.rss)
                kinds[name] = kinds.get(name, 0) + getattr(info, "pss", info.rss)
            self.peak = max(self.peak, rss)
            if pss > self.peak_pss:
                self.peak_pss, self.at_peak = pss, kinds


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def run_child(args: list[str], log: Path, timeout: float) -> tuple[dict[str, Any], float]:
    """Run `bench.py --worker ...` in a child process; its JSON result (with the tree's peak
    memory added) and the peak PSS of its process tree in MiB."""
    result_file = Path(tempfile.mkstemp(prefix="sis-bench-", suffix=".json")[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *args, "--result", str(result_file)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        sampler = PeakMemory(psutil.Process(proc.pid))
        sampler.start()
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = -1
        finally:
            sampler.stop.set()
            sampler.join()
    try:
        if code != 0:
            raise RuntimeError(f"benchmark worker {args[:3]} failed ({code}): see {log}")
        result = json.loads(result_file.read_text())
        result["peak_rss_sum_mib"] = round(sampler.peak / 2**20)
        result["peak_pss_by_kind_mib"] = {k: round(v / 2**20) for k, v in sampler.at_peak.items()}
        return result, sampler.peak_pss / 2**20
    finally:
        result_file.unlink(missing_ok=True)


# --- Delta tables read without Spark (small tables: fold_steps, model_steps) -------------------


def delta_commits(table: Path) -> list[tuple[int, float, list[dict[str, Any]]]]:
    """Every commit of a Delta table from its JSON log: (version, commit time as epoch seconds,
    rows it added). Enough for the platform's small append-only bookkeeping tables."""
    import pyarrow.parquet as pq

    commits = []
    for log in sorted((table / "_delta_log").glob("*.json")):
        version = int(log.stem)
        timestamp = None
        rows: list[dict[str, Any]] = []
        for line in log.read_text().splitlines():
            action = json.loads(line)
            if "commitInfo" in action:
                timestamp = action["commitInfo"]["timestamp"] / 1000.0
            elif "add" in action:
                rows += pq.read_table(table / action["add"]["path"]).to_pylist()
        commits.append((version, timestamp if timestamp is not None else log.stat().st_mtime, rows))
    return commits


def fold_commits(lake: Path) -> list[tuple[float, dict[str, Any]]]:
    """(commit time, fold_steps row) for every committed fold step."""
    return [(ts, row) for _, ts, rows in delta_commits(lake / "fold_steps") for row in rows]


def masters_current(data: Path) -> tuple[bool, str]:
    """Every landed batch folded and the model refreshed to the last fold step."""
    from sis_platform.landing import LandingZone, batch_seq_of

    keys = LandingZone(data / "landing").keys()
    if not keys:
        return False, "nothing landed"
    last = batch_seq_of(keys[-1])
    folded = max((int(r["last_batch_seq"]) for _, r in fold_commits(data / "lake")), default=0)
    model = max(
        (
            int(r["fold_step"])
            for _, _, rows in delta_commits(data / "lake" / "model_steps")
            for r in rows
        ),
        default=0,
    )
    ok = folded == last and model == last
    return ok, f"last batch {last}, folded to {folded}, model at {model}"


# --- workers (each in its own process) ---------------------------------------------------------


def preload(data: Path, messages: int, seed: int) -> int:
    from sis_platform.queues.embedded import EmbeddedQueue
    from sis_platform.simulator.generator import generate_feed

    queue = EmbeddedQueue(data / "queue")
    n = 0
    chunk: list[tuple[bytes, str | None]] = []
    with queue.producer() as producer:
        for m in generate_feed(seed=seed, messages=messages):
            chunk.append((m.body, m.message_id))
            if len(chunk) == 10_000:
                n += producer.put_many(chunk)
                chunk = []
        n += producer.put_many(chunk)
    return n


def landed_and_classified(data: Path, env: dict[str, str], messages: int, seed: int) -> Any:
    """The simulated feed preloaded, landed, logged and classified (raw_messages and
    message_items of every batch), nothing folded: a Harness over it."""
    import dagster as dg

    from tests.harness import Harness

    preload(data, messages, seed)
    h = Harness(data, env)
    h.drain()
    job = h.defs.resolve_job_def("process_batch")
    for key in h.requested:
        assert job.execute_in_process(
            partition_key=key,
            instance=h.instance,
            asset_selection=[dg.AssetKey("raw_messages"), dg.AssetKey("message_items")],
        ).success
    return h


def run_inprocess(
    data: Path, env: dict[str, str], timings: dict[str, Any], *, overlap: bool = True
) -> int:
    """Sensor ticks and the runs they request, in this process, on one Spark session.

    `overlap` (the default): as under the daemon, batches are landed while runs run. A thread
    ticks the sensor whenever fewer than SIS_MAX_RUNS_IN_FLIGHT requested runs wait or run
    (the daemon's backpressure, with its sensor interval taken as zero), and this thread runs
    the requested batches in order. Without it, land one batch, run it, land the next."""
    import dagster as dg

    from sis_platform.queues.embedded import EmbeddedQueue
    from tests.harness import Harness

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    def record(done: dg.ExecuteInProcessResult, seconds: float) -> None:
        timings.setdefault("run_s", []).append(round(seconds, 1))
        # Each step's own duration, run by run: which step grows with the lake.
        for event in done.get_step_success_events():
            timings.setdefault("step_s", {}).setdefault(event.step_key, []).append(
                round(event.event_specific_data.duration_ms / 1000, 1)
            )

    if not overlap:
        h = Harness(data, env)
        runs = 0
        while True:
            t0 = time.monotonic()
            result = h.tick()
            timings["landing_s"] = timings.get("landing_s", 0.0) + time.monotonic() - t0
            if isinstance(result, dg.SkipReason):
                return runs
            for request in result.run_requests or []:
                t0 = time.monotonic()
                record(h.run(request.partition_key), time.monotonic() - t0)
                runs += 1

    # Two threads write the instance: its storage on disk, not in memory.
    (data / "dagster").mkdir()
    h = Harness(data, env, instance=dg.DagsterInstance.local_temp(str(data / "dagster")))
    limit = h.resources["landing"].max_runs_in_flight
    queue = EmbeddedQueue(data / "queue")
    changed = threading.Condition()
    state: dict[str, Any] = {"ran": 0, "landed_all": False, "error": None}

    def land() -> None:
        try:
            while True:
                with changed:
                    changed.wait_for(lambda: len(h.requested) - state["ran"] < limit)
                    ran = state["ran"]
                t0 = time.monotonic()
                result = h.tick()
                timings["landing_s"] = timings.get("landing_s", 0.0) + time.monotonic() - t0
                with changed:
                    changed.notify_all()
                if isinstance(result, dg.SkipReason):
                    if not queue.depth():
                        return
                    # Held back by the sensor's own backpressure (the last batch was not full):
                    # the next tick after the run in flight ends, not a tick a moment from now.
                    with changed:
                        changed.wait_for(lambda ran=ran: state["ran"] != ran)
        except BaseException as error:  # re-raised by the running thread
            state["error"] = error
        finally:
            with changed:
                state["landed_all"] = True
                changed.notify_all()

    lander = threading.Thread(target=land, name="bench-landing", daemon=True)
    lander.start()
    waited = 0.0
    while True:
        t0 = time.monotonic()
        with changed:
            changed.wait_for(lambda: len(h.requested) > state["ran"] or state["landed_all"])
            if state["error"] is not None:
                raise RuntimeError("landing failed") from state["error"]
            if len(h.requested) == state["ran"]:
                break
            key = h.requested[state["ran"]]
        waited += time.monotonic() - t0
        t0 = time.monotonic()
        record(h.run(key), time.monotonic() - t0)
        with changed:
            state["ran"] += 1
            changed.notify_all()
    lander.join()
    # Time the runs waited for a batch to be landed (landing not hidden behind a run).
    timings["waited_for_landing_s"] = round(waited, 1)
    return int(state["ran"])


def start_daemon(data: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    home = data / "dagster"
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "deploy" / "dagster.yaml", home / "dagster.yaml")
    full_env = {**os.environ, **env, "DAGSTER_HOME": str(home)}
    os.environ["DAGSTER_HOME"] = str(home)
    # The instance's SQLite storage is created here, before the daemon starts: two processes
    # creating it at once can leave it with two schema heads.
    import dagster as dg

    dg.DagsterInstance.get().get_run_records(limit=1)
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                str(Path(sys.executable).parent / "dagster-daemon"),
                "run",
                "-w",
                str(REPO / "workspace.yaml"),
            ],
            cwd=REPO,
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_daemon(daemon: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait()
    except ProcessLookupError:
        pass


def failed_runs() -> int:
    import dagster as dg

    instance = dg.DagsterInstance.get()
    return len(
        instance.get_run_records(
            dg.RunsFilter(job_name="process_batch", statuses=[dg.DagsterRunStatus.FAILURE])
        )
    )


def run_daemon(data: Path, env: dict[str, str], log: Path) -> int:
    from sis_platform.queues.embedded import EmbeddedQueue

    queue = EmbeddedQueue(data / "queue")
    daemon = start_daemon(data, env, log)
    try:
        while True:
            time.sleep(1.0)
            if daemon.poll() is not None:
                raise RuntimeError(f"dagster-daemon exited ({daemon.returncode}): see {log}")
            if failed_runs():
                raise RuntimeError(f"a batch run failed: see {data / 'dagster'}")
            if not queue.depth() and masters_current(data)[0]:
                break
    finally:
        stop_daemon(daemon)
    return len(list((data / "landing" / "batches").glob("*.parquet")))


@contextmanager
def spark_for(args: argparse.Namespace, env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The measurement's environment. `--spark connect`: with a sis-spark-connect server of its
    own (a child of this process, so its memory is counted) that the platform's runs use."""
    if args.spark != "connect":
        yield env
        return
    import socket

    from sis_platform.cli import spark_connect

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(args.log, "a") as log:
        server = spark_connect.start(port, env={**os.environ, **env}, log=log)
        try:
            yield {**env, "SIS_SPARK_MASTER": f"sc://127.0.0.1:{port}"}
        finally:
            # This process's own client first (--mode inprocess): at exit it would otherwise
            # retry its clean-up calls against the stopped server for minutes.
            from pyspark.sql import SparkSession

            if (session := SparkSession.getActiveSession()) is not None:
                session.stop()
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=120)


def backlog_mode(args: argparse.Namespace) -> str:
    serial = args.mode == "inprocess" and args.landing == "serial"
    return f"{args.mode}, serial landing" if serial else args.mode


def mode_label(args: argparse.Namespace, mode: str) -> str:
    return f"{mode}, Spark Connect" if args.spark == "connect" else mode


def worker_backlog(args: argparse.Namespace) -> dict[str, Any]:
    with spark_for(args, {**BASE_ENV, **batch_env(args)}) as env:
        return _backlog(args, env)


def _backlog(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix="sis-bench-"))
    env = {**env, "SIS_DATA_DIR": str(data)}
    try:
        t0 = time.monotonic()
        n = preload(data, args.messages, args.seed)
        preload_s = time.monotonic() - t0
        load = load_average()
        timings: dict[str, Any] = {}
        t0 = time.monotonic()
        if args.mode == "inprocess":
            runs = run_inprocess(data, env, timings, overlap=args.landing == "overlap")
        else:
            runs = run_daemon(data, env, Path(args.log))
        wall = time.monotonic() - t0
        current, detail = masters_current(data)
        if not current:
            raise RuntimeError(f"masters not current after the run: {detail}")
        batches = len(list((data / "landing" / "batches").glob("*.parquet")))
        return {
            "messages": n,
            "preload_s": round(preload_s, 2),
            "wall_s": round(wall, 2),
            "messages_per_s": round(n / wall, 1),
            "batches": batches,
            "runs": runs,
            "mode": mode_label(args, backlog_mode(args)),
            "load_before": load,
            "load_after": load_average(),
            "batch_max_messages": batch_max_messages(env),
            "check": detail,
            **{k: round(v, 1) if isinstance(v, float) else v for k, v in timings.items()},
        }
    finally:
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)


def reference_fold(messages: list[Any]) -> tuple[int, float]:
    """Items and wall seconds of the single-process reference fold: `fold_master` per master
    over its (deduplicated, valid) items, as ReferencePipeline folds them; classification is
    done before the clock starts, as the Spark fold's input is already classified."""
    from sis_platform.domain.fold import PatchCache, fold_master
    from sis_platform.domain.pipeline import DeadLetter, classify_message

    seen: set[str] = set()
    groups: dict[str, list[Any]] = {}
    for message in messages:
        if message.message_id in seen:
            continue
        seen.add(message.message_id)
        classified = classify_message(message)
        if not isinstance(classified, DeadLetter):
            for item in classified:
                groups.setdefault(item.master_id, []).append(item)
    cache = PatchCache()
    t0 = time.perf_counter()
    for master_id, items in groups.items():
        fold_master(master_id, None, items, patches=cache)
    return sum(len(v) for v in groups.values()), time.perf_counter() - t0


def worker_fold(args: argparse.Namespace) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    from sis_platform.spark.fold import fold_step

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    data = Path(tempfile.mkdtemp(prefix="sis-bench-fold-"))
    env = {**BASE_ENV, "SIS_DATA_DIR": str(data), **batch_env(args)}
    try:
        h = landed_and_classified(data, env, args.messages, args.seed)
        spark = SparkSession.builder.getOrCreate()
        lake = h.lake(spark)
        load = load_average()
        profiler = cProfile.Profile() if args.profile else None
        t0 = time.perf_counter()
        if profiler:
            profiler.enable()
        step = fold_step(lake)
        spark_s = time.perf_counter() - t0
        if profiler:
            profiler.disable()
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(45)
        messages = h.logged_messages()
        items, reference_s = reference_fold(messages)
        return {
            "messages": len(messages),
            "items": items,
            "batches": len(h.requested),
            "spark_fold_s": round(spark_s, 2),
            "reference_fold_s": round(reference_s, 2),
            "spark_items_per_s": round(items / spark_s, 1),
            "reference_items_per_s": round(items / reference_s, 1),
            "ratio": round(reference_s / spark_s, 3),
            "spark_step_applied": step.applied,
            "load_before": load,
            "load_after": load_average(),
        }
    finally:
        shutil.rmtree(data, ignore_errors=True)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def worker_latency(args: argparse.Namespace) -> dict[str, Any]:
    with spark_for(args, {**BASE_ENV, **batch_env(args)}) as env:
        return _latency(args, env)


def _latency(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    from sis_platform.landing import LandingZone
    from sis_platform.queues.embedded import EmbeddedQueue

    data = Path(tempfile.mkdtemp(prefix="sis-bench-latency-"))
    env = {
        **env,
        "SIS_DATA_DIR": str(data),
        "SIS_SENSOR_INTERVAL_SECONDS": "1",
        "SIS_BATCH_MAX_SECONDS": "2",
        "SIS_GET_WAIT_SECONDS": "0.5",
    }
    log = Path(args.log)
    count = max(1, round(args.rate * args.seconds))
    queue_dir = data / "queue"
    queue = EmbeddedQueue(queue_dir)
    queue.depth()  # creates the queue's database before the consumer starts
    load = load_average()
    daemon = start_daemon(data, env, log) if args.mode == "daemon" else None
    harness = None
    if daemon is None:
        # A long-lived Spark session: sensor ticks and runs in this one process.
        import dagster as dg

        from tests.harness import Harness

        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        harness = Harness(data, env)
        # Started before the first message: the runs' resource gets this same session.
        from pyspark.sql import SparkSession

        builder = SparkSession.builder
        for key, value in harness.resources["spark"].spark_config.items():
            builder = builder.config(key, value)
        builder.getOrCreate().range(1).count()
    out = log.open("ab")
    publisher = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "sis-feed"),
            "publish",
            "--to",
            f"embedded://{queue_dir}",
            "--seed",
            str(args.seed),
            "--messages",
            str(count),
            "--rate",
            str(args.rate),
        ],
        cwd=REPO,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    published_at = None
    try:
        deadline = time.monotonic() + args.seconds + args.drain_timeout
        while time.monotonic() < deadline:
            tick_started = time.monotonic()
            if harness is not None:
                result = harness.tick()
                if not isinstance(result, dg.SkipReason):
                    for request in result.run_requests or []:
                        harness.run(request.partition_key)
            else:
                if daemon.poll() is not None:
                    raise RuntimeError(f"dagster-daemon exited ({daemon.returncode}): see {log}")
                if failed_runs():
                    raise RuntimeError(f"a batch run failed: see {data / 'dagster'}")
            if publisher.poll() is not None:
                if publisher.returncode != 0:
                    raise RuntimeError(f"sis-feed publish failed: see {log}")
                published_at = published_at or time.monotonic()
                if not queue.depth() and masters_current(data)[0]:
                    break
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick_started)))
        drained_s = time.monotonic() - (published_at or time.monotonic())
    finally:
        if publisher.poll() is None:
            publisher.kill()
            publisher.wait()
        out.close()
        if daemon is not None:
            stop_daemon(daemon)
    try:
        zone = LandingZone(data / "landing")
        steps = fold_commits(data / "lake")
        latencies: list[float] = []
        for key in zone.keys():
            seq = int(key)
            committed = [
                ts
                for ts, r in steps
                if int(r["first_batch_seq"]) <= seq <= int(r["last_batch_seq"])
            ]
            table = zone.read(key)
            for put in table.column("put_time").to_pylist():
                if committed and put is not None:
                    latencies.append(min(committed) - put.timestamp())
        folded = len(latencies)
        if not latencies:
            raise RuntimeError(f"no message was folded within {args.drain_timeout}s: see {log}")
        return {
            "rate": args.rate,
            "mode": mode_label(args, args.mode),
            "published": count,
            "folded": folded,
            "batches": len(zone.keys()),
            "fold_steps": len(steps),
            "p50_s": round(percentile(latencies, 50), 2),
            "p95_s": round(percentile(latencies, 95), 2),
            "max_s": round(max(latencies), 2),
            "drain_after_publish_s": round(drained_s, 1),
            "load_before": load,
            "load_after": load_average(),
        }
    finally:
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)


def batch_env(args: argparse.Namespace) -> dict[str, str]:
    """--batch, else the platform's default batch bounds (or SIS_BATCH_* from the caller)."""
    return {"SIS_BATCH_MAX_MESSAGES": str(args.batch)} if args.batch is not None else {}


def batch_max_messages(env: dict[str, str]) -> int:
    from sis_platform import config

    return int(config.resources({**os.environ, **env})["landing"].max_messages)


# --- report ------------------------------------------------------------------------------------


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def table_rows(results: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    rows: list[tuple[str, str, str, str, str]] = []
    backlog = sorted(results.get("backlog", []), key=lambda r: r["messages"])
    for r in backlog:
        n = r["messages"]
        target = ""
        ok: bool | None = None
        if n == 12_000:
            target, ok = f"<= {TARGET_12K_S:.0f} s", r["wall_s"] <= TARGET_12K_S
        elif n == 1_200_000:
            target, ok = f"<= {TARGET_1M2_S:.0f} s", r["wall_s"] <= TARGET_1M2_S
        load = f"{r['load_before']} / {r['load_after']}"
        rows.append(
            (
                f"backlog {n:,} ({r['mode']}, batches of {r['batch_max_messages']:,}): wall",
                f"{r['wall_s']:.1f} s ({r['batches']} batches)",
                target,
                verdict(ok),
                load,
            )
        )
        rows.append(
            (f"backlog {n:,}: throughput", f"{r['messages_per_s']:.0f} msg/s", "", "", load)
        )
        rows.append(
            (
                f"backlog {n:,}: peak memory, process tree (PSS; RSS sum "
                f"{r['peak_rss_sum_mib']:,} MiB)",
                f"{r['peak_pss_mib']:,} MiB",
                f"<= {TARGET_PEAK_MIB:.0f} MiB",
                verdict(r["peak_pss_mib"] <= TARGET_PEAK_MIB),
                load,
            )
        )
    by_n = {r["messages"]: r for r in backlog}
    if 120_000 in by_n and 1_200_000 in by_n:
        growth = by_n[1_200_000]["wall_s"] / by_n[120_000]["wall_s"]
        rows.append(
            (
                "backlog: wall(1.2 M) / wall(120 k)",
                f"{growth:.2f}x",
                f"<= {TARGET_GROWTH:.0f}x",
                verdict(growth <= TARGET_GROWTH),
                "",
            )
        )
    for r in results.get("fold", []):
        load = f"{r['load_before']} / {r['load_after']}"
        rows.append(
            (
                f"fold {r['messages']:,} msgs / {r['items']:,} items: reference",
                f"{r['reference_items_per_s']:.0f} items/s",
                "",
                "",
                load,
            )
        )
        rows.append(
            (
                f"fold {r['messages']:,}: Spark (one step, {r['batches']} batches)",
                f"{r['spark_items_per_s']:.0f} items/s",
                "",
                "",
                load,
            )
        )
        rows.append(
            (
                f"fold {r['messages']:,}: Spark / reference",
                f"{r['ratio']:.3f}x",
                f">= {TARGET_FOLD_RATIO:.1f}x",
                verdict(r["ratio"] >= TARGET_FOLD_RATIO),
                load,
            )
        )
    for r in results.get("latency", []):
        load = f"{r['load_before']} / {r['load_after']}"
        what = f"latency at {r['rate']} msg/s, {r['mode']} ({r['folded']}/{r['published']} msgs)"
        rows.append(
            (
                f"{what}: p50",
                f"{r['p50_s']:.1f} s",
                f"<= {TARGET_P50_S:.0f} s",
                verdict(r["p50_s"] <= TARGET_P50_S),
                load,
            )
        )
        rows.append(
            (
                f"{what}: p95",
                f"{r['p95_s']:.1f} s",
                f"<= {TARGET_P95_S:.0f} s",
                verdict(r["p95_s"] <= TARGET_P95_S),
                load,
            )
        )
        rows.append((f"{what}: max", f"{r['max_s']:.1f} s", "", "", load))
    return rows


def print_table(results: dict[str, Any]) -> str:
    header = ("figure", "measured", "target", "", "load 1-min (before / after)")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    text = "\n".join(lines)
    print(text)
    return text


def plot(results: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install -e '.[bench]'): no plot", file=sys.stderr)
        return False
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 5))
    backlog = sorted(results.get("backlog", []), key=lambda r: r["messages"])
    if backlog:
        ns = [r["messages"] for r in backlog]
        walls = [r["wall_s"] for r in backlog]
        ax1.plot(ns, walls, "o-", label="measured")
        xs = [min(ns[0], 12_000), 1_200_000]
        if len(ns) >= 2:
            # Least squares wall = a + b N: a is the fixed cost, b the cost per message.
            mean_n, mean_w = sum(ns) / len(ns), sum(walls) / len(walls)
            b = sum((n - mean_n) * (w - mean_w) for n, w in zip(ns, walls, strict=True)) / sum(
                (n - mean_n) ** 2 for n in ns
            )
            a = mean_w - b * mean_n
            ax1.plot(
                xs,
                [a + b * x for x in xs],
                "--",
                label=f"linear fit: {a:.0f} s + {b * 1000:.2f} ms/msg",
            )
        else:
            top_n, top_w = ns[-1], walls[-1]
            ax1.plot(xs, [top_w * x / top_n for x in xs], "--", label=f"linear from {top_n:,}")
        ax1.plot([12_000, 1_200_000], [TARGET_12K_S, TARGET_1M2_S], "r^", label="targets")
        ax1.set_xscale("log")
        ax1.set_yscale("log")
        ax1.set_xlabel("messages in the backlog")
        ax1.set_ylabel("wall time to every master current (s)")
        ax1.set_title("Backlog")
        ax1.legend()
        ax2.bar([f"{n:,}" for n in ns], [r["peak_pss_mib"] for r in backlog])
        ax2.axhline(TARGET_PEAK_MIB, color="r", linestyle="--", label="target")
        ax2.set_ylabel("peak memory (PSS) of the process tree (MiB)")
        ax2.set_title("Backlog memory; fold ratio in the title")
        ax2.legend()
    fold = results.get("fold", [])
    if fold:
        ax2.set_title(
            "Backlog memory; Spark/reference fold: " + ", ".join(f"{r['ratio']:.2f}x" for r in fold)
        )
    latency = results.get("latency", [])
    if latency:
        labels = [f"{r['rate']} msg/s\n{r.get('mode', 'daemon')}" for r in latency]
        width = 0.25
        xs = range(len(latency))
        for i, key in enumerate(("p50_s", "p95_s", "max_s")):
            ax3.bar(
                [x + (i - 1) * width for x in xs], [r[key] for r in latency], width, label=key[:-2]
            )
        ax3.set_xticks(list(xs), labels)
        ax3.axhline(TARGET_P50_S, color="g", linestyle="--", label="p50 target")
        ax3.axhline(TARGET_P95_S, color="r", linestyle="--", label="p95 target")
        ax3.set_ylabel("put to fold-step commit (s)")
        ax3.set_title("Latency: daemon (a Spark driver per run) / in-process (one)")
        ax3.legend()
    if not latency:
        ax3.text(0.5, 0.5, "latency not measured", ha="center", va="center")
        ax3.set_axis_off()
    if not backlog:
        for ax in (ax1, ax2):
            ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


# --- command line ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--parts", default="backlog,fold,latency", help="comma-separated: backlog, fold, latency"
    )
    parser.add_argument(
        "--messages",
        type=int,
        action="append",
        help="backlog size N (repeatable; 12000, 120000, 1200000)",
    )
    parser.add_argument("--mode", choices=["inprocess", "daemon"], default="inprocess")
    parser.add_argument(
        "--landing",
        choices=["overlap", "serial"],
        default="overlap",
        help="backlog --mode inprocess: overlap: batches landed while runs run, "
        "as under the daemon; serial: land a batch, run it, land the next",
    )
    parser.add_argument(
        "--batch", type=int, default=None, help="SIS_BATCH_MAX_MESSAGES (default: the platform's)"
    )
    parser.add_argument("--fold-messages", type=int, default=12_000)
    parser.add_argument("--latency-rates", default="0.42,4.2")
    parser.add_argument("--latency-seconds", type=float, default=120.0)
    parser.add_argument(
        "--latency-mode",
        choices=["daemon", "inprocess"],
        default="daemon",
        help="daemon: dagster-daemon, a process and Spark driver per run; "
        "inprocess: ticks and runs in one process with one long-lived Spark",
    )
    parser.add_argument(
        "--spark",
        choices=["local", "connect"],
        default="local",
        help="backlog and latency: local: the runs' own local Spark drivers "
        "(the default); connect: one long-lived sis-spark-connect server that "
        "every run uses (SIS_SPARK_MASTER=sc://...)",
    )
    parser.add_argument("--drain-timeout", type=float, default=900.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "bench-out")
    parser.add_argument("--keep", action="store_true", help="keep each measurement's data")
    parser.add_argument(
        "--append",
        action="store_true",
        help="add to the figures already in --out/results.json (same N, rate: "
        "replaced) and print the table of all of them",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="fold: print a cProfile of the Spark fold step to the log",
    )
    parser.add_argument("--worker", choices=["backlog", "fold", "latency"], help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def merged(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`old` results with `new` ones added; a new figure replaces an old one of the same kind
    (backlog and fold: same N; latency: same rate and mode)."""
    keys = {"backlog": ("messages", "mode"), "fold": ("messages",), "latency": ("rate", "mode")}
    out = {**old, **{k: v for k, v in new.items() if k not in keys}}
    for part, key in keys.items():
        rows = {tuple(r.get(k) for k in key): r for r in old.get(part, [])}
        rows.update({tuple(r.get(k) for k in key): r for r in new.get(part, [])})
        if rows:
            out[part] = list(rows.values())
    return out


def worker_main(args: argparse.Namespace) -> int:
    if args.worker == "backlog":
        args.messages = args.messages[0]
        result = worker_backlog(args)
    elif args.worker == "fold":
        args.messages = args.messages[0]
        result = worker_fold(args)
    else:
        result = worker_latency(args)
    Path(args.result).write_text(json.dumps(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - {"backlog", "fold", "latency"}
    if unknown:
        raise SystemExit(f"unknown parts: {', '.join(sorted(unknown))}")
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "bench.log"
    common = [
        "--seed",
        str(args.seed),
        "--log",
        str(log),
        "--spark",
        args.spark,
        "--landing",
        args.landing,
    ]
    if args.batch is not None:
        common += ["--batch", str(args.batch)]
    if args.keep:
        common.append("--keep")
    if args.profile:
        common.append("--profile")
    results: dict[str, Any] = {
        "machine": {
            "cores": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    print(f"machine: {results['machine']}; log: {log}", flush=True)
    if "backlog" in parts:
        results["backlog"] = []
        for n in args.messages or [12_000]:
            print(f"backlog {n:,} ({args.mode}) ... load {load_average()}", flush=True)
            r, peak = run_child(
                ["--worker", "backlog", "--messages", str(n), "--mode", args.mode, *common],
                log,
                timeout=4 * 3600,
            )
            r["peak_pss_mib"] = round(peak)
            results["backlog"].append(r)
            print(
                f"  {r['wall_s']:.1f} s, {r['messages_per_s']:.0f} msg/s, "
                f"{peak:.0f} MiB peak PSS, {r['batches']} batches",
                flush=True,
            )
    if "fold" in parts:
        print(f"fold {args.fold_messages:,} ... load {load_average()}", flush=True)
        r, peak = run_child(
            ["--worker", "fold", "--messages", str(args.fold_messages), *common], log, timeout=3600
        )
        r["peak_pss_mib"] = round(peak)
        results["fold"] = [r]
        print(
            f"  Spark {r['spark_items_per_s']:.0f} items/s, reference "
            f"{r['reference_items_per_s']:.0f} items/s: {r['ratio']:.3f}x",
            flush=True,
        )
    if "latency" in parts:
        results["latency"] = []
        for rate in [float(x) for x in args.latency_rates.split(",") if x.strip()]:
            print(
                f"latency at {rate} msg/s for {args.latency_seconds:.0f} s ... "
                f"load {load_average()}",
                flush=True,
            )
            r, peak = run_child(
                [
                    "--worker",
                    "latency",
                    "--mode",
                    args.latency_mode,
                    "--rate",
                    str(rate),
                    "--seconds",
                    str(args.latency_seconds),
                    "--drain-timeout",
                    str(args.drain_timeout),
                    *common,
                ],
                log,
                timeout=args.latency_seconds + args.drain_timeout + 300,
            )
            r["peak_pss_mib"] = round(peak)
            results["latency"].append(r)
            print(
                f"  p50 {r['p50_s']:.1f} s, p95 {r['p95_s']:.1f} s, max {r['max_s']:.1f} s",
                flush=True,
            )
    if args.append and (args.out / "results.json").is_file():
        results = merged(json.loads((args.out / "results.json").read_text()), results)
    print()
    results["table"] = print_table(results)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    if plot(results, args.out / "bench.png"):
        print(f"\nwrote {args.out / 'results.json'} and {args.out / 'bench.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
