"""The catch-up benchmark (issue 51): the lake down for a day of feed in the real shape, then
brought back as deployed; how long until it has folded every waiting batch, and whether a live
feed arriving meanwhile is starved.

    python scripts/bench_catchup.py [--batches 720] [--per-batch 50] [--live-rate 0.42]
        [--timeout 3600] [--out bench-out/catchup] [--seed 1] [--keep]

1. The backlog (timed apart; not part of the figure). The embedded queue of a new data folder
   is preloaded with N x M messages of the simulator's feed, and the real `sis-live` drains it
   with SIS_BATCH_MAX_MESSAGES=M and SIS_LIVE_GROUP_MAX_MESSAGES=1 while no Dagster process
   runs: every message is its own landing group (its own part, as at the feed's average of
   0.42 msg/s, where a get never finds a second message waiting), every batch is sealed at M
   messages (0.42 msg/s x SIS_LIVE_BATCH_SECONDS 120 s = 50) with its anchor and the chain
   running across batches, and the serving store holds every message, as a day of sis-live
   leaves them. sis-live is stopped (its lease released) and `sis-live merge` merges every
   sealed batch into one file with SIS_LANDING_MERGE_GRACE_SECONDS=0: the zone a day leaves,
   where sis-live merges each batch in the idle turns after its seal; the only difference is
   that a day still has the parts of its last hour's ~30 batches beside their merged files,
   which no reader opens once the merged file exists (log/landing/merge.py).
   Seeding the zone with the landing writer in bulk would be faster but leaves no serving
   store, which the lake's runs write their progress to and the live == lake check reads.
2. The lake back: dagster-daemon started on the data folder as scripts/run.sh starts it
   (`dagster-daemon run -w workspace.yaml`, deploy/dagster.yaml, the default run launcher:
   each run a process of its own with its own Spark driver; SIS_INTAKE=live, so the
   landed-batches sensor is the lake's intake). With `--live-rate R` (default 0.42; 0 turns it
   off) sis-live runs again at the default batch bounds (a batch sealed every 120 s), a
   publisher thread of this script continues the same simulated feed at R msg/s, and a reader
   process (scripts/bench_live.py's `reader` role) tails the serving store's change log.
3. Measured, once a second, until the lake's fold has folded batch N (the serving store's
   `lake_progress` row, which the fold writes after every run), then, with the live feed, until
   it has folded every batch sealed by then too (or `--timeout`): the wall time from the
   daemon's start to each; the lake's lag in batches (the newest sealed batch minus the last
   folded) over time; the 1-minute load average; after the daemon has stopped, every run
   Dagster launched (`instance.get_run_records`: job, partition tags, queued and run wall) and
   the batches each run folded (`fold_steps` rows by run id, read with polars as
   docs/readers.md shows); sis-live's put -> visible p50/p95/p99 during the catch-up (the
   publisher's put time to the reader's first sight of a change the message made, as
   scripts/bench_live.py measures it).

Prints a table and writes results.json (and the processes' log, catchup.log) into `--out`
(default bench-out/catchup, not committed). Everything it starts is stopped on exit, Ctrl-C
and SIGTERM included (the daemon's run workers and their JVMs too), and its temporary folder
removed unless `--keep`. The caller's SIS_* settings apply except those naming the data
folder, the source, the serving store, the log's witness and the metrics address.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, NamedTuple

import bench_live
import bench_worker
import dagster as dg
import psutil

from sis_platform.assets.run_tags import run_batches
from sis_platform.log.landing import LandingZone
from sis_platform.queues.embedded import EmbeddedQueue
from sis_platform.serving import LakeProgress, ServingUnavailable, open_reader
from sis_platform.settings import load_settings
from sis_platform.simulator.generator import generate_feed

REPO = Path(__file__).resolve().parents[1]
SIS_LIVE = Path(sys.executable).parent / "sis-live"
BATCH_JOB = "process_batch"
SAMPLE_SECONDS = 1.0
# Once caught up, how long the runs then in progress are given to end before the daemon stops.
RUN_END_GRACE_S = 600.0
IN_PROGRESS = [
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]
BUILD_TIMEOUT_S = 7200.0  # sis-live landing the backlog
STOP_TIMEOUT_S = 60.0
# Issue 51's target: a day's backlog folded within 15 minutes of the lake's return.
TARGET_CATCHUP_S = 15 * 60.0
# The SIS_* settings this script sets itself for every process it starts.
OWN_SETTINGS = (
    "SIS_DATA_DIR",
    "SIS_SERVING_URL",
    "SIS_LANDING_DIR",
    "SIS_LAKE_PATH",
    "SIS_INTAKE",
    "SIS_LOG_WITNESS",
    "SIS_METRICS_ADDRESS",
)


class Folder(NamedTuple):
    """The measurement's temporary folder: the data folder, and the log's witness outside it
    (the settings refuse a witness inside a data folder)."""

    root: Path
    data: Path
    witness: Path


def platform_env(folder: Folder) -> dict[str, str]:
    """The SIS_* settings of every process: the caller's, on this measurement's folder, with
    live intake from the embedded queue and no metrics listener (a loopback port another
    sis-live on the machine may hold)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k.startswith("SIS_")
        and k not in OWN_SETTINGS
        and not k.startswith(("SIS_SOURCE", "SIS_QUEUE_", "SIS_STOMP_", "SIS_IBMMQ_"))
    }
    return {
        **env,
        "SIS_DATA_DIR": str(folder.data),
        "SIS_INTAKE": "live",
        "SIS_SOURCE": "embedded",
        "SIS_QUEUE_DIR": str(folder.data / "queue"),
        "SIS_LOG_WITNESS": str(folder.witness),
        "SIS_METRICS_ADDRESS": "off",
    }


