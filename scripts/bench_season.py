"""The season benchmark, lake part (issue 51): what a batch costs the lake on day 1, 30, 90 and
365 of the feed at the default two-minute batches (720 a day), and what the lake holds then.

    python scripts/bench_season.py [--days 1,30,90,365] [--base-batches 10] [--per-batch 50]
        [--on-top 10] [--catch-up 0] [--seed 1] [--out bench-out/season] [--keep]
        [--fresh-driver] [--profile]

1. The base (real). The simulator's feed, `--base-batches` x `--per-batch` messages (20 minutes
   of the feed, in batches of its average size), is put on the embedded queue and landed by the
   queue sensor, one batch per tick; each batch is then folded by its own `process_batch` run
   (raw_messages, the chain check, message_items, the fold step, the model), executed in this
   process through Dagster (sis_platform.testing.inprocess) with one warm Spark driver: one
   batch, one run, one fold step, as at the feed's real cadence.
2. For each day D, the history the days before it leave, built in bulk. Every table of the lake
   gets copies of the base's rows until it holds batches 1..720 x D - `--on-top`: copy k
   of batch b is batch k x B + b, its fold step the same number, its message ids and master ids
   suffixed `~k` (new messages of new races, as each hour of the feed brings), its items digest
   its own; the last step's `fold_steps` row is committed by the fold's own `commit_step`,
   recording the tables' versions after the copies (recovery keeps them). The copies are
   appended in a few large commits, then `OPTIMIZE`d: the file layout the fold's upkeep
   leaves (compacted, 128 MiB bins), with raw_messages and message_items one file per block
   of batches, as their compaction leaves every settled block (the open block's one file per
   batch is left out),
   the current state's tables one file per home block (a copy's masters live in the block of
   its batches; its steps' `master_blocks` are left unknown, as no refresh on top reads them),
   and message_outcomes in batch order, in files spanning the batches one of its 16 MiB bins
   holds (at the base's bytes per batch), as its appends and their compaction leave it.
   The landing zone ends where the lake's history does, as expiry leaves it after a season:
   every landed batch is folded, so the expiry record is moved to the last copied batch (its
   anchor signed with the log key, its head the copied batch's last link) and the batches it
   covers are removed by expiry's own removal. The `batches` partitions of the last
   SIS_PARTITION_RETAIN_DAYS (30) days are registered in Dagster, as partition retirement
   leaves them (their materialization events are not).
3. On top of it, `--on-top` new batches of the same simulated feed (its next messages: new
   message ids, new races) are landed and folded, one run per batch, each run timed, with the
   time of each of its steps (Dagster's step stats).
4. With `--catch-up N`, after the last day's runs the lake is down for N more batches of the
   feed (720: a day): they are landed while nothing folds, then folded as the landed-batches
   sensor has them folded after an outage, in the runs its `run_groups` cuts them into (one
   run over the range of a day's backlog), with `--fresh-driver` on a new driver, as the run's
   own process starts one. The catch-up's figure is those runs' wall time;
   scripts/bench_catchup.py measures the same through the daemon on a new lake, with the
   daemon's start and a live feed beside it. After the last day only: the simulated feed goes
   on across the days' copied history, so the races a catch-up starts go on in the next day's
   batches on top, whose steps would then merge into the catch-up's home block (a day of races
   in one partition) instead of a few batches', and the later days would measure that.

`--fresh-driver` starts a new Spark driver (JVM) before each day's batches on top, configured as
the daemon's run drivers are (short-lived: C1 only, no code generation), so that they measure
the tables as deployed and not the age of the warm driver that built them. `--profile` times
every Spark action and Delta write by the line of sis_platform that made it
(scripts/profile_step.py's timers) and prints each day's heaviest lines.

Prints, per day: the runs' wall p50 / max and each step's p50, the ratio of day D's run p50 to
day 1's (issue 51's target: within 1.2x), each table's rows, files, deletion vectors and log
entries, and the catch-up's wall time and steps (issue 51's target: a day's backlog within 15
minutes); writes results.json into `--out` (default bench-out/season, not committed), and
season.png beside it: a panel per quantity over the days measured (with the `bench` extra's
matplotlib). `--plot-from RESULTS` draws season.png from an earlier run's results.json alone.

What it does not measure: sis-live over the season (`scripts/bench.py --parts live
--live-aged-days 0,365`, on a serving store given a season's rows by
scripts/age_serving_store.py), a driver started for every run (the
daemon's; `--fresh-driver` starts one per day, whose later runs are warmer than a run's own
driver; scripts/bench_catchup.py and `bench.py --mode daemon` measure a start's fixed cost,
which does not depend on the day), the Delta log's length (bulk copies are a few commits each; a
year's log is kept at SIS_LAKE_RETAIN_HOURS of commits and checkpointed every 10), and Dagster's
event log (bounded by run retention: tests/sensors/test_run_retention.py). Writes only under a
temporary folder; starts one local Spark driver (one a day more with `--fresh-driver`).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import bench_worker
import dagster as dg
import profile_step
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sis_platform.assets.partitions import BATCHES
from sis_platform.intake.tick import ready_batch
from sis_platform.lake.delta import Lake
from sis_platform.lake.spark.fold.ledger import FoldStepResult, commit_step
from sis_platform.lake.tables import (
    BATCH_LOG,
    BATCHES_PER_BLOCK,
    FIRST_BLOCK,
    FOLD_STEPS,
    MESSAGE_ITEMS,
    RAW_MESSAGES,
    Table,
)
from sis_platform.lake.upkeep import UPKEEP_TABLES, bin_bytes, optimize, table_files
from sis_platform.log.chain import Anchor
from sis_platform.log.landing.expiry import expire_through
from sis_platform.log.landing.rows import batch_key
from sis_platform.sensors.batch_runs import RunBounds, run_groups
from sis_platform.sensors.landed_sensor import MAX_BATCHES_PER_RUN
from sis_platform.settings import DEFAULT_BATCH_MAX_MESSAGES, DEFAULT_PARTITION_RETAIN_DAYS
from sis_platform.settings.environment import python_workers_use_this_interpreter
from sis_platform.simulator.generator import generate_feed
from sis_platform.testing.inprocess import InProcessPlatform

REPO = Path(__file__).resolve().parents[1]
BATCHES_PER_DAY = 720
# Issue 51's target: day 365's lake run time per batch within 1.2x of day 1's.
TARGET_RATIO = 1.2
# Issue 51's target: a day's backlog folded within 15 minutes of the lake's return.
CATCH_UP_TARGET_S = 900
PROFILE_LINES = 25
# Where the catch-up's grouping reports a batch without its anchor (none is expected here).
LOG = logging.getLogger("bench_season")
PLOT = "season.png"
# Every table a season's lake holds: the two the upkeep leaves one folder per batch, then those
# it compacts, fold_steps last (its final row is the commit point of the copied history).
TABLES = (
    RAW_MESSAGES,
    MESSAGE_ITEMS,
    *(t for t in UPKEEP_TABLES if t is not FOLD_STEPS),
    FOLD_STEPS,
)
# Columns numbered by batch or by step: a copy shifts them by its batches (one step a batch).
SHIFTED = ("batch_seq", "first_batch_seq", "last_batch_seq", "fold_step", "model_step")
# Columns naming a message or a master: a copy suffixes them (new messages, new races).
SUFFIXED = ("message_id", "master_id")
DIGEST = re.compile(r'"([0-9a-f]{64})"')


# --- 1. the base --------------------------------------------------------------------------


def land_and_fold(
    platform: InProcessPlatform,
    feed: Iterator[Any],
    messages: int,
    calls: list[profile_step.Record] | None = None,
) -> list[Run]:
    """Put the feed's next `messages` on the queue, land them (a batch per sensor tick) and
    fold each batch in a run of its own; each run's figures. `calls`: the list the Spark call
    timers (--profile) record into."""
    runs = []
    for key in land(platform, feed, messages):
        if calls is not None:
            calls.clear()
        start = time.perf_counter()
        result = platform.run(key)
        wall = time.perf_counter() - start
        by_site: dict[str, float] = {}
        for call in calls or ():
            site = f"{call.method} {call.site}"
            by_site[site] = round(by_site.get(site, 0.0) + call.seconds, 3)
        runs.append(Run(key, round(wall, 2), step_seconds(platform, result), by_site))
        print(f"  batch {key}: {wall:.1f} s", flush=True)
    return runs


def land(platform: InProcessPlatform, feed: Iterator[Any], messages: int) -> list[str]:
    """Put the feed's next `messages` on the queue and land them, a batch per sensor tick;
    the keys of the batches landed, each of which the sensor asked a run for."""
    with platform.resources["queue"].open().producer() as producer:
        producer.put_many((m.body, m.message_id) for m in _take(feed, messages))
    before = len(platform.requested_runs)
    platform.drain()
    keys = []
    for run in platform.requested_runs[before:]:
        if len(run) != 1:
            raise RuntimeError(f"the sensor asked for a run of {len(run)} batches")
        keys.extend(run)
    return keys


def step_seconds(platform: InProcessPlatform, result: dg.ExecuteInProcessResult) -> dict:
    """A finished run's seconds per step (Dagster's step stats)."""
    return {
        s.step_key: round(s.end_time - s.start_time, 2)
        for s in platform.instance.get_run_step_stats(result.run_id)
        if s.end_time is not None and s.start_time is not None
    }


def _take(feed: Iterator[Any], n: int) -> Iterator[Any]:
    for _ in range(n):
        yield next(feed)


class Run(NamedTuple):
    batch: str
    wall_s: float
    steps: dict[str, float]  # step key -> seconds
    calls: dict[str, float]  # with --profile: the line that made a Spark call -> its seconds


def restart_driver(platform: InProcessPlatform) -> SparkSession:
    """Stop the Spark driver, JVM and all, and start a new one configured as a run's driver is
    (the spark resource's settings: the short-lived JIT and no code generation), as under the
    daemon (`--fresh-driver`): the runs after it measure the tables, not the age of the driver
    that built them."""
    from pyspark import SparkContext

    spark = SparkSession.getActiveSession()
    if spark is not None:
        spark.stop()
    gateway = SparkContext._gateway
    if gateway is not None:
        gateway.shutdown()
        gateway.proc.stdin.close()  # the JVM's gateway server exits on its stdin's end
        gateway.proc.wait()
        SparkContext._gateway = None
        SparkContext._jvm = None
    builder = SparkSession.builder
    for key, value in platform.resources["spark"].spark_config.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


class CatchUp(NamedTuple):
    batches: int
    wall_s: float  # every catch-up run's wall time, together
    runs: list[dict[str, Any]]  # each run: its first and last batch, wall and step seconds


def catch_up(
    platform: InProcessPlatform, feed: Iterator[Any], messages: int, *, fresh_driver: bool
) -> CatchUp:
    """The lake down while the feed's next `messages` land, then back (module docstring, 4):
    the landed batches folded in the runs the landed-batches sensor groups them into
    (`run_groups`), timed."""
    keys = land(platform, feed, messages)
    print(f"  catch-up: {len(keys)} batches landed with the lake down", flush=True)
    zone = platform.zone
    # The default bound of a run's messages, not this process's SIS_BATCH_MAX_MESSAGES: the
    # benchmark sets that to `--per-batch` to cut the feed into batches of the feed's size,
    # which the deployed sensor's two-minute seal does instead.
    bounds = RunBounds(DEFAULT_BATCH_MAX_MESSAGES, MAX_BATCHES_PER_RUN)
    groups = run_groups([ready_batch(zone, key, LOG) for key in keys], bounds)
    if fresh_driver:
        restart_driver(platform)
    runs: list[dict[str, Any]] = []
    for group in groups:
        chunk = [batch.key for batch in group]
        start = time.perf_counter()
        result = platform.run(chunk)
        wall = round(time.perf_counter() - start, 2)
        runs.append(
            {
                "batches": [chunk[0], chunk[-1]],
                "wall_s": wall,
                "steps": step_seconds(platform, result),
            }
        )
        print(f"  catch-up run {chunk[0]}..{chunk[-1]}: {wall:.1f} s", flush=True)
    return CatchUp(len(keys), round(sum(r["wall_s"] for r in runs), 2), runs)


# --- 2. a season's history in bulk -------------------------------------------------------------


class Base(NamedTuple):
    """The base's tables, pinned at the version its last run left, and their bytes then."""

    batches: int
    versions: dict[str, int]
    bytes: dict[str, int]


def check_base(lake: Lake, batches: int) -> Base:
    steps = lake.read(FOLD_STEPS).collect()
    if sorted((r["fold_step"], r["first_batch_seq"], r["last_batch_seq"]) for r in steps) != [
        (n, n, n) for n in range(1, batches + 1)
    ]:
        raise RuntimeError("the base was not folded one batch per step")
    present = [t for t in TABLES if lake.exists(t)]
    versions = {t.name: lake.version(t) for t in present}
    return Base(batches, versions, {t.name: table_files(lake, t).active_bytes for t in present})


def copies(lake: Lake, base: Base, table: Table, after: int, through: int) -> DataFrame:
    """The rows copies of the base add to `table` for batches (and steps) after..through."""
    rows = lake.read(table, version=base.versions[table.name])
    first, last = after // base.batches, (through - 1) // base.batches
    k = F.col("_copy")
    shift = k * F.lit(base.batches)
    out = rows.crossJoin(lake.spark.range(max(first, 1), last + 1).withColumnRenamed("id", "_copy"))
    names = table.schema().fieldNames()
    columns = []
    for name in names:
        col = F.col(name)
        if name in SHIFTED:
            col = col + shift
        elif name == "batch_key":
            col = F.lpad((col.cast("bigint") + shift).cast("string"), 10, "0")
        elif name in SUFFIXED:
            col = F.when(col.isNotNull(), F.concat(col, F.lit("~"), k.cast("string")))
        elif name == FIRST_BLOCK:
            # A copy's masters live in the block of the copy's batches.
            col = F.floor((col * BATCHES_PER_BLOCK + shift) / BATCHES_PER_BLOCK)
        elif name == "master_blocks":
            # Unknown (every partition), as a step of an earlier version records it: the
            # model's refreshes on top start after the copied steps and never read them.
            col = F.lit(None)
        elif name == "items_digest":
            # A digest of its own per copy (batch_log's, and fold_steps' for the batch it
            # folded, the same), as every real batch has: ten digests repeated would compress
            # to nothing and leave fold_steps a fraction of a season's size.
            digest = F.regexp_extract(col, DIGEST.pattern, 1) if table is FOLD_STEPS else col
            own = F.sha2(F.concat(digest, F.lit("~"), k.cast("string")), 256)
            if table is FOLD_STEPS:
                own = F.format_string('{"%d": "%s"}', F.col("last_batch_seq") + shift, own)
            col = own
        columns.append(col.cast(table.schema()[name].dataType).alias(name))
    order = next((c for c in ("batch_seq", "fold_step") if c in names), None)
    copied = out.select(*columns)
    if order is None:
        return copied
    return copied.where((F.col(order) > after) & (F.col(order) <= through))


def build_history(lake: Lake, base: Base, after: int, through: int) -> dict[str, float]:
    """Batches after..through copied into every table (module docstring, 2); seconds per
    table, the compaction included."""
    seconds: dict[str, float] = {}
    for table in TABLES:
        if table.name not in base.versions:
            continue
        start = time.perf_counter()
        last_step = table is FOLD_STEPS
        rows = copies(lake, base, table, after, through - 1 if last_step else through)
        if table.partition_by:
            # One file per partition, as the platform's compaction leaves a settled block of
            # batches (a partition column Delta generates is computed here from its expression).
            generated = {g.name: F.expr(g.expression) for g in table.generated}
            rows = rows.repartition(*(generated.get(c, F.col(c)) for c in table.partition_by))
        elif table.compact_bytes is not None:
            # Files in batch order, each spanning the batches one of the table's own bins holds
            # at the base's bytes per batch, as appends in batch order and their compaction
            # leave them (message_outcomes: the fold's dedupe skips files by that span).
            rows = rows.repartitionByRange(_files(lake, base, table, through - after), "batch_seq")
        lake.append(table, rows)
        if last_step:
            _commit_last(lake, base, through)
        if not table.partition_by and table.compact_bytes is None:
            optimize(lake, table)
        seconds[table.name] = round(time.perf_counter() - start, 1)
        print(f"    {table.name}: {seconds[table.name]:.1f} s", flush=True)
    return seconds


def _files(lake: Lake, base: Base, table: Table, batches: int) -> int:
    """How many of `table`'s compacted files `batches` batches of the base's rows fill (at the
    base's bytes per batch: the table's own by a later day count every day before it)."""
    per_batch = base.bytes[table.name] / max(base.batches, 1)
    return max(1, math.ceil(per_batch * batches / bin_bytes(table)))


def _commit_last(lake: Lake, base: Base, through: int) -> None:
    """The copied history's last step committed as the fold commits a step, so its row records
    the tables' versions after the copies (the next step's recovery keeps them)."""
    key = batch_key(through)
    log = lake.read(BATCH_LOG).where(F.col("batch_key") == key).first()
    source = (through - 1) % base.batches + 1
    base_steps = lake.read(FOLD_STEPS, version=base.versions[FOLD_STEPS.name])
    step = base_steps.where(F.col("fold_step") == source).first()
    if log is None or step is None:
        raise RuntimeError(f"batch {key} was not copied")
    result = FoldStepResult(
        fold_step=through,
        first_batch_seq=through,
        last_batch_seq=through,
        messages=step["messages"],
        applied=step["applied"],
        duplicates=step["duplicates"],
        filtered=step["filtered"],
        dead_lettered=step["dead_lettered"],
        masters_changed=step["masters_changed"],
    )
    commit_step(
        lake,
        result,
        first_batch_seq=through,
        digests={through: log["items_digest"]},
        items_version=lake.version(MESSAGE_ITEMS),
        log_version=lake.version(BATCH_LOG),
        run_id=None,
        committed_at=datetime.now(UTC),
        # Unknown: a model refresh from before this step would read every partition (none
        # does: model_steps' copies reach this step).
        master_blocks=None,
    )


def expire_landing(platform: InProcessPlatform, lake: Lake, through: int) -> None:
    """The landing zone as expiry leaves it once batches up to `through` are folded: the record
    at batch `through` (signed, its head that batch's last link in raw_messages), every batch
    it covers removed."""
    zone = platform.zone.catalog
    key = batch_key(through)
    links = lake.read(RAW_MESSAGES).where(F.col("batch_key") == key)
    last = links.orderBy(F.col("msg_seq").desc()).select("chain_link").first()
    first = links.orderBy("msg_seq").select("prev_link").first()
    count = links.count()
    if last is None or first is None:
        raise RuntimeError(f"batch {key} has no rows in raw_messages")
    anchor = zone.signer.sign(Anchor(key, count, first["prev_link"], last["chain_link"]))
    expire_through(zone, anchor)


def register_partitions(instance: dg.DagsterInstance, after: int, through: int) -> None:
    """The `batches` partitions partition retirement keeps (its window) among after..through."""
    window = int(DEFAULT_PARTITION_RETAIN_DAYS * BATCHES_PER_DAY)
    start = max(after + 1, through - window + 1)
    keys = [batch_key(s) for s in range(start, through + 1)]
    for i in range(0, len(keys), 10_000):
        instance.add_dynamic_partitions(BATCHES, keys[i : i + 10_000])


# --- 3. the figures ----------------------------------------------------------------------------


def table_figures(lake: Lake) -> dict[str, dict[str, int | None]]:
    figures = {}
    for table in TABLES:
        if not lake.exists(table):
            continue
        files = table_files(lake, table)
        figures[table.name] = {
            "rows": lake.read(table).count(),
            "files": files.active_files,
            "bytes": files.active_bytes,
            "deletion_vectors": files.deletion_vector_files,
            "log_entries": files.log_entries,
        }
    return figures


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 2) if values else 0.0


