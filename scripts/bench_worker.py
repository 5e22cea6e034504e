"""One measurement of scripts/bench.py, in a process of its own: backlog, fold or latency.

    python scripts/bench_worker.py --worker backlog --messages 12000 --result out.json ...

scripts/bench.py starts this script once per measurement and samples the memory of its process
tree, so what it imports is part of what is measured; the plotting library is not imported
here. The result is one JSON object written to `--result`. The platform runs in this process
through `sis_platform.testing.inprocess` (`--mode inprocess`), or under a real dagster-daemon
(`--mode daemon`), on a new data folder each time.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import pstats
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import dagster as dg
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from sis_platform.cli import spark_connect
from sis_platform.domain.fold import PatchCache, fold_master
from sis_platform.domain.pipeline import LoggedMessage, valid_items_by_master
from sis_platform.lake.spark.fold import fold_step
from sis_platform.log.landing import LandingZone, batch_seq_of
from sis_platform.queues.embedded import EmbeddedQueue
from sis_platform.resources import config
from sis_platform.settings import ensure_spark_connect_token, python_workers_use_this_interpreter
from sis_platform.simulator.generator import generate_feed
from sis_platform.testing.inprocess import LOG_ASSETS, InProcessPlatform

REPO = Path(__file__).resolve().parents[1]

BASE_ENV = {
    "SIS_SPARK_MASTER": "local[*]",
    "SIS_GET_WAIT_SECONDS": "0.2",
    # The caller's own SIS_* settings win (e.g. SIS_SPARK_CONF to have Spark write an event log
    # of each measurement's jobs, or SIS_BATCH_MAX_* and SIS_LEASE_SECONDS for other batch
    # bounds), except the data folder: each measurement has a new one.
    **{k: v for k, v in os.environ.items() if k.startswith("SIS_") and k != "SIS_DATA_DIR"},
}


def new_figure(**kwargs: Any) -> Any:
    """A matplotlib Figure (no pyplot state), or None, said on stderr, without the optional
    `bench` extra that brings matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print("matplotlib not installed (pip install -e '.[bench]'): no plot", file=sys.stderr)
        return None
    return Figure(**kwargs)


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


# --- Delta tables read without Spark (small tables: fold_steps, model_steps) -------------------


class Commit(NamedTuple):
    version: int
    at: float  # commit time, epoch seconds
    rows: list[dict[str, Any]]  # the rows it added


class FoldCommit(NamedTuple):
    at: float  # commit time, epoch seconds
    row: dict[str, Any]  # the fold_steps row


class MastersCurrent(NamedTuple):
    current: bool
    detail: str


def delta_commits(table: Path) -> list[Commit]:
    """Every commit of a Delta table from its JSON log. Enough for the platform's small
    append-only bookkeeping tables."""
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
        commits.append(
            Commit(version, timestamp if timestamp is not None else log.stat().st_mtime, rows)
        )
    return commits


def fold_commits(lake: Path) -> list[FoldCommit]:
    """Every committed fold step, with its commit time."""
    return [FoldCommit(c.at, row) for c in delta_commits(lake / "fold_steps") for row in c.rows]


def masters_current(data: Path) -> MastersCurrent:
    """Every landed batch folded and the model refreshed to the last fold step."""
    keys = LandingZone(data / "landing").catalog.keys()
    if not keys:
        return MastersCurrent(False, "nothing landed")
    last = batch_seq_of(keys[-1])
    folded = max((int(c.row["last_batch_seq"]) for c in fold_commits(data / "lake")), default=0)
    model = max(
        (int(r["fold_step"]) for c in delta_commits(data / "lake" / "model_steps") for r in c.rows),
        default=0,
    )
    ok = folded == last and model == last
    return MastersCurrent(ok, f"last batch {last}, folded to {folded}, model at {model}")


# --- driving the platform ----------------------------------------------------------------------


def preload(data: Path, messages: int, seed: int) -> int:
    """The embedded queue under `data` filled with the simulated feed; returns messages put."""
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


def landed_and_classified(
    data: Path, env: Mapping[str, str], messages: int, seed: int
) -> InProcessPlatform:
    """The simulated feed preloaded, landed, logged and classified (raw_messages and
    message_items of every batch), nothing folded."""
    preload(data, messages, seed)
    platform = InProcessPlatform(data, env)
    platform.drain()
    for key in platform.requested:
        platform.materialize(key, *LOG_ASSETS)
    return platform