# --- the processes it starts -------------------------------------------------------------------


class Children:
    """Every process this script starts, each in a session of its own, stopped by `stop` or
    `stop_all`: SIGTERM to its process group, then SIGKILL to whatever of it is left, the
    descendants it had when asked to stop included (a run worker and its JVM may live in a
    session of their own, and outlive the daemon that launched them)."""

    def __init__(self) -> None:
        self.started: dict[str, subprocess.Popen[Any]] = {}

    def add(self, name: str, process: subprocess.Popen[Any]) -> subprocess.Popen[Any]:
        self.started[name] = process
        return process

    def start(
        self, name: str, command: list[str], env: Mapping[str, str], log: Path, cwd: Path
    ) -> subprocess.Popen[Any]:
        with log.open("ab") as out:
            return self.add(
                name,
                subprocess.Popen(
                    command,
                    cwd=cwd,
                    env=dict(env),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                ),
            )

    def stop(self, name: str, timeout: float = STOP_TIMEOUT_S) -> int | None:
        process = self.started.pop(name, None)
        if process is None:
            return None
        try:
            descendants = psutil.Process(process.pid).children(recursive=True)
        except psutil.Error:
            descendants = []
        if process.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            code = process.wait()
        _, alive = psutil.wait_procs(descendants, timeout=timeout)
        for leftover in alive:
            with suppress(psutil.Error):
                leftover.kill()
        return code

    def stop_all(self) -> None:
        for name in reversed(list(self.started)):
            self.stop(name)


class Stopped(Exception):
    """SIGTERM: stop as Ctrl-C does."""


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    raise Stopped()


# --- 1. the backlog ----------------------------------------------------------------------------


class Backlog(NamedTuple):
    batches: int
    messages: int
    preload_s: float
    land_s: float  # sis-live draining the queue into sealed batches
    merge_s: float  # sis-live merge


class FeedMessage(NamedTuple):
    message_id: str
    kind: str
    body: bytes


def wait_until(what: str, done: Any, process: subprocess.Popen[Any], timeout: float) -> None:
    """Poll `done()` twice a second until it is true; fails if `process` exits or the timeout
    passes (setup, not measured)."""
    deadline = time.monotonic() + timeout
    while not done():
        if process.poll() is not None:
            raise RuntimeError(f"{what}: the process exited ({process.returncode})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout:g} s")
        time.sleep(0.5)


