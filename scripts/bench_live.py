"""The live path's benchmark: put -> visible in the serving store, and backlog catch-up.

    python scripts/bench.py --parts live [--live-rates 0.42,4.2,42] [--live-seconds 120,120,60]
        [--live-backlog 12000,1200000] [--live-sources embedded,stomp] [--live-stomp HOST:PORT]
        [--live-metrics on,off]

Every measurement runs the real `sis-live` console script as a child process on the platform's
settings (the caller's SIS_* variables apply, except the data folder, the source and the
serving URL: each measurement gets a new SIS_DATA_DIR and the default SQLite store in it).

rate     A publisher process puts the simulator's feed (`--live-duplicates` of it redelivered)
         at R msg/s for S seconds, paced as `sis-feed publish --rate R`, and records each
         message's put time (the clock just before its put call). A reader process (this
         script's `reader` role) blocks in `ServingReader.wait_for_changes`, reads the new
         `changes(...)` and each changed master (`master(id)`), and records, per message id,
         its own clock when it first saw a change that message produced. Latency = seen - put,
         both on this host's wall clock. Messages that produce no change (duplicates, dead
         letters, updates that change nothing) are counted apart.
backlog  The queue preloaded with N messages, then `sis-live` started: the time from its start
         until the store's position is the last landed message and every message put is
         applied; the peak RSS of sis-live and its fold workers sampled every 0.1 s with psutil.
         With `--live-priority SELECTORS` each backlog is measured twice, without and with
         SIS_PRIORITY set to SELECTORS, and both report when the masters the first selector
         picks were current (the commit time of each one's last change, from sis-live's start)
         against when every master was. The selectors must test event attributes only (sport,
         country, course, eventStatus), which the masters' final documents show.

Metrics (`--live-metrics`, default `on`): each measurement is made once per value given, so
`on,off` puts the two side by side. `on`: sis-live serves its metrics and health
(SIS_METRICS_ADDRESS) on a free loopback port and this script scrapes /metrics every second (a
Prometheus at a 1 s interval, more often than the usual 15 s); `off`: SIS_METRICS_ADDRESS=off, so
nothing is recorded at all.

Sources: `embedded` (the embedded queue under the data folder) and `stomp` (ActiveMQ: a
broker started for the run by scripts/activemq.sh on free loopback ports, or the one
`--live-stomp HOST:PORT` names; without ActiveMQ installed the STOMP leg is skipped with a
message). Each measurement uses its own STOMP destination. A broker started for the run is
first warmed by putting and draining WARM_MESSAGES on a destination of its own (`warm`).
"""

from __future__ import annotations

import argparse
import json
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
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, NamedTuple

import age_serving_store
import psutil
import pyarrow.parquet as pq

from sis_platform.domain.items import Item, selectable_properties
from sis_platform.domain.priority import Priority, event_attributes
from sis_platform.log.landing import LandingZone
from sis_platform.queues.embedded import EmbeddedQueue
from sis_platform.queues.factory import open_source_from_environment
from sis_platform.serving import ServingReader, ServingUnavailable, open_reader
from sis_platform.settings import load_settings
from sis_platform.simulator.cli import Pacer
from sis_platform.simulator.generator import generate_feed

REPO = Path(__file__).resolve().parents[1]
SIS_LIVE = Path(sys.executable).parent / "sis-live"
ACTIVEMQ_SCRIPT = REPO / "scripts" / "activemq.sh"
ACTIVEMQ_JAR = Path("/usr/share/activemq/bin/activemq.jar")
LOOPBACK = "127.0.0.1"

# Targets (issue 22, "Benchmark (targets)"), milliseconds and seconds.
TARGET_P50_MS = 10.0  # at 0.42 and 4.2 msg/s
TARGET_P99_MS = 50.0  # at 0.42 and 4.2 msg/s
TARGET_P99_FAST_MS = 250.0  # at 42 msg/s
FAST_RATE = 42.0
TARGET_BACKLOG_S = {12_000: 5.0, 1_200_000: 300.0}
TARGET_RSS_MIB = 1024.0  # sis-live's peak RSS on the 1.2 M backlog