class RunTimings:
    """What a backlog measurement records of its runs, in the result's keys: `landing_s` (time
    in sensor ticks), `run_s` (each run's wall), `step_s` (each step's duration, run by run:
    which step grows with the lake) and `waited_for_landing_s`."""

    def __init__(self, timings: dict[str, Any]) -> None:
        self.timings = timings

    def landed(self, seconds: float) -> None:
        self.timings["landing_s"] = self.timings.get("landing_s", 0.0) + seconds

    def ran(self, done: dg.ExecuteInProcessResult, seconds: float) -> None:
        self.timings.setdefault("run_s", []).append(round(seconds, 1))
        for event in done.get_step_success_events():
            self.timings.setdefault("step_s", {}).setdefault(event.step_key, []).append(
                round(event.event_specific_data.duration_ms / 1000, 1)
            )


# How a backlog measurement lands its batches (--landing).
LANDING_PROCESS = "overlap"  # while runs run, by a process of its own (`_run_beside_landing`)
LANDING_THREAD = "overlap-thread"  # while runs run, by a thread of the runs' process
LANDING_SERIAL = "serial"  # land a batch, run it, land the next
LANDINGS = (LANDING_PROCESS, LANDING_THREAD, LANDING_SERIAL)
# How the in-process runs' one Spark driver is tuned (--driver).
DRIVER_LONG_LIVED = "long-lived"
DRIVER_SHORT_LIVED = "short-lived"
DRIVERS = (DRIVER_LONG_LIVED, DRIVER_SHORT_LIVED)


def run_inprocess(
    data: Path,
    env: Mapping[str, str],
    timings: dict[str, Any],
    *,
    landing: str = LANDING_PROCESS,
    driver: str = DRIVER_LONG_LIVED,
    log: str = "-",
) -> int:
    """Sensor ticks and the runs they request, the runs in this process on one Spark session;
    returns the number of runs.

    `landing` (LANDINGS): by default, as under the daemon, batches are landed while runs run by
    a process of its own (`_run_beside_landing`); LANDING_THREAD lands them from a thread of
    this process instead (`_run_overlapped`); LANDING_SERIAL lands one batch, runs it, lands
    the next.

    `driver` (DRIVERS): the runs share one Spark driver, by default tuned as the long-lived
    driver it is (`start_long_lived_driver`); DRIVER_SHORT_LIVED keeps the tuning of a driver
    that serves one run, as each run's own driver has under the daemon (the harness before)."""
    python_workers_use_this_interpreter()
    record = RunTimings(timings)
    long_lived = driver == DRIVER_LONG_LIVED
    if landing == LANDING_PROCESS:
        return _run_beside_landing(data, env, record, log, long_lived=long_lived)
    if landing == LANDING_THREAD:
        return _run_overlapped(data, env, record, long_lived=long_lived)
    platform = InProcessPlatform(data, env)
    if long_lived:
        start_long_lived_driver(platform)
    runs = 0
    while True:
        before = len(platform.requested)
        t0 = time.monotonic()
        result = platform.tick()
        record.landed(time.monotonic() - t0)
        if isinstance(result, dg.SkipReason):
            return runs
        for key in platform.requested[before:]:
            t0 = time.monotonic()
            record.ran(platform.run(key), time.monotonic() - t0)
            runs += 1