def build_backlog(
    args: argparse.Namespace,
    folder: Folder,
    env: Mapping[str, str],
    children: Children,
    log: Path,
) -> tuple[Backlog, list[FeedMessage]]:
    """N sealed, merged batches of M one-message groups landed by sis-live (module docstring,
    1); returns them and the rest of the same simulated feed, for the live publisher."""
    backlog = args.batches * args.per_batch
    live = math.ceil(args.live_rate * args.timeout)
    feed = generate_feed(seed=args.seed, messages=backlog + live)
    queue = EmbeddedQueue(folder.data / "queue")
    t0 = time.monotonic()
    with queue.producer() as producer:
        chunk: list[tuple[bytes, str | None]] = []
        for _ in range(backlog):
            m = next(feed)
            chunk.append((m.body, m.message_id))
            if len(chunk) == 10_000:
                producer.put_many(chunk)
                chunk = []
        producer.put_many(chunk)
    rest = [FeedMessage(m.message_id, m.kind, m.body) for m in feed]
    preload_s = time.monotonic() - t0

    t0 = time.monotonic()
    shape = {
        "SIS_BATCH_MAX_MESSAGES": str(args.per_batch),
        "SIS_LIVE_GROUP_MAX_MESSAGES": "1",
    }
    live_env = {**os.environ, **env, **shape}
    sis_live = children.start("sis-live (backlog)", [str(SIS_LIVE)], live_env, log, folder.data)
    zone = LandingZone(folder.data / "landing")
    url = load_settings(env).serving.url

    def landed() -> bool:
        if queue.depth() or len(zone.catalog.keys()) < args.batches:
            return False
        try:
            with open_reader(url) as store:
                return bench_live.caught_up(store, zone, backlog)
        except ServingUnavailable:
            return False

    wait_until("sis-live landing the backlog", landed, sis_live, BUILD_TIMEOUT_S)
    if children.stop("sis-live (backlog)") != 0:
        raise RuntimeError(f"sis-live did not stop cleanly: see {log}")
    land_s = time.monotonic() - t0

    t0 = time.monotonic()
    merge_env = {**live_env, "SIS_LANDING_MERGE_GRACE_SECONDS": "0"}
    with log.open("ab") as out:
        subprocess.run(
            [str(SIS_LIVE), "merge"], cwd=folder.data, env=merge_env, stdout=out, check=True
        )
    merge_s = time.monotonic() - t0
    keys = zone.catalog.keys()
    unmerged = [k for k in keys if not zone.catalog.batch_path(k).is_file()]
    if len(keys) != args.batches or unmerged or zone.catalog.parts(f"{args.batches + 1:010d}"):
        raise RuntimeError(
            f"the backlog is not {args.batches} merged batches: {len(keys)} sealed, "
            f"{len(unmerged)} not merged, or a batch left open"
        )
    return Backlog(len(keys), backlog, preload_s, land_s, merge_s), rest


# --- 2. the live feed beside the catch-up ------------------------------------------------------


class Publisher(threading.Thread):
    """Puts `messages` on the embedded queue at `rate` msg/s from its start until stopped,
    recording [message_id, kind, put, put_returned] per message (bench_live's publish role's
    records), its deadlines from the start time so slow puts are made up, not accumulated."""

    def __init__(self, queue: EmbeddedQueue, messages: list[FeedMessage], rate: float) -> None:
        super().__init__(name="bench-publisher", daemon=True)
        self.queue = queue
        self.messages = messages
        self.rate = rate
        self.records: list[list[Any]] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            start = time.monotonic()
            with self.queue.producer() as producer:
                for index, m in enumerate(self.messages):
                    if self.stop.wait(max(0.0, start + index / self.rate - time.monotonic())):
                        return
                    put = time.time()
                    producer.put(m.body, message_id=m.message_id)
                    self.records.append([m.message_id, m.kind, put, time.time()])
        except BaseException as error:  # reported by the measurement
            self.error = error


class LiveFeed(NamedTuple):
    publisher: Publisher
    reader_out: Path