def _call_medians(runs: list[Run]) -> dict[str, float]:
    """Each call site's median seconds per run (0 in a run that did not make it), heaviest
    first."""
    sites = {site for r in runs for site in r.calls}
    medians = {site: _median([r.calls.get(site, 0.0) for r in runs]) for site in sites}
    return dict(sorted(medians.items(), key=lambda item: -item[1]))


def day_figures(day: int, runs: list[Run], tables: dict[str, Any], build_s: float) -> dict:
    step_keys = sorted({k for r in runs for k in r.steps})
    return {
        "day": day,
        "batches": day * BATCHES_PER_DAY,
        "history_build_s": round(build_s, 1),
        "run_p50_s": _median([r.wall_s for r in runs]),
        "run_max_s": max((r.wall_s for r in runs), default=0.0),
        "step_p50_s": {k: _median([r.steps[k] for r in runs if k in r.steps]) for k in step_keys},
        "call_p50_s": _call_medians(runs[1:] or runs),
        "runs": [r._asdict() for r in runs],
        "tables": tables,
    }


def print_day(figures: dict, first: dict | None) -> None:
    ratio = figures["run_p50_s"] / first["run_p50_s"] if first and first["run_p50_s"] else 1.0
    print(
        f"day {figures['day']}: {figures['batches']:,} batches; run p50 {figures['run_p50_s']} s"
        f" (max {figures['run_max_s']} s), {ratio:.2f}x day {first['day'] if first else 1}"
        f" (target {TARGET_RATIO}x)",
        flush=True,
    )
    steps = ", ".join(f"{k} {v}" for k, v in figures["step_p50_s"].items())
    print(f"  step p50 s: {steps}", flush=True)
    if figures["call_p50_s"]:
        print("  Spark calls p50 s (runs after the day's first), heaviest first:")
        for site, seconds in list(figures["call_p50_s"].items())[:PROFILE_LINES]:
            print(f"    {seconds:7.2f}  {site}", flush=True)
    print(f"  {'table':<20} {'rows':>12} {'files':>7} {'MB':>9} {'DVs':>5} {'log':>5}")
    for name, t in figures["tables"].items():
        print(
            f"  {name:<20} {t['rows']:>12,} {t['files']:>7} {t['bytes'] / 1e6:>9.1f}"
            f" {t['deletion_vectors'] if t['deletion_vectors'] is not None else '-':>5}"
            f" {t['log_entries'] if t['log_entries'] is not None else '-':>5}",
            flush=True,
        )
    if caught := figures.get("catch_up"):
        by_step: dict[str, float] = {}
        for run in caught["runs"]:
            for step, seconds in run["steps"].items():
                by_step[step] = round(by_step.get(step, 0.0) + seconds, 1)
        print(
            f"  catch-up: {caught['batches']} batches in {len(caught['runs'])} run(s),"
            f" {caught['wall_s']} s (target {CATCH_UP_TARGET_S} s with the daemon's start);"
            f" steps s: {', '.join(f'{k} {v}' for k, v in by_step.items())}",
            flush=True,
        )