class _Landing(threading.Thread):
    """Ticks the sensor (`_landing_ticks`) while the caller's thread runs the requested batches
    in order (`next_run`, `done`)."""

    def __init__(self, platform: InProcessPlatform, queue: EmbeddedQueue, record: RunTimings):
        super().__init__(name="bench-landing", daemon=True)
        self.platform = platform
        self.queue = queue
        self.record = record
        self.changed = threading.Condition()
        self.ran = 0
        self.seen = 0  # runs ended that the ticks have been told of
        self.landed_all = False
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.record.landed(
                _landing_ticks(
                    self.platform,
                    self.queue,
                    requested=lambda key: self._notify(),
                    run_ended=self._run_ended,
                    ran=lambda: self.seen,
                )
            )
        except BaseException as error:  # re-raised by the running thread
            self.error = error
        finally:
            with self.changed:
                self.landed_all = True
                self.changed.notify_all()

    def _notify(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def _run_ended(self) -> None:
        with self.changed:
            self.changed.wait_for(lambda: self.ran > self.seen)
            self.seen += 1

    def next_run(self) -> str | None:
        """The next requested batch, once landed; None when everything is landed and run."""
        requested = self.platform.requested
        with self.changed:
            self.changed.wait_for(lambda: len(requested) > self.ran or self.landed_all)
            if self.error is not None:
                raise RuntimeError("landing failed") from self.error
            if len(requested) == self.ran:
                return None
            return requested[self.ran]

    def done(self) -> None:
        with self.changed:
            self.ran += 1
            self.changed.notify_all()


def _landing_ticks(
    platform: InProcessPlatform,
    queue: EmbeddedQueue,
    *,
    requested: Callable[[str], None],
    run_ended: Callable[[], None],
    ran: Callable[[], int],
) -> float:
    """Tick the sensor whenever fewer than SIS_MAX_RUNS_IN_FLIGHT requested runs wait or run
    (the daemon's backpressure, with its sensor interval taken as zero) until the queue is
    empty, handing each requested batch to `requested`; `run_ended` returns once one more run
    has ended (`ran` counts them). Returns the seconds spent in ticks."""
    limit = platform.resources["landing"].max_runs_in_flight
    landed = 0.0
    while True:
        while len(platform.requested) - ran() >= limit:
            run_ended()
        before = len(platform.requested)
        t0 = time.monotonic()
        result = platform.tick()
        landed += time.monotonic() - t0
        for key in platform.requested[before:]:
            requested(key)
        if isinstance(result, dg.SkipReason):
            if not queue.depth():
                return landed
            # Held back by the sensor's own backpressure (the last batch was not full): the
            # next tick after the run in flight ends, not a tick a moment from now.
            if ran() == len(platform.requested):
                raise RuntimeError(
                    f"the sensor skipped with messages queued and no run in flight: {result}"
                )
            run_ended()


def _run_beside_landing(
    data: Path, env: Mapping[str, str], record: RunTimings, log: str, *, long_lived: bool
) -> int:
    """The runs in this process, the sensor ticked by a process of its own (this script's
    `--worker landing`), as dagster-daemon ticks its sensors in its own process (or sis-live
    lands): the landing shares the machine's cores with the runs but not their interpreter's
    lock. The child names each batch it requests on one pipe, and is told of each run's end on
    another (its backpressure)."""
    (data / "dagster").mkdir()
    instance = dg.DagsterInstance.local_temp(str(data / "dagster"))
    # The instance's storage is created here, before the child opens it (see start_daemon).
    instance.get_run_records(limit=1)
    platform = InProcessPlatform(data, env, instance=instance)
    if long_lived:
        start_long_lived_driver(platform)
    keys_r, keys_w = os.pipe()
    ended_r, ended_w = os.pipe()
    result = data / "landing-result.json"
    child = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--worker",
            "landing",
            "--keys-fd",
            str(keys_w),
            "--ended-fd",
            str(ended_r),
            "--result",
            str(result),
            "--log",
            log,
        ],
        env={**os.environ, **env},
        pass_fds=(keys_w, ended_r),
    )
    os.close(keys_w)
    os.close(ended_r)
    runs = 0
    waited = 0.0
    try:
        with os.fdopen(keys_r) as keys:
            t0 = time.monotonic()
            for line in keys:  # a batch requested; the end of the file when the child is done
                waited += time.monotonic() - t0
                key = line.strip()
                t0 = time.monotonic()
                record.ran(platform.run(key), time.monotonic() - t0)
                runs += 1
                try:
                    os.write(ended_w, b"ended\n")
                except BrokenPipeError:
                    pass  # the child has landed everything and gone: no backpressure left
                t0 = time.monotonic()
    finally:
        os.close(ended_w)
    if child.wait() != 0:
        raise RuntimeError(f"the landing process exited with status {child.returncode}")
    record.landed(json.loads(result.read_text())["landing_s"])
    record.timings["waited_for_landing_s"] = round(waited, 1)
    return runs