@contextmanager
def live_feed(
    args: argparse.Namespace,
    folder: Folder,
    env: Mapping[str, str],
    messages: list[FeedMessage],
    children: Children,
    log: Path,
) -> Iterator[LiveFeed | None]:
    """sis-live at the default batch bounds, the reader and the publisher (module docstring,
    2), stopped on leaving; None with `--live-rate 0`."""
    if args.live_rate <= 0:
        yield None
        return
    url = load_settings(env).serving.url
    sis_live = children.start("sis-live", [str(SIS_LIVE)], {**os.environ, **env}, log, folder.data)
    reader_out = folder.root / "reader.json"
    publisher = Publisher(EmbeddedQueue(folder.data / "queue"), messages, args.live_rate)
    try:
        # The store exists since the backlog; sis-live is up once it heartbeats in it again.
        with open_reader(url) as store:
            before = store.status().heartbeat_at

            def beating() -> bool:
                return store.status().heartbeat_at != before

            wait_until("sis-live starting", beating, sis_live, bench_live.START_TIMEOUT_S)
        children.add(
            "reader",
            bench_live.start_reader(_run_of(folder, env, log, url), reader_out, masters=True),
        )
        publisher.start()
        yield LiveFeed(publisher, reader_out)
    finally:
        publisher.stop.set()
        if publisher.is_alive():
            publisher.join()
        children.stop("reader")
        children.stop("sis-live")


def _run_of(folder: Folder, env: Mapping[str, str], log: Path, url: str) -> bench_live.Run:
    """What bench_live's reader role needs of a measurement."""
    return bench_live.Run(folder.data, dict(env), url, folder.data / "landing", log, None, None)


# --- 3. the measurement ------------------------------------------------------------------------


class Sample(NamedTuple):
    at_s: float  # from the daemon's start
    sealed: int  # the newest sealed batch
    folded: int  # the lake's last folded batch (0: none recorded yet)
    load: float


class CatchUp(NamedTuple):
    caught_up_s: float | None  # daemon start -> batch N folded (None: not within the timeout)
    sealed_at_catch_up: int  # the newest sealed batch then
    live_folded_s: float | None  # daemon start -> every batch sealed by then folded too
    samples: list[Sample]
    started_at: float  # epoch seconds of the daemon's start
    stopped_at: float  # epoch seconds when the daemon was asked to stop


def measure(
    args: argparse.Namespace,
    folder: Folder,
    env: Mapping[str, str],
    children: Children,
    log: Path,
) -> CatchUp:
    """The daemon started, then sampled until caught up (module docstring, 3)."""
    zone = LandingZone(folder.data / "landing")
    url = load_settings(env).serving.url
    started_at = time.time()
    t0 = time.monotonic()
    daemon = children.add("dagster-daemon", bench_worker.start_daemon(folder.data, env, log))
    samples: list[Sample] = []
    caught_up_s = live_folded_s = None
    sealed_then = 0
    deadline = t0 + args.timeout
    with open_reader(url) as store:
        while time.monotonic() < deadline:
            tick = time.monotonic()
            if daemon.poll() is not None:
                raise RuntimeError(f"dagster-daemon exited ({daemon.returncode}): see {log}")
            progress: LakeProgress | None = store.lake_progress()
            keys = zone.catalog.keys()
            sealed = int(keys[-1]) if keys else 0
            folded = progress.last_batch_seq if progress is not None else 0
            now = round(tick - t0, 1)
            samples.append(Sample(now, sealed, folded, bench_worker.load_average()))
            if caught_up_s is None and folded >= args.batches:
                caught_up_s, sealed_then = now, sealed
                print(f"  {now:.0f} s: the backlog is folded; {sealed} batches sealed", flush=True)
            if caught_up_s is not None and folded >= sealed_then:
                live_folded_s = now
                break
            if len(samples) % 60 == 0:
                print(f"  {now:.0f} s: folded {folded} of {sealed} sealed", flush=True)
            time.sleep(max(0.0, SAMPLE_SECONDS - (time.monotonic() - tick)))
    if live_folded_s is not None:
        until_runs_end(_in_progress(), daemon, time.monotonic() + RUN_END_GRACE_S)
    return CatchUp(caught_up_s, sealed_then, live_folded_s, samples, started_at, time.time())