START_TIMEOUT_S = 120.0  # sis-live up and its store created
READY_TIMEOUT_S = 60.0  # the reader armed
WARM_MESSAGES = 12_000  # put through a broker started for the run before it is measured


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, -(-len(ordered) * q // 100) - 1)] if ordered else float("nan")


# --- sources -----------------------------------------------------------------------------------


class Source(NamedTuple):
    """Where a measurement's messages go: `env` configures sis-live, `url` the publisher."""

    name: str
    env: dict[str, str]
    url: str


class Broker(NamedTuple):
    host: str
    port: int


def embedded_source(data: Path) -> Source:
    queue = data / "queue"
    EmbeddedQueue(queue).depth()  # the queue's database exists before anyone opens it
    return Source("embedded", {"SIS_SOURCE": "embedded", "SIS_QUEUE_DIR": str(queue)}, "")


def stomp_source(broker: Broker, destination: str) -> Source:
    env = {
        "SIS_SOURCE": "stomp",
        "SIS_STOMP_HOST": broker.host,
        "SIS_STOMP_PORT": str(broker.port),
        "SIS_STOMP_DESTINATION": destination,
    }
    return Source("stomp", env, f"stomp://{broker.host}:{broker.port}{destination}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


@contextmanager
def activemq(given: str | None, log: Path) -> Iterator[Broker | None]:
    """The broker `given` (HOST:PORT), or one started for the run in a temporary folder by
    scripts/activemq.sh (as tests/queues/broker.py does); None when ActiveMQ is not installed
    or did not start (the reason printed)."""
    if given:
        host, _, port = given.rpartition(":")
        yield Broker(host or LOOPBACK, int(port))
        return
    if not ACTIVEMQ_JAR.exists():
        print(
            f"stomp: skipped, ActiveMQ is not installed ({ACTIVEMQ_JAR}): "
            "`sudo scripts/activemq.sh install`, or --live-stomp HOST:PORT",
            flush=True,
        )
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="sis-bench-activemq-"))
    port = _free_port()
    env = {
        **os.environ,
        "ACTIVEMQ_HOST": LOOPBACK,
        "ACTIVEMQ_STOMP_PORT": str(port),
        "ACTIVEMQ_OPENWIRE_PORT": str(_free_port()),
    }
    with log.open("ab") as out:
        started = subprocess.run(
            [str(ACTIVEMQ_SCRIPT), "start", str(folder)], env=env, stdout=out, stderr=out
        )
    try:
        if started.returncode != 0:
            print(f"stomp: skipped, ActiveMQ did not start: see {log}", flush=True)
            yield None
        else:
            broker = Broker(LOOPBACK, port)
            warm(broker, log)
            yield broker
    finally:
        with log.open("ab") as out:
            subprocess.run(
                [str(ACTIVEMQ_SCRIPT), "stop", str(folder)], env=env, stdout=out, stderr=out
            )
        shutil.rmtree(folder, ignore_errors=True)


def warm(broker: Broker, log: Path, messages: int = WARM_MESSAGES) -> None:
    """Put `messages` on a destination of their own and drain them, before any measurement on
    a broker started for the run. A site's broker has been running for days; a new JVM runs
    its first thousands of messages through the interpreter (a 12,000 backlog on a new broker
    takes a sixth longer than after this warm-up, and a longer warm-up gives no more), and that
    is the broker's start-up, not the live path's."""
    source = stomp_source(broker, f"/queue/sis.bench.warm.{os.getpid()}")
    t0 = time.monotonic()
    if start_publisher(source, log, Path(os.devnull), messages).wait() != 0:
        raise RuntimeError(f"warming the broker failed: see {log}")
    drained = 0
    with open_source_from_environment(source.url).connect() as session:
        while drained < messages:
            if session.get(wait_seconds=START_TIMEOUT_S) is None:
                raise RuntimeError(f"the broker's warm-up drained {drained} of {messages}")
            drained += 1
            if drained % 500 == 0:
                session.commit()
        session.commit()
    print(f"stomp: broker warmed with {messages:,} messages in {time.monotonic() - t0:.1f} s")


# --- the roles in their own processes ----------------------------------------------------------


def role_publish(args: argparse.Namespace) -> int:
    """Put `--messages` simulated messages on `--url` at `--rate`, writing [message_id, kind,
    put, put_returned] per message to `--out`; without a rate, as fast as possible (in
    transactions of 10,000 on the embedded queue) and nothing recorded."""
    feed = generate_feed(seed=args.seed, messages=args.messages, duplicates=args.duplicates)
    source = open_source_from_environment(args.url)
    records: list[tuple[str, str, float, float]] = []
    with source.producer() as producer:
        if args.rate is None and hasattr(producer, "put_many"):
            chunk: list[tuple[bytes, str | None]] = []
            for m in feed:
                chunk.append((m.body, m.message_id))
                if len(chunk) == 10_000:
                    producer.put_many(chunk)
                    chunk = []
            producer.put_many(chunk)
        elif args.rate is None:
            for m in feed:
                producer.put(m.body, message_id=m.message_id)
        else:
            pacer = Pacer(args.rate)
            for index, m in enumerate(feed):
                pacer.wait(index)
                put = time.time()
                producer.put(m.body, message_id=m.message_id)
                records.append((m.message_id, m.kind, put, time.time()))
    Path(args.out).write_text(json.dumps(records))
    return 0


class _Stop:
    def __init__(self) -> None:
        self.asked = False
        signal.signal(signal.SIGTERM, self._ask)

    def _ask(self, signum: int, frame: Any) -> None:
        self.asked = True