def worker_landing(args: argparse.Namespace) -> dict[str, Any]:
    """`--worker landing`, started by a backlog measurement (`_run_beside_landing`): the
    sensor ticked until the queue is empty, on the measurement's data folder and instance,
    with the SIS_* settings of this process's environment."""
    env = {k: v for k, v in os.environ.items() if k.startswith("SIS_")}
    data = Path(env["SIS_DATA_DIR"])
    instance = dg.DagsterInstance.local_temp(str(data / "dagster"))
    platform = InProcessPlatform(data, env, instance=instance)
    ran = 0
    with (
        open(args.keys_fd, "w", buffering=1) as keys,
        open(args.ended_fd) as ended,
    ):

        def run_ended() -> None:
            nonlocal ran
            if not ended.readline():
                raise RuntimeError("the runs' process closed its pipe")
            ran += 1

        landed = _landing_ticks(
            platform,
            EmbeddedQueue(data / "queue"),
            requested=lambda key: keys.write(key + "\n"),
            run_ended=run_ended,
            ran=lambda: ran,
        )
    return {"landing_s": landed}


def _run_overlapped(
    data: Path, env: Mapping[str, str], record: RunTimings, *, long_lived: bool
) -> int:
    # Two threads write the instance: its storage on disk, not in memory.
    (data / "dagster").mkdir()
    instance = dg.DagsterInstance.local_temp(str(data / "dagster"))
    platform = InProcessPlatform(data, env, instance=instance)
    if long_lived:
        start_long_lived_driver(platform)
    landing = _Landing(platform, EmbeddedQueue(data / "queue"), record)
    landing.start()
    waited = 0.0
    while True:
        t0 = time.monotonic()
        key = landing.next_run()
        if key is None:
            break
        waited += time.monotonic() - t0
        t0 = time.monotonic()
        record.ran(platform.run(key), time.monotonic() - t0)
        landing.done()
    landing.join()
    # Time the runs waited for a batch to be landed (landing not hidden behind a run).
    record.timings["waited_for_landing_s"] = round(waited, 1)
    return landing.ran


def start_daemon(data: Path, env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    home = data / "dagster"
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "deploy" / "dagster.yaml", home / "dagster.yaml")
    full_env = {**os.environ, **env, "DAGSTER_HOME": str(home)}
    os.environ["DAGSTER_HOME"] = str(home)
    # The instance's SQLite storage is created here, before the daemon starts: two processes
    # creating it at once can leave it with two schema heads.
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
    instance = dg.DagsterInstance.get()
    return len(
        instance.get_run_records(
            dg.RunsFilter(job_name="process_batch", statuses=[dg.DagsterRunStatus.FAILURE])
        )
    )


def run_daemon(data: Path, env: Mapping[str, str], log: Path) -> int:
    """The platform under a real dagster-daemon until every master is current; returns the
    number of batches landed."""
    queue = EmbeddedQueue(data / "queue")
    daemon = start_daemon(data, env, log)
    try:
        while True:
            time.sleep(1.0)
            if daemon.poll() is not None:
                raise RuntimeError(f"dagster-daemon exited ({daemon.returncode}): see {log}")
            if failed_runs():
                raise RuntimeError(f"a batch run failed: see {data / 'dagster'}")
            if not queue.depth() and masters_current(data).current:
                break
    finally:
        stop_daemon(daemon)
    return len(list((data / "landing" / "batches").glob("*.parquet")))


@contextmanager
def spark_for(args: argparse.Namespace, env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The measurement's environment. `--spark connect`: with a sis-spark-connect server of its
    own (a child of this process, so its memory is counted) that the platform's runs use.
    `--spark standalone`: with a standalone cluster of its own on this machine (a master and
    two workers of one core each, started as tests/cluster starts them; children of this
    process, so counted too) that the runs' drivers submit to."""
    if args.spark == "standalone":
        sys.path.insert(0, str(REPO))  # the test suite's cluster launcher
        from tests.cluster.standalone import DRIVER_CONF, standalone_cluster

        conf = " ".join(f"{key}={value}" for key, value in DRIVER_CONF.items())
        folder = Path(tempfile.mkdtemp(prefix="sis-bench-cluster-"))
        try:
            with standalone_cluster(folder) as cluster:
                yield {**env, "SIS_SPARK_MASTER": cluster.url, "SIS_SPARK_CONF": conf}
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return
    if args.spark != "connect":
        yield env
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The server requires a token; this process and its children (the runs) send it.
    ensure_spark_connect_token()
    with open(args.log, "a") as log:
        server = spark_connect.start(port, env={**os.environ, **env}, log=log)
        try:
            # localhost: PySpark sends a token without TLS to that host only.
            yield {**env, "SIS_SPARK_MASTER": f"sc://localhost:{port}"}
        finally:
            # This process's own client first (--mode inprocess): at exit it would otherwise
            # retry its clean-up calls against the stopped server for minutes.
            if (session := SparkSession.getActiveSession()) is not None:
                session.stop()
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=120)