def _in_progress() -> set[str]:
    """The ids of the batch runs in progress now."""
    records = dg.DagsterInstance.get().get_run_records(
        dg.RunsFilter(job_name=BATCH_JOB, statuses=IN_PROGRESS)
    )
    return {r.dagster_run.run_id for r in records}


def until_runs_end(run_ids: set[str], daemon: subprocess.Popen[Any], deadline: float) -> None:
    """Until the runs `run_ids` have ended (the run that folded the last batch is still
    refreshing the model, say), so the daemon's stop does not cut them short; runs launched
    later are cut short and reported as interrupted."""
    while run_ids and time.monotonic() < deadline and daemon.poll() is None:
        time.sleep(SAMPLE_SECONDS)
        run_ids &= _in_progress()


class RunFigure(NamedTuple):
    run_id: str
    job: str
    status: str
    partition: str  # its partition tag, or a range's first...last
    queued_s: float | None  # created -> started
    wall_s: float | None  # started -> ended
    started_s: float | None  # from the daemon's start
    ended_s: float | None  # from the daemon's start
    interrupted: bool  # started but not ended before the daemon was stopped
    batches: int  # batches its fold step(s) folded (fold_steps rows with its run id)
    last_batch: int  # the last batch they folded (0: none)


class Folded(NamedTuple):
    """What one run's fold steps folded (fold_steps rows with its run id)."""

    batches: int
    last_batch: int


def run_figures(catch_up: CatchUp, folded: Mapping[str, Folded]) -> list[RunFigure]:
    """Every run of the instance (DAGSTER_HOME, set by bench_worker.start_daemon), oldest
    first."""
    started_at = catch_up.started_at
    records = dg.DagsterInstance.get().get_run_records(ascending=True)
    figures = []
    for record in records:
        run = record.dagster_run
        tags = run.tags
        batches = run_batches(tags)
        partition = (
            ""
            if batches is None
            else batches.first
            if batches.first == batches.last
            else f"{batches.first}...{batches.last}"
        )
        start, end = record.start_time, record.end_time
        created = record.create_timestamp.timestamp()
        interrupted = bool(start) and (not end or end > catch_up.stopped_at)
        fold = folded.get(run.run_id, Folded(0, 0))
        figures.append(
            RunFigure(
                run.run_id,
                run.job_name,
                run.status.value,
                partition,
                round(start - created, 1) if start else None,
                round(end - start, 1) if start and end and not interrupted else None,
                round(start - started_at, 1) if start else None,
                round(end - started_at, 1) if end and not interrupted else None,
                interrupted,
                fold.batches,
                fold.last_batch,
            )
        )
    return figures


def batches_by_run(lake: Path) -> dict[str, Folded]:
    """What each run id folded, from fold_steps (polars reads the lake's tables outside
    Spark: docs/readers.md)."""
    import polars as pl

    table = lake / "fold_steps"
    if not (table / "_delta_log").is_dir():
        return {}
    rows = pl.read_delta(str(table)).select("run_id", "first_batch_seq", "last_batch_seq")
    folded: dict[str, Folded] = {}
    for run_id, first, last in rows.iter_rows():
        before = folded.get(run_id or "", Folded(0, 0))
        folded[run_id or ""] = Folded(
            before.batches + int(last) - int(first) + 1, max(before.last_batch, int(last))
        )
    return folded


def live_figures(feed: LiveFeed, landing: Path) -> dict[str, Any]:
    """sis-live's put -> visible during the catch-up (bench_live.latency_figures), read once
    the reader has written its file."""
    if feed.publisher.error is not None:
        raise RuntimeError("the publisher failed") from feed.publisher.error
    published = feed.publisher.records
    read = json.loads(feed.reader_out.read_text())
    if not published:
        return {"published": 0}
    return bench_live.latency_figures(published, read, bench_live.landing_times(landing))


# --- the report --------------------------------------------------------------------------------


def _spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50": round(bench_worker.percentile(ordered, 50), 1),
        "p95": round(bench_worker.percentile(ordered, 95), 1),
        "max": round(ordered[-1], 1),
        "mean": round(statistics.fmean(ordered), 1),
    }