def plot_days(results: list[dict], path: Path) -> bool:
    """season.png: a panel per quantity over the days measured: the run's wall time (p50, and
    the max, the run that compacts) against the target, with the catch-up's beside it (where
    measured), each step's p50, and each table's files, megabytes, rows and deletion
    vectors."""
    days = [r["day"] for r in results]
    fig = bench_worker.new_figure(figsize=(18, 9))
    if fig is None:
        return False
    (runs, steps, files), (megabytes, rows, dvs) = fig.subplots(2, 3)
    runs.plot(days, [r["run_p50_s"] for r in results], "o-", label="run p50")
    runs.plot(days, [r["run_max_s"] for r in results], "s--", label="run max (compacting)")
    runs.axhline(
        results[0]["run_p50_s"] * TARGET_RATIO,
        color="red",
        linestyle=":",
        label=f"{TARGET_RATIO}x day {days[0]}'s p50",
    )
    if any("catch_up" in r for r in results):
        backlog = runs.twinx()  # minutes beside the runs' seconds
        backlog.plot(
            days,
            [r["catch_up"]["wall_s"] / 60 if "catch_up" in r else math.nan for r in results],
            "^-.",
            color="C3",
            label="catch-up of a backlog, min",
        )
        backlog.axhline(CATCH_UP_TARGET_S / 60, color="C3", linestyle=":", alpha=0.5)
        backlog.set_ylabel("catch-up, minutes")
        backlog.set_ylim(bottom=0)
        backlog.legend(fontsize="small", loc="lower right")
    steps_seen = sorted({k for r in results for k in r["step_p50_s"]})
    for step in steps_seen:
        steps.plot(days, [r["step_p50_s"].get(step, math.nan) for r in results], "o-", label=step)
    tables = list(results[-1]["tables"])
    panels = (
        (files, "files", lambda t: t["files"]),
        (megabytes, "MB", lambda t: t["bytes"] / 1e6),
        (rows, "rows", lambda t: t["rows"]),
        (dvs, "deletion vectors", lambda t: t["deletion_vectors"]),
    )
    for ax, _, value in panels:
        for i, name in enumerate(tables):
            points = [value(r["tables"][name]) if name in r["tables"] else None for r in results]
            # Ten colours, then the same colours dashed with squares: one style per table.
            style = "o-" if i < 10 else "s--"
            ax.plot(
                days,
                [math.nan if v is None else v for v in points],
                style,
                color=f"C{i % 10}",
                label=name,
            )
    for ax, title in (
        (runs, "run wall time, s"),
        (steps, "step p50, s"),
        *((ax, f"{label} per table") for ax, label, _ in panels),
    ):
        ax.set_title(title)
        ax.set_xlabel("day of the season")
        ax.set_xscale("log")
        ax.grid(True, which="both", alpha=0.3)
    for ax in (files, megabytes, rows):
        ax.set_yscale("symlog", linthresh=1)
        ax.set_ylim(bottom=0)
    runs.legend(fontsize="small")
    steps.legend(fontsize="small")
    rows.legend(fontsize="x-small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True


# --- command line ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", default="1,30,90,365")
    parser.add_argument("--base-batches", type=int, default=10, help="the real base: batches")
    parser.add_argument("--per-batch", type=int, default=50, help="messages per batch")
    parser.add_argument("--on-top", type=int, default=10, help="real batches folded per day")
    parser.add_argument(
        "--catch-up",
        type=int,
        default=0,
        metavar="N",
        help="after the last day, N batches landed with the lake down and folded as after an "
        "outage (720: a day's backlog); 0: none",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "bench-out" / "season")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument(
        "--fresh-driver",
        action="store_true",
        help="a new Spark driver (JVM), configured as a run's, before each day's batches on top",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="time each Spark call by the line that made it; print each day's heaviest",
    )
    parser.add_argument(
        "--plot-from",
        type=Path,
        metavar="RESULTS",
        help="only draw season.png (beside RESULTS) from an earlier run's results.json",
    )
    args = parser.parse_args(argv)
    args.days = sorted({int(d) for d in args.days.split(",")})
    if args.days[0] < 1 or args.base_batches < 1 or args.per_batch < 1 or args.on_top < 1:
        parser.error("days, batches and messages must be positive")
    if args.catch_up < 0:
        parser.error("--catch-up must not be negative")
    if args.days[0] * BATCHES_PER_DAY - args.on_top < args.base_batches:
        parser.error("the first day must hold the base and the batches on top")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plot_from is not None:
        drawn = plot_days(json.loads(args.plot_from.read_text()), args.plot_from.parent / PLOT)
        return 0 if drawn else 1
    args.out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="sis-bench-season-"))  # 0700
    try:
        (root / "dagster").mkdir()
        platform = InProcessPlatform(
            root / "data",
            {"SIS_BATCH_MAX_MESSAGES": str(args.per_batch)},
            dg.DagsterInstance.local_temp(str(root / "dagster")),
        )
        # One warm driver for every run, tuned as the long-lived driver it is.
        python_workers_use_this_interpreter()
        bench_worker.start_long_lived_driver(platform)
        spark = SparkSession.getActiveSession()
        assert spark is not None
        batches = args.base_batches + args.on_top * len(args.days) + args.catch_up
        needed = batches * args.per_batch
        feed = generate_feed(seed=args.seed, messages=needed)
        print(f"the base: {args.base_batches} batches in {root}", flush=True)
        calls = profile_step.time_spark_calls() if args.profile else None
        land_and_fold(platform, feed, args.base_batches * args.per_batch, calls)
        lake = platform.lake(spark)
        base = check_base(lake, args.base_batches)
        last = args.base_batches
        results: list[dict] = []
        for day in args.days:
            history = day * BATCHES_PER_DAY - args.on_top
            print(f"day {day}: copying batches {last + 1}..{history}", flush=True)
            start = time.perf_counter()
            build_history(lake, base, last, history)
            expire_landing(platform, lake, history)
            register_partitions(platform.instance, last, history)
            build_s = time.perf_counter() - start
            print(f"  history built in {build_s:.0f} s; {args.on_top} batches on top", flush=True)
            if args.fresh_driver:
                spark = restart_driver(platform)
                lake = platform.lake(spark)
            runs = land_and_fold(platform, feed, args.on_top * args.per_batch, calls)
            figures = day_figures(day, runs, table_figures(lake), build_s)
            if args.catch_up and day == args.days[-1]:
                backlog = args.catch_up * args.per_batch
                caught = catch_up(platform, feed, backlog, fresh_driver=args.fresh_driver)
                figures["catch_up"] = caught._asdict()
            last = history + args.on_top
            results.append(figures)
            print_day(figures, results[0])
            (args.out / "results.json").write_text(json.dumps(results, indent=2))
            plot_days(results, args.out / PLOT)
        print(f"results: {args.out / 'results.json'}, {args.out / PLOT}", flush=True)
        return 0
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep:
            print(f"kept {root}", flush=True)
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