def backlog_mode(args: argparse.Namespace) -> str:
    if args.mode != "inprocess":
        return args.mode
    labels = {LANDING_SERIAL: "serial landing", LANDING_THREAD: "landing in a thread"}
    parts = [args.mode]
    if args.landing in labels:
        parts.append(labels[args.landing])
    if args.driver == DRIVER_SHORT_LIVED:
        parts.append("a driver tuned for one run")
    return ", ".join(parts)


def mode_label(args: argparse.Namespace, mode: str) -> str:
    labels = {"connect": f"{mode}, Spark Connect", "standalone": f"{mode}, standalone cluster"}
    return labels.get(args.spark, mode)


def batch_env(args: argparse.Namespace) -> dict[str, str]:
    """--batch, else the platform's default batch bounds (or SIS_BATCH_* from the caller)."""
    return {"SIS_BATCH_MAX_MESSAGES": str(args.batch)} if args.batch is not None else {}


def batch_max_messages(env: Mapping[str, str]) -> int:
    return int(config.resources(env)["landing"].max_messages)


# --- backlog -----------------------------------------------------------------------------------


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
            runs = run_inprocess(
                data, env, timings, landing=args.landing, driver=args.driver, log=args.log
            )
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


# --- fold --------------------------------------------------------------------------------------


class ReferenceFold(NamedTuple):
    items: int
    seconds: float  # wall


def reference_fold(messages: list[LoggedMessage]) -> ReferenceFold:
    """Items and wall seconds of the single-process reference fold: `fold_master` per master
    over its (deduplicated, valid) items, as ReferencePipeline folds them; classification is
    done before the clock starts, as the Spark fold's input is already classified."""
    groups = valid_items_by_master(messages)
    cache = PatchCache()
    t0 = time.perf_counter()
    for master_id, items in groups.items():
        fold_master(master_id, None, items, patches=cache)
    return ReferenceFold(sum(len(v) for v in groups.values()), time.perf_counter() - t0)