def summarize(
    args: argparse.Namespace,
    backlog: Backlog,
    catch_up: CatchUp,
    runs: list[RunFigure],
    live: dict[str, Any] | None,
) -> dict[str, Any]:
    batch_runs = [r for r in runs if r.job == BATCH_JOB]
    folding = [r for r in batch_runs if r.batches]
    # The end of the run whose fold step folded the backlog's last batch (its model refreshed).
    backlog_run = min(
        (r for r in folding if r.last_batch >= args.batches),
        key=lambda r: r.last_batch,
        default=None,
    )
    loads = [s.load for s in catch_up.samples]
    # Live batches sealed by the catch-up (or by the timeout, when the backlog was not folded).
    last_sealed = catch_up.samples[-1].sealed if catch_up.samples else 0
    sealed = catch_up.sealed_at_catch_up if catch_up.caught_up_s is not None else last_sealed
    live_sealed = sealed - args.batches
    return {
        "batches": args.batches,
        "per_batch": args.per_batch,
        "live_rate": args.live_rate,
        "backlog": backlog._asdict(),
        "caught_up_s": catch_up.caught_up_s,
        "target_s": TARGET_CATCHUP_S,
        "met": catch_up.caught_up_s is not None and catch_up.caught_up_s <= TARGET_CATCHUP_S,
        "sealed_at_catch_up": catch_up.sealed_at_catch_up,
        "live_batches_sealed_during_catch_up": max(0, live_sealed),
        "live_batches_folded_s": catch_up.live_folded_s,
        "folded_at_end": catch_up.samples[-1].folded if catch_up.samples else 0,
        "runs": dict(sorted(Counter(r.job for r in runs).items())),
        "backlog_run_ended_s": backlog_run.ended_s if backlog_run is not None else None,
        "batch_runs": len(batch_runs),
        "batch_runs_failed": sum(
            1 for r in batch_runs if r.status == "FAILURE" and not r.interrupted
        ),
        "batch_runs_interrupted": sum(1 for r in batch_runs if r.interrupted),
        "batch_runs_queued_at_stop": sum(1 for r in batch_runs if r.started_s is None),
        "batch_run_wall_s": _spread([r.wall_s for r in batch_runs if r.wall_s is not None]),
        "batch_run_queued_s": _spread([r.queued_s for r in batch_runs if r.queued_s is not None]),
        "batches_per_run": _spread([float(r.batches) for r in folding]),
        "max_lag_batches": max((s.sealed - s.folded for s in catch_up.samples), default=0),
        "load": {
            "before": loads[0] if loads else None,
            "mean": round(statistics.fmean(loads), 2) if loads else None,
            "max": max(loads, default=None),
        },
        "live": live,
        "run_list": [r._asdict() for r in runs],
        "lag": [s._asdict() for s in catch_up.samples],
    }


def lag_timeline(samples: list[Sample], rows: int = 12) -> list[Sample]:
    """At most `rows` samples spread evenly over the measurement, the last included."""
    if len(samples) <= rows:
        return samples
    step = (len(samples) - 1) / (rows - 1)
    return [samples[round(i * step)] for i in range(rows)]