def role_reader(args: argparse.Namespace) -> int:
    """Tail the store's change log until SIGTERM: per message id, this process's clock when it
    first saw a change of it and that change's `committed_at`; written to `--out` as
    {"seen": {message_id: [seen, committed_at]}, ...}."""
    stop = _Stop()
    seen: dict[str, tuple[float, float]] = {}
    masters_read = wakeups = 0
    with open_reader(args.url) as store:
        last = store.last_seq()
        print("ready", flush=True)
        while not stop.asked:
            if store.wait_for_changes(last, timeout=0.5) <= last:
                continue
            wakeups += 1
            while True:
                changes = store.changes(after_seq=last, limit=10_000)
                now = time.time()
                if not changes:
                    break
                for change in changes:
                    seen.setdefault(change.message_id, (now, change.committed_at.timestamp()))
                    if args.masters and store.master(change.master_id) is not None:
                        masters_read += 1
                last = changes[-1].seq
        dead = {d.message_id for d in _all_dead_letters(store)}
    result = {"seen": seen, "dead": sorted(dead), "masters_read": masters_read, "wakeups": wakeups}
    Path(args.out).write_text(json.dumps(result))
    return 0


def _all_dead_letters(store: ServingReader) -> Iterator[Any]:
    after = 0
    while batch := store.dead_letters(after_seq=after, limit=10_000):
        yield from batch
        after = batch[-1].seq


# --- the measured processes --------------------------------------------------------------------


class PeakRss(threading.Thread):
    """Samples the RSS of one process and its children (sis-live's fold workers) together,
    every 0.1 s."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.process = psutil.Process(pid)
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            try:
                processes = [self.process, *self.process.children(recursive=True)]
            except psutil.Error:
                return
            total = 0
            for process in processes:
                try:
                    total += process.memory_info().rss
                except psutil.Error:
                    continue  # a child that ended meanwhile
            self.peak = max(self.peak, total)


class Run(NamedTuple):
    """One measurement's folder, settings and log."""

    data: Path
    env: dict[str, str]
    serving_url: str
    landing: Path
    log: Path
    profile: Path | None  # sis-live run under cProfile, its stats written here
    metrics_url: str | None  # sis-live's /metrics, scraped while it runs (None: metrics off)


def new_run(
    source: Source,
    data: Path,
    args: Any,
    label: str,
    priority: str | None = None,
    metrics: bool = True,
) -> Run:
    env = {k: v for k, v in os.environ.items() if not _overridden(k)}
    env.update({"SIS_DATA_DIR": str(data), "SIS_INTAKE": "live", **source.env})
    if priority:
        env["SIS_PRIORITY"] = priority
    metrics_url = None
    env["SIS_METRICS_ADDRESS"] = "off"
    if metrics:
        port = _free_port()
        env["SIS_METRICS_ADDRESS"] = f"{LOOPBACK}:{port}"
        metrics_url = f"http://{LOOPBACK}:{port}/metrics"
    settings = load_settings(env)
    log: Path = args.live_log
    profile = log.parent / f"sis-live-{label}.prof" if args.live_profile else None
    return Run(
        data, env, settings.serving.url, Path(settings.landing_dir), log, profile, metrics_url
    )