def worker_fold(args: argparse.Namespace) -> dict[str, Any]:
    python_workers_use_this_interpreter()
    data = Path(tempfile.mkdtemp(prefix="sis-bench-fold-"))
    env = {**BASE_ENV, "SIS_DATA_DIR": str(data), **batch_env(args)}
    try:
        platform = landed_and_classified(data, env, args.messages, args.seed)
        spark = SparkSession.builder.getOrCreate()
        lake = platform.lake(spark)
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
        messages = platform.logged_messages()
        items, reference_s = reference_fold(messages)
        return {
            "messages": len(messages),
            "items": items,
            "batches": len(platform.requested),
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


# --- latency -----------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def worker_latency(args: argparse.Namespace) -> dict[str, Any]:
    with spark_for(args, {**BASE_ENV, **batch_env(args)}) as env:
        return _latency(args, env)


def _inprocess_with_spark(data: Path, env: Mapping[str, str]) -> InProcessPlatform:
    """The platform in this process with a long-lived Spark session, started before the first
    message: the runs' resource gets this same session."""
    python_workers_use_this_interpreter()
    platform = InProcessPlatform(data, env)
    start_long_lived_driver(platform)
    return platform


def start_long_lived_driver(platform: InProcessPlatform) -> None:
    """Start the Spark session every run of `platform` will get (its resource's getOrCreate
    finds it), tuned as the long-lived driver it is: C2 and Spark's code generation
    (config.spark_config's `long_lived`), where a driver per run is tuned to start fast. A
    Spark Connect client is left alone: its server is long-lived already."""
    builder = SparkSession.builder
    conf = platform.resources["spark"].spark_config
    if "spark.master" in conf:  # a local driver (not Spark Connect): it serves every run
        conf = config.spark_config(platform.settings.spark, conf["spark.master"], long_lived=True)
    for key, value in conf.items():
        builder = builder.config(key, value)
    builder.getOrCreate().range(1).count()


def _publish(
    args: argparse.Namespace, queue_dir: Path, count: int, out: Any
) -> subprocess.Popen[bytes]:
    """`sis-feed publish --rate R` of `count` messages into the embedded queue."""
    return subprocess.Popen(
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


def _latency(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
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
    queue = EmbeddedQueue(data / "queue")
    queue.depth()  # creates the queue's database before the consumer starts
    load = load_average()
    daemon = start_daemon(data, env, log) if args.mode == "daemon" else None
    platform = _inprocess_with_spark(data, env) if daemon is None else None
    out = log.open("ab")
    publisher = _publish(args, data / "queue", count, out)
    try:
        drained_s = _until_folded(args, data, queue, publisher, platform, daemon)
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
        latencies = _latencies(zone, steps)
        if not latencies:
            raise RuntimeError(f"no message was folded within {args.drain_timeout}s: see {log}")
        return {
            "rate": args.rate,
            "mode": mode_label(args, args.mode),
            "published": count,
            "folded": len(latencies),
            "batches": len(zone.catalog.keys()),
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


def _until_folded(
    args: argparse.Namespace,
    data: Path,
    queue: EmbeddedQueue,
    publisher: subprocess.Popen[bytes],
    platform: InProcessPlatform | None,
    daemon: subprocess.Popen[bytes] | None,
) -> float:
    """Once a second: tick and run in process (or watch the daemon), until the publisher is
    done and every master is current, or the drain timeout. Returns the seconds from the end of
    publishing to then."""
    log = Path(args.log)
    published_at = None
    deadline = time.monotonic() + args.seconds + args.drain_timeout
    while time.monotonic() < deadline:
        tick_started = time.monotonic()
        if platform is not None:
            before = len(platform.requested)
            platform.tick()
            for key in platform.requested[before:]:
                platform.run(key)
        elif daemon is not None:
            if daemon.poll() is not None:
                raise RuntimeError(f"dagster-daemon exited ({daemon.returncode}): see {log}")
            if failed_runs():
                raise RuntimeError(f"a batch run failed: see {data / 'dagster'}")
        if publisher.poll() is not None:
            if publisher.returncode != 0:
                raise RuntimeError(f"sis-feed publish failed: see {log}")
            published_at = published_at or time.monotonic()
            if not queue.depth() and masters_current(data).current:
                break
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick_started)))
    return time.monotonic() - (published_at or time.monotonic())


def _latencies(zone: LandingZone, steps: list[FoldCommit]) -> list[float]:
    """Per landed message, from its put on the queue to the commit of the first fold step
    that covered its batch (messages not yet folded are left out)."""
    latencies: list[float] = []
    for key in zone.catalog.keys():
        seq = int(key)
        committed = [
            c.at
            for c in steps
            if int(c.row["first_batch_seq"]) <= seq <= int(c.row["last_batch_seq"])
        ]
        table = zone.catalog.read(key)
        for put in table.column("put_time").to_pylist():
            if committed and put is not None:
                latencies.append(min(committed) - put.timestamp())
    return latencies


# --- command line ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options scripts/bench.py passes to one measurement."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--worker", choices=["backlog", "fold", "latency", "landing"], required=True
    )
    parser.add_argument("--messages", type=int)
    parser.add_argument("--mode", choices=["inprocess", "daemon"], default="inprocess")
    parser.add_argument("--landing", choices=LANDINGS, default=LANDING_PROCESS)
    parser.add_argument("--driver", choices=DRIVERS, default=DRIVER_LONG_LIVED)
    parser.add_argument("--keys-fd", type=int, help="--worker landing: its pipe of batches")
    parser.add_argument("--ended-fd", type=int, help="--worker landing: the pipe of runs ended")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--spark", choices=["local", "connect", "standalone"], default="local")
    parser.add_argument("--rate", type=float)
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--drain-timeout", type=float, default=900.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--result", required=True)
    parser.add_argument("--log", required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker == "backlog":
        result = worker_backlog(args)
    elif args.worker == "landing":
        result = worker_landing(args)
    elif args.worker == "fold":
        result = worker_fold(args)
    else:
        result = worker_latency(args)
    Path(args.result).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