def print_report(result: dict[str, Any]) -> None:
    backlog = result["backlog"]
    caught = result["caught_up_s"]
    lines = [
        f"catch-up: {result['batches']} sealed batches of {result['per_batch']} one-message "
        f"groups ({backlog['messages']:,} messages); live feed "
        + (f"{result['live_rate']:g} msg/s" if result["live_rate"] > 0 else "off"),
        f"  backlog built in {backlog['land_s']:.1f} s by sis-live + {backlog['merge_s']:.1f} s "
        f"merge (preload {backlog['preload_s']:.1f} s; not part of the figure)",
        f"{'figure':<48} value",
        f"{'daemon start -> backlog folded':<48} "
        + (f"{caught:.1f} s" if caught is not None else "not within the timeout")
        + f" (target {TARGET_CATCHUP_S:.0f} s: {'met' if result['met'] else 'missed'})",
    ]
    ended = result["backlog_run_ended_s"]
    lines.append(
        f"{'daemon start -> the run folding the last ended':<48} "
        + (f"{ended:.1f} s" if ended is not None else "-")
    )
    if result["live_rate"] > 0:
        folded = result["live_batches_folded_s"]
        lines.append(
            f"{'live batches sealed meanwhile / all folded at':<48} "
            f"{result['live_batches_sealed_during_catch_up']} / "
            + (f"{folded:.1f} s" if folded is not None else "not within the timeout")
        )
    wall, per_run = result["batch_run_wall_s"], result["batches_per_run"]
    lines += [
        f"{'runs launched (by job)':<48} {result['runs']}",
        f"{'batch runs: wall p50 / p95 / max / mean':<48} "
        + (
            f"{wall['p50']} / {wall['p95']} / {wall['max']} / {wall['mean']} s"
            if wall
            else "none ended"
        ),
        f"{'batches per run: p50 / max / mean':<48} "
        + (f"{per_run['p50']} / {per_run['max']} / {per_run['mean']}" if per_run else "-"),
        f"{'batch runs failed / cut by the stop / queued then':<48} "
        f"{result['batch_runs_failed']} / {result['batch_runs_interrupted']} / "
        f"{result['batch_runs_queued_at_stop']}",
        f"{'largest lag (batches)':<48} {result['max_lag_batches']}",
        f"{'load average (1 min): first / mean / max':<48} "
        f"{result['load']['before']} / {result['load']['mean']} / {result['load']['max']}",
    ]
    live = result["live"]
    if live and live.get("changed"):
        lines.append(
            f"{'sis-live put -> visible p50 / p95 / p99 / max':<48} {live['p50_ms']} / "
            f"{live['p95_ms']} / {live['p99_ms']} / {live['max_ms']} ms "
            f"({live['changed']} of {live['published']} messages)"
        )
    lines.append("lag over time: seconds, newest sealed, last folded, lag, load")
    for s in lag_timeline([Sample(**row) for row in result["lag"]]):
        lines.append(
            f"  {s.at_s:>7.0f} {s.sealed:>6} {s.folded:>6} {s.sealed - s.folded:>5} {s.load:>6}"
        )
    print("\n".join(lines), flush=True)


# --- command line ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=720, help="sealed batches waiting")
    parser.add_argument("--per-batch", type=int, default=50, help="messages per batch")
    parser.add_argument(
        "--live-rate", type=float, default=0.42, help="live feed during the catch-up (0: off)"
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds of catch-up")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "bench-out" / "catchup")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    if args.batches < 1 or args.per_batch < 1 or args.timeout <= 0 or args.live_rate < 0:
        parser.error("--batches and --per-batch must be positive, --timeout too")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "catchup.log"
    log.write_bytes(b"")
    root = Path(tempfile.mkdtemp(prefix="sis-bench-catchup-"))  # 0700
    folder = Folder(root, root / "data", root / "log.witness")
    folder.data.mkdir()
    env = platform_env(folder)
    children = Children()
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        print(f"building the backlog in {folder.data} (log: {log})", flush=True)
        backlog, rest = build_backlog(args, folder, env, children, log)
        print(
            f"  {backlog.batches} batches, {backlog.messages:,} messages: landed in "
            f"{backlog.land_s:.1f} s, merged in {backlog.merge_s:.1f} s; starting the lake",
            flush=True,
        )
        live: dict[str, Any] | None = None
        with live_feed(args, folder, env, rest, children, log) as feed:
            try:
                catch_up = measure(args, folder, env, children, log)
            finally:
                children.stop("dagster-daemon")
        if feed is not None:
            live = live_figures(feed, folder.data / "landing")
        runs = run_figures(catch_up, batches_by_run(folder.data / "lake"))
        result = summarize(args, backlog, catch_up, runs, live)
        (args.out / "results.json").write_text(json.dumps(result, indent=2))
        print_report(result)
        print(f"results: {args.out / 'results.json'}", flush=True)
        return 0 if catch_up.caught_up_s is not None else 1
    except (KeyboardInterrupt, Stopped):
        print("stopped", file=sys.stderr)
        return 130
    finally:
        children.stop_all()
        if args.keep:
            print(f"kept {root}", flush=True)
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