class Scraper(threading.Thread):
    """GETs `url` every `interval` seconds, as Prometheus would scrape it, until stopped;
    counts the scrapes answered."""

    def __init__(self, url: str | None, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.interval = interval
        self.scrapes = 0
        self.failures = 0
        self.stop = threading.Event()

    def run(self) -> None:
        if self.url is None:
            return
        while not self.stop.wait(self.interval):
            try:
                with urllib.request.urlopen(self.url, timeout=10) as response:
                    response.read()
                self.scrapes += 1
            except OSError:
                self.failures += 1  # before the endpoint is up, or after sis-live stopped

    def __enter__(self) -> Scraper:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join()


def _overridden(name: str) -> bool:
    """The caller's SIS_* variables a measurement sets itself."""
    own = (
        "SIS_DATA_DIR",
        "SIS_SERVING_URL",
        "SIS_LANDING_DIR",
        "SIS_LAKE_PATH",
        "SIS_PRIORITY",
        "SIS_METRICS_ADDRESS",
    )
    return name in own or (
        name.startswith(("SIS_SOURCE", "SIS_QUEUE_", "SIS_STOMP_", "SIS_IBMMQ_"))
    )


def start_live(run: Run) -> subprocess.Popen[bytes]:
    """The `sis-live` console script; with a profile, its main module under cProfile."""
    command = [str(SIS_LIVE)]
    if run.profile is not None:
        command = [sys.executable, "-m", "cProfile", "-o", str(run.profile)]
        command += ["-m", "sis_platform.cli.live"]
    with run.log.open("ab") as out:
        return subprocess.Popen(
            command,
            cwd=run.data,
            env=run.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen[Any], what: str, timeout: float = 60.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise RuntimeError(f"{what} did not stop within {timeout} s") from None


def wait_for_store(run: Run, live: subprocess.Popen[bytes]) -> None:
    """Until sis-live has created its store (setup, not measured: polled)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    db = Path(run.serving_url.removeprefix("sqlite:///"))
    while time.monotonic() < deadline:
        if live.poll() is not None:
            raise RuntimeError(f"sis-live exited ({live.returncode}): see {run.log}")
        if db.exists():
            try:
                with open_reader(run.serving_url) as store:
                    store.status()
                return
            except ServingUnavailable:
                pass
        time.sleep(0.05)
    raise RuntimeError(f"sis-live created no store within {START_TIMEOUT_S} s: see {run.log}")


def _role(role: str, *options: str, stdout: Any) -> subprocess.Popen[Any]:
    return subprocess.Popen(
        [sys.executable, __file__, role, *options],
        cwd=REPO,
        stdout=stdout,
        stderr=None,
        text=True,
        start_new_session=True,
    )


def start_reader(run: Run, out: Path, masters: bool) -> subprocess.Popen[str]:
    reader = _role(
        "reader",
        "--url",
        run.serving_url,
        "--out",
        str(out),
        *(["--masters"] if masters else []),
        stdout=subprocess.PIPE,
    )
    assert reader.stdout is not None
    ready = _line_within(reader.stdout, READY_TIMEOUT_S)
    if ready != "ready":
        stop(reader, "reader")
        raise RuntimeError(f"the reader did not start: {ready!r}")
    return reader


def _line_within(stream: IO[str], timeout: float) -> str:
    got: list[str] = []
    reading = threading.Thread(target=lambda: got.append(stream.readline()), daemon=True)
    reading.start()
    reading.join(timeout)
    return got[0].strip() if got else ""


def publish(
    source: Source, run: Run, out: Path, messages: int, rate: float | None, args: Any
) -> subprocess.Popen[Any]:
    options = ["--seed", str(args.seed), "--duplicates", str(args.live_duplicates)]
    return start_publisher(
        source, run.log, out, messages, *options, *(["--rate", str(rate)] if rate else [])
    )


def start_publisher(
    source: Source, log: Path, out: Path, messages: int, *options: str
) -> subprocess.Popen[Any]:
    """The publish role putting `messages` of the simulated feed on `source`, with further
    `options` of that role; its output appended to `log`."""
    url = source.url or f"embedded://{source.env['SIS_QUEUE_DIR']}"
    command = ["--url", url, "--out", str(out), "--messages", str(messages), *options]
    with log.open("ab") as output:
        return _role("publish", *command, stdout=output)


def caught_up(store: ServingReader, zone: LandingZone, messages: int) -> bool:
    status = store.status()
    return status.messages >= messages and status.position == zone.catalog.last_position()


def until_caught_up(run: Run, live: subprocess.Popen[bytes], messages: int, timeout: float) -> None:
    """Until the store has applied `messages` and its position is the last landed message;
    woken by the store's commits, at most 0.05 s late for a commit that changes nothing."""
    zone = LandingZone(run.landing)
    deadline = time.monotonic() + timeout
    with open_reader(run.serving_url) as store:
        last = store.last_seq()
        while not caught_up(store, zone, messages):
            if live.poll() is not None:
                raise RuntimeError(f"sis-live exited ({live.returncode}): see {run.log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the store did not catch up within {timeout} s: {run.log}")
            last = store.wait_for_changes(last, timeout=0.05)


# --- measurements ------------------------------------------------------------------------------


def measure_rate(
    source: Source,
    rate: float,
    seconds: float,
    args: Any,
    data: Path,
    metrics: bool = True,
    aged_days: int = 0,
) -> dict:
    """sis-live, a reader and a publisher at `rate` for `seconds`: the latency figures, with
    sis-live's peak RSS and its open files at the end. `aged_days`: the store first given the
    rows that many days of the feed leave (scripts/age_serving_store.py; not timed)."""
    label = f"{source.name}-{rate:g}-metrics-{'on' if metrics else 'off'}"
    label += f"-aged-{aged_days}" if aged_days else ""
    run = new_run(source, data, args, label, metrics=metrics)
    messages = max(1, round(rate * seconds))
    aged: dict[str, Any] = {}
    if aged_days:
        aged = age_serving_store.age(run.serving_url, aged_days)
        print(f"  store aged {aged_days} days: {aged}", flush=True)
    load_before = load_average()
    live = start_live(run)
    rss = PeakRss(live.pid)
    rss.start()
    scraper = Scraper(run.metrics_url)
    open_files = None
    try:
        scraper.start()
        wait_for_store(run, live)
        reader = start_reader(run, data / "reader.json", masters=True)
        try:
            publisher = publish(source, run, data / "published.json", messages, rate, args)
            if publisher.wait(timeout=seconds * 2 + 600) != 0:
                raise RuntimeError(f"the publisher failed: see {run.log}")
            until_caught_up(run, live, messages, timeout=args.live_drain_timeout)
            open_files = _open_files(live.pid)
        finally:
            stop(reader, "reader")
    finally:
        scraper.stop.set()
        scraper.join()
        code = stop(live, "sis-live")
        rss.stop.set()
        rss.join()
    load_after = load_average()
    published = json.loads((data / "published.json").read_text())
    read = json.loads((data / "reader.json").read_text())
    figures = latency_figures(published, read, landing_times(run.landing))
    return {
        "kind": "rate",
        "source": source.name,
        "rate": rate,
        "seconds": seconds,
        **figures,
        "masters_read": read["masters_read"],
        "reader_wakeups": read["wakeups"],
        "metrics": "on" if metrics else "off",
        "scrapes": scraper.scrapes,
        "live_exit": code,
        "profile": str(run.profile) if run.profile else None,
        "load_before": load_before,
        "load_after": load_after,
        "peak_rss_mib": round(rss.peak / 2**20),
        "open_files": open_files,
        "aged_days": aged_days,
        "aged": aged,
    }


def _open_files(pid: int) -> int | None:
    """The file descriptors sis-live holds now (None: it ended)."""
    try:
        return psutil.Process(pid).num_fds()
    except psutil.Error:
        return None


def landing_times(landing: Path) -> dict[str, tuple[float, float]]:
    """Per landed message id (its first copy): when sis-live got it (`received_at`) and when
    its part was linked into the batch (the part's ctime: the hard link sets it, after the
    part's fsync)."""
    times: dict[str, tuple[float, float]] = {}
    for part in sorted(landing.glob("batches/*/part-*.parquet")):
        linked = part.stat().st_ctime
        table = pq.read_table(part, columns=["message_id", "received_at"])
        for message_id, received in zip(
            table.column("message_id").to_pylist(),
            table.column("received_at").to_pylist(),
            strict=True,
        ):
            times.setdefault(message_id, (received.timestamp(), linked))
    return times


def latency_figures(
    published: list[list[Any]],
    read: dict[str, Any],
    landed: dict[str, tuple[float, float]],
) -> dict[str, Any]:
    """Latency per message id (its first put to the reader's first sight of a change it made),
    its stages, and the messages that made no change, by kind."""
    seen: dict[str, list[float]] = read["seen"]  # [seen, committed_at]
    dead = set(read["dead"])
    first_put: dict[str, float] = {}
    put_call_ms: list[float] = []
    unchanged: Counter[str] = Counter()
    for message_id, kind, put, returned in published:
        put_call_ms.append((returned - put) * 1000)
        if message_id in first_put:
            unchanged["duplicate"] += 1
            continue
        first_put[message_id] = put
        if message_id not in seen:
            unchanged["dead-lettered" if message_id in dead else f"no change ({kind})"] += 1
    latencies = [(seen[m][0] - put) * 1000 for m, put in first_put.items() if m in seen]
    if not latencies:
        raise RuntimeError("no message was seen in the store")
    # Where the time goes: put -> the store commit's timestamp (sis-live's get, land, fold),
    # and that timestamp -> seen (the store's transaction, the doorbell, the read).
    to_commit = [(seen[m][1] - put) * 1000 for m, put in first_put.items() if m in seen]
    to_seen = [(seen[m][0] - seen[m][1]) * 1000 for m in first_put if m in seen]
    # Finer, where the landed part tells: put -> got (the wake-up and the group's gets: a
    # part's `received_at` is stamped as it lands), got -> linked (writing the part), linked ->
    # stamp (the folder's fsync, the fold, the store transaction's start).
    both = [m for m in first_put if m in seen and m in landed]
    stages = {
        "put_to_received_ms": [(landed[m][0] - first_put[m]) * 1000 for m in both],
        "received_to_linked_ms": [(landed[m][1] - landed[m][0]) * 1000 for m in both],
        "linked_to_committed_at_ms": [(seen[m][1] - landed[m][1]) * 1000 for m in both],
    }
    return {
        "published": len(published),
        "changed": len(latencies),
        "unchanged": dict(unchanged),
        "p50_ms": round(percentile(latencies, 50), 2),
        "p95_ms": round(percentile(latencies, 95), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
        "max_ms": round(max(latencies), 2),
        "put_call_p50_ms": round(percentile(put_call_ms, 50), 2),
        "put_to_committed_at_ms": _spread(to_commit),
        "committed_at_to_seen_ms": _spread(to_seen),
        **{name: _spread(values) for name, values in stages.items() if values},
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {f"p{q}": round(percentile(values, q), 2) for q in (50, 95, 99)} | {
        "max": round(max(values), 2)
    }


def measure_backlog(
    source: Source,
    messages: int,
    args: Any,
    data: Path,
    prioritized: bool = False,
    metrics: bool = True,
) -> dict:
    """The queue preloaded with `messages`, then sis-live started: time until the store has
    applied them all, and sis-live's peak RSS; with `args.live_priority`, when the first
    selector's masters were current (`prioritized`: sis-live ran with SIS_PRIORITY)."""
    label = f"{source.name}-backlog-{messages}{'-priority' if prioritized else ''}"
    label += f"-metrics-{'on' if metrics else 'off'}"
    priority = args.live_priority if prioritized else None
    run = new_run(source, data, args, label, priority, metrics=metrics)
    t0 = time.monotonic()
    preloading = publish(source, run, data / "published.json", messages, None, args)
    if preloading.wait() != 0:
        raise RuntimeError(f"the preload failed: see {run.log}")
    preload_s = time.monotonic() - t0
    load_before = load_average()
    started = time.monotonic()
    started_at = datetime.now(UTC)
    live = start_live(run)
    rss = PeakRss(live.pid)
    rss.start()
    scraper = Scraper(run.metrics_url)
    scraper.start()
    try:
        wait_for_store(run, live)
        store_s = time.monotonic() - started
        until_caught_up(run, live, messages, timeout=args.live_drain_timeout)
        wall_s = time.monotonic() - started
    finally:
        scraper.stop.set()
        scraper.join()
        code = stop(live, "sis-live")
        rss.stop.set()
        rss.join()
    zone = LandingZone(run.landing)
    current = {}
    if args.live_priority:
        with open_reader(run.serving_url) as store:
            current = currency(store, Priority.compile(args.live_priority), started_at)
    return {
        "kind": "backlog",
        "source": source.name,
        "messages": messages,
        "prioritized": prioritized,
        "metrics": "on" if metrics else "off",
        "scrapes": scraper.scrapes,
        **current,
        "wall_s": round(wall_s, 2),
        "store_ready_s": round(store_s, 2),
        "messages_per_s": round(messages / wall_s),
        "peak_rss_mib": round(rss.peak / 2**20),
        "preload_s": round(preload_s, 1),
        "batches": len(zone.catalog.keys()),
        "live_exit": code,
        "profile": str(run.profile) if run.profile else None,
        "load_before": load_before,
        "load_after": load_average(),
    }


def currency(store: ServingReader, priority: Priority, started_at: datetime) -> dict[str, Any]:
    """When the masters the first of `priority`'s selectors picks were all current (the commit
    time of each one's last change, in seconds from `started_at`), and when every master was.
    Read after the run from the change log and the masters' final documents."""
    last: dict[str, datetime] = {}
    after = 0
    while batch := store.changes(after, 100_000):
        for change in batch:
            last[change.master_id] = change.committed_at
        after = batch[-1].seq
    first = priority.selectors[0]
    picked = []
    for master_id in last:
        shown = store.master(master_id)
        if shown is None:
            continue
        item = Item("bench", 0, master_id, "master", "refresh", shown.document)
        if first.matches(selectable_properties(item, event_attributes(shown.document))):
            picked.append(master_id)

    def seconds(ids: list[str]) -> float:
        latest = max((last[i] for i in ids), default=started_at)
        return round((latest - started_at).total_seconds(), 2)

    return {
        "priority_current_s": seconds(picked),
        "all_current_s": seconds(list(last)),
        "priority_masters": len(picked),
        "masters": len(last),
    }


@contextmanager
def data_folder(keep: bool) -> Iterator[Path]:
    data = Path(tempfile.mkdtemp(prefix="sis-bench-live-"))  # 0700
    try:
        yield data
    finally:
        if keep:
            print(f"  kept {data}", flush=True)
        else:
            shutil.rmtree(data, ignore_errors=True)


class Planned(NamedTuple):
    """One measurement: a rate (`rate`, `seconds`) or a backlog (`messages`) on a source."""

    source: str
    rate: float = 0.0
    seconds: float = 0.0
    messages: int = 0
    prioritized: bool = False  # a backlog with SIS_PRIORITY (--live-priority)
    metrics: bool = True  # sis-live's metrics on (scraped every second), or off
    aged_days: int = 0  # a rate on a store aged this many days (--live-aged-days)

    @property
    def label(self) -> str:
        what = f"{self.rate:g} msg/s for {self.seconds:g} s" if self.rate else "backlog"
        what += f" {self.messages:,}" if self.messages else ""
        what += " with SIS_PRIORITY" if self.prioritized else ""
        what += f" on a store aged {self.aged_days} days" if self.aged_days else ""
        return f"{self.source} {what}, metrics {'on' if self.metrics else 'off'}"


def plan(args: Any) -> list[Planned]:
    sources = [x.strip() for x in args.live_sources.split(",") if x.strip()]
    unknown = set(sources) - {"embedded", "stomp"}
    if unknown:
        raise SystemExit(f"--live-sources: unknown {', '.join(sorted(unknown))}")
    rates = [float(x) for x in args.live_rates.split(",") if x.strip()]
    seconds = [float(x) for x in str(args.live_seconds).split(",") if x.strip()]
    if len(seconds) == 1 or not rates:
        seconds = seconds[:1] * len(rates)
    if len(seconds) != len(rates):
        raise SystemExit("--live-seconds: one duration, or one per --live-rates rate")
    backlogs = [int(x) for x in args.live_backlog.split(",") if x.strip()]
    switches = [x.strip() for x in args.live_metrics.split(",") if x.strip()]
    if not switches or set(switches) - {"on", "off"}:
        raise SystemExit("--live-metrics: on, off, or both (on,off)")
    ages = [int(x) for x in str(args.live_aged_days).split(",") if x.strip()] or [0]
    if min(ages) < 0:
        raise SystemExit("--live-aged-days: days of the feed, 0 for a new store")
    return [
        *(
            Planned(s, r, t, metrics=m == "on", aged_days=a)
            for r, t in zip(rates, seconds, strict=True)
            for s in sources
            for m in switches
            for a in ages
        ),
        *(
            Planned(s, messages=n, metrics=m == "on")
            for n in backlogs
            for s in sources
            for m in switches
        ),
        *(
            Planned(s, messages=n, prioritized=True, metrics=m == "on")
            for n in (backlogs if args.live_priority else [])
            for s in sources
            for m in switches
        ),
    ]


def source_for(planned: Planned, broker: Broker | None, data: Path, index: int) -> Source | None:
    if planned.source == "embedded":
        return embedded_source(data)
    if broker is None:
        return None
    return stomp_source(broker, f"/queue/sis.bench.{os.getpid()}.{index}")


def measure(args: Any) -> list[dict[str, Any]]:
    """Every live measurement the options ask for, one sis-live each, on a new data folder.
    `args`: live_rates, live_seconds, live_backlog, live_sources, live_stomp, live_duplicates,
    live_drain_timeout, live_log (a Path), seed, keep."""
    planned = plan(args)
    figures: list[dict[str, Any]] = []
    wants_broker = any(p.source == "stomp" for p in planned)
    with activemq(args.live_stomp, args.live_log) if wants_broker else _none() as broker:
        for index, p in enumerate(planned):
            with data_folder(args.keep) as data:
                source = source_for(p, broker, data, index)
                if source is None:
                    continue
                print(f"live {p.label} ... load {load_average()}", flush=True)
                if p.rate:
                    r = measure_rate(source, p.rate, p.seconds, args, data, p.metrics, p.aged_days)
                else:
                    r = measure_backlog(source, p.messages, args, data, p.prioritized, p.metrics)
                figures.append(r)
                print(f"  {summary(r)}", flush=True)
                if r.get("profile"):
                    log_profile(Path(r["profile"]), args.live_log)
    return figures


def log_profile(profile: Path, log: Path, top: int = 40) -> None:
    """sis-live's cProfile stats, the `top` functions by cumulative and by own time, appended
    to the log."""
    with log.open("a") as out:
        stats = pstats.Stats(str(profile), stream=out)
        out.write(f"\n--- {profile}: by cumulative time\n")
        stats.sort_stats("cumulative").print_stats(top)
        out.write(f"\n--- {profile}: by own time\n")
        stats.sort_stats("tottime").print_stats(top)
    print(f"  profile: {profile} (top functions in {log})", flush=True)


@contextmanager
def _none() -> Iterator[None]:
    yield None


def summary(r: dict[str, Any]) -> str:
    load = f"load {r['load_before']} / {r['load_after']}"
    if r["kind"] == "backlog":
        priority = ""
        if "priority_current_s" in r:
            priority = (
                f", {r['priority_masters']} priority masters current at "
                f"{r['priority_current_s']:.2f} s, all {r['masters']} at {r['all_current_s']:.2f} s"
            )
        return (
            f"{r['wall_s']:.2f} s ({r['messages_per_s']:,} msg/s), sis-live peak RSS "
            f"{r['peak_rss_mib']} MiB{priority}, {load}"
        )
    return (
        f"p50 {r['p50_ms']:.1f} ms, p95 {r['p95_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
        f"max {r['max_ms']:.1f} ms ({r['changed']}/{r['published']} changed), "
        f"peak RSS {r['peak_rss_mib']} MiB, {r['open_files']} open files, "
        f"metrics {r.get('metrics', 'on')} ({r.get('scrapes', 0)} scrapes), {load}"
    )


# --- report ------------------------------------------------------------------------------------


class LiveRow(NamedTuple):
    """A row of scripts/bench.py's table (its Row's fields)."""

    figure: str
    measured: str
    target: str
    verdict: str
    load: str


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def live_rows(figures: list[dict[str, Any]]) -> list[LiveRow]:
    rows: list[LiveRow] = []
    for r in figures:
        load = f"{r['load_before']} / {r['load_after']}"
        if r["kind"] == "backlog":
            rows += _backlog_rows(r, load)
        else:
            rows += _rate_rows(r, load)
    return rows


def _rate_rows(r: dict[str, Any], load: str) -> list[LiveRow]:
    fast = r["rate"] >= FAST_RATE
    what = f"live {r['source']} {r['rate']:g} msg/s, {r['seconds']:g} s, put -> store"
    if r.get("aged_days"):
        what += f", store aged {r['aged_days']} days"
    if "metrics" in r:
        what += f", metrics {r['metrics']}"
    p50_target = None if fast else TARGET_P50_MS
    p99_target = TARGET_P99_FAST_MS if fast else TARGET_P99_MS
    unchanged = ", ".join(f"{k} {v}" for k, v in sorted(r["unchanged"].items())) or "none"
    rows = []
    for name, target in (("p50", p50_target), ("p95", None), ("p99", p99_target), ("max", None)):
        value = r[f"{name}_ms"]
        rows.append(
            LiveRow(
                f"{what}: {name}",
                f"{value:.1f} ms",
                f"<= {target:.0f} ms" if target else "",
                _verdict(value <= target) if target else "",
                load,
            )
        )
    stages = [r.get(f"{name}_ms") for name in STAGES]
    if all(stages):
        rows.append(
            LiveRow(
                f"{what}: stages p50 / p99: got, linked, stamped, seen",
                ", ".join(f"{s['p50']:.1f} / {s['p99']:.1f}" for s in stages) + " ms",
                "",
                "",
                load,
            )
        )
    rows.append(
        LiveRow(
            f"{what}: messages",
            f"{r['changed']} changed of {r['published']}; no change: {unchanged}",
            "",
            "",
            load,
        )
    )
    return rows


# A latency's stages, each from the end of the one before (the first from the put).
STAGES = ("put_to_received", "received_to_linked", "linked_to_committed_at", "committed_at_to_seen")


def _backlog_rows(r: dict[str, Any], load: str) -> list[LiveRow]:
    n = r["messages"]
    target = TARGET_BACKLOG_S.get(n)
    what = f"live {r['source']} backlog {n:,}"
    if r.get("prioritized"):
        what += " with SIS_PRIORITY"
    if "metrics" in r:
        what += f", metrics {r['metrics']}"
    rows = [
        LiveRow(
            f"{what}: sis-live start -> store caught up",
            f"{r['wall_s']:.2f} s ({r['messages_per_s']:,} msg/s; store open at "
            f"{r['store_ready_s']:.2f} s; {r['batches']} sealed batches)",
            f"<= {target:g} s" if target else "",
            _verdict(r["wall_s"] <= target) if target else "",
            load,
        )
    ]
    if "priority_current_s" in r:
        rows.append(
            LiveRow(
                f"{what}: first selector's masters current / every master current",
                f"{r['priority_current_s']:.2f} s ({r['priority_masters']} masters) / "
                f"{r['all_current_s']:.2f} s ({r['masters']})",
                "",
                "",
                load,
            )
        )
    big = n >= 1_200_000
    rows.append(
        LiveRow(
            f"{what}: sis-live peak RSS",
            f"{r['peak_rss_mib']:,} MiB",
            f"<= {TARGET_RSS_MIB:.0f} MiB" if big else "",
            _verdict(r["peak_rss_mib"] <= TARGET_RSS_MIB) if big else "",
            load,
        )
    )
    return rows


def add_options(parser: argparse.ArgumentParser) -> None:
    """scripts/bench.py's options for the live part."""
    group = parser.add_argument_group("live (scripts/bench_live.py)")
    group.add_argument("--live-rates", default="0.42,4.2,42", help="msg/s, comma-separated")
    group.add_argument(
        "--live-seconds",
        default="120,120,60",
        help="seconds of publishing: one for every rate, or one per rate",
    )
    group.add_argument(
        "--live-backlog", default="12000,1200000", help="backlog sizes, comma-separated ('' none)"
    )
    group.add_argument("--live-sources", default="embedded,stomp", help="embedded, stomp")
    group.add_argument(
        "--live-stomp",
        metavar="HOST:PORT",
        help="an ActiveMQ STOMP listener to use (default: start one with scripts/activemq.sh)",
    )
    group.add_argument(
        "--live-duplicates",
        type=float,
        default=0.01,
        help="share of the feed that is redelivered duplicates (default 0.01)",
    )
    group.add_argument(
        "--live-priority",
        metavar="SELECTORS",
        help="measure each backlog again with SIS_PRIORITY=SELECTORS, reporting when the first "
        "selector's masters were current against every master (event attributes only)",
    )
    group.add_argument(
        "--live-metrics",
        default="on",
        help="sis-live's metrics: on (served and scraped every second), off, or on,off to "
        "measure each figure both ways, side by side",
    )
    group.add_argument(
        "--live-aged-days",
        default="0",
        help="days of the feed whose rows the store holds before each rate is measured "
        "(scripts/age_serving_store.py), comma-separated; 0: a new store (e.g. 0,365)",
    )
    group.add_argument("--live-drain-timeout", type=float, default=900.0)
    group.add_argument(
        "--live-profile",
        action="store_true",
        help="run sis-live under cProfile: its stats beside the log, sis-live-<what>.prof, and "
        "the top functions in the log",
    )


# --- the roles' command line -------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the live benchmark's child processes")
    roles = parser.add_subparsers(dest="role", required=True)
    reader = roles.add_parser("reader", help="tail the serving store's change log until SIGTERM")
    reader.add_argument("--url", required=True)
    reader.add_argument("--out", required=True)
    reader.add_argument("--masters", action="store_true", help="read each changed master too")
    publisher = roles.add_parser("publish", help="put the simulated feed, recording put times")
    publisher.add_argument("--url", required=True)
    publisher.add_argument("--out", required=True)
    publisher.add_argument("--messages", type=int, required=True)
    publisher.add_argument("--rate", type=float)
    publisher.add_argument("--seed", type=int, default=1)
    publisher.add_argument("--duplicates", type=float, default=0.0)
    args = parser.parse_args(argv)
    return role_reader(args) if args.role == "reader" else role_publish(args)


if __name__ == "__main__":
    raise SystemExit(main())
