"""Crash points: a test hook that SIGKILLs the process at a named step boundary.

The fault-injection suite (tests/faults) proves the exactly-once guarantees (DESIGN.md
invariants 1-4) by killing the consuming or materializing process with SIGKILL (no exception,
no `finally`, no backout) at every step boundary, then restarting and catching up. Production
never sets `SIS_CRASH_AT`, and then every hook here is a dictionary lookup in the environment
(`settings.fault_injection`) and nothing else: no Dagster or Spark import, no change to any
query plan.

`SIS_CRASH_AT` is a comma-separated list of point names from `CRASH_POINTS`, each optionally
with `@n`: kill the n-th time this process reaches the point (default: the first time). It is
read when a point is reached, not at import, so a test sets it per subprocess.

Three kinds of point:
- `crash_point(name)`: the process kills itself right there (between two steps).
- `kill_during_write(df, name)`: for a DataFrame about to be written to a Delta table, wraps it
  in an identity `mapInPandas` whose Python worker, after handing its rows to the writer, kills
  the driver and its JVM. For an append or replaceWhere the task is writing its data file when
  the process dies, so the table directory holds a file no commit references; for a merge (the
  source passed in) the merge dies while reading its source. Either way the operation is under
  way and never reaches its Delta commit.
- `kill_in_worker(fn, name)`: the same, from inside the fold's Python function (its
  `mapInArrow`), after the function has folded the partition it is given.
A worker kills the JVM as well as the Python driver: the JVM would otherwise notice the driver's
death only on its next read of the gateway pipe, and might commit the write meanwhile (a
container or host dying takes both at once, which is what this models).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from sis_platform.settings import fault_injection

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql import DataFrame

ENV = "SIS_CRASH_AT"

CONSUMER_POINTS = (
    "consume.after_get",  # messages got under syncpoint, nothing landed
    "landing.before_claim",  # batch written and fsync'd to a partial file, not claimed
    "consume.after_land",  # batch landed, queue not committed
    "sensor.after_commit",  # queue committed, partition not registered, cursor not moved
)
MATERIALIZER_POINTS = (
    "write.raw_messages",
    "write.message_items",
    "write.batch_log",
    "fold.mid_fold",  # inside the fold's mapInArrow
    "write.master_versions",
    "fold.after_versions",  # master_versions appended; outcomes, documents, commit not
    "write.dead_letters",
    "write.message_outcomes",
    "write.master_documents",
    "fold.after_documents",  # master_documents merged, the step's fold_steps row not written
    "write.fold_steps",
    "write.events",
    "write.markets",
    "write.selections",
    "write.model_steps",
)
# A fold step that rewinds (already-folded input changed): its deletes, then before its appends.
REWIND_POINTS = (
    "write.rewind",  # the first of the rewind's merge-deletes, mid-write
    "fold.after_rewind",  # the rewound masters' later rows deleted, the refold not yet written
)
# sis-live (sis_platform/live/service.py): one group's boundaries.
LIVE_POINTS = (
    "live.after_get",  # a group got under syncpoint, nothing landed
    "live.after_land",  # the group landed as a part of the open batch, not in the store
    "live.store_commit",  # inside the store's transaction: written, not committed
    "live.before_queue_commit",  # the group in the store, the queue not committed
    "live.after_queue_commit",  # the group in the store and off the queue
)
# Reached only with SIS_PRIORITY: a stretch's priority part committed, the rest not.
LIVE_BETWEEN_PARTS = "live.between_parts"
PRIORITY_POINTS = (LIVE_BETWEEN_PARTS,)
# The serving store's history pruned (ServingWriter.prune, in sis-live's idle turns).
PRUNE_POINTS = (
    "serving.prune",  # inside the prune's transaction: rows deleted, not committed
    "serving.after_prune",  # the prune committed, its space not yet reclaimed
)
# Merging a sealed batch's parts into one file (sis_platform/log/landing/merge.py).
MERGE_POINTS = (
    "merge.before_claim",  # the merged file written, fsync'd and verified, not claimed
    "merge.after_claim",  # the merged file claimed, the parts folder still whole
    "merge.mid_removal",  # the parts folder's first file removed, the rest not
)
# Expiring old landed batches (sis_platform/log/landing/expiry.py).
EXPIRE_POINTS = (
    "expire.after_record",  # the expiry record moved forward, no batch under it removed yet
    "expire.mid_removal",  # batch 1 removed, the next one's file removed, not its anchor
)
# Dagster's own records retired: `batches` partitions (sensors/partition_retirement.py) and
# finished runs (sensors/run_retention.py).
RETENTION_POINTS = (
    "retention.partition_retired",  # a key of the chunk deleted; the rest and the cursor not
    "retention.run_events_deleted",  # a run's event log deleted, its run record not
)
# The fold's progress recorded in the serving store (assets/masters.py, live intake): the step
# committed to the lake, its record not written.
LAKE_PROGRESS_POINTS = ("fold.before_lake_progress",)
# Delta upkeep inside a fold step and a model refresh (sis_platform/lake/upkeep.py), before their
# commit points.
UPKEEP_POINTS = (
    "fold.mid_optimize",  # the first of the fold's tables compacted, the others not
    "fold.after_optimize",  # the fold's tables compacted, not vacuumed, the step not committed
    "fold.after_vacuum",  # the fold's tables vacuumed, the step's fold_steps row not written
    "model.after_optimize",  # the model's tables written and compacted, model_steps not
    "model.after_vacuum",  # ... and vacuumed
)
# A batch run's compaction of the block of batches its write settled (lake/upkeep.py
# `compact_blocks`): the block compacted, the table not vacuumed.
BLOCK_POINTS = ("raw_messages.after_compact", "message_items.after_compact")
CRASH_POINTS = (
    CONSUMER_POINTS
    + MATERIALIZER_POINTS
    + LAKE_PROGRESS_POINTS
    + UPKEEP_POINTS
    + BLOCK_POINTS
    + REWIND_POINTS
    + LIVE_POINTS
    + PRIORITY_POINTS
    + PRUNE_POINTS
    + MERGE_POINTS
    + EXPIRE_POINTS
    + RETENTION_POINTS
)

_reached: dict[str, int] = {}


def _wanted(name: str) -> int | None:
    """Which arrival at `name` kills (1-based), or None if `SIS_CRASH_AT` does not name it.
    A hook may pass a name not (yet) declared, e.g. `write.<a new table>`: it is never armed,
    since only declared names are accepted in `SIS_CRASH_AT`."""
    spec = fault_injection(ENV)
    if not spec:
        return None
    for entry in spec.split(","):
        point, _, nth = entry.strip().partition("@")
        if point not in CRASH_POINTS:
            # A typo would make a fault test pass without crashing anywhere.
            raise ValueError(f"{ENV} names an unknown crash point {point!r}")
        if point == name:
            return int(nth) if nth else 1
    return None


def armed(name: str) -> bool:
    """Whether this arrival at `name` is the one `SIS_CRASH_AT` asks to kill (counts arrivals)."""
    nth = _wanted(name)
    if nth is None:
        return False
    _reached[name] = _reached.get(name, 0) + 1
    return _reached[name] == nth


def crash_point(name: str) -> None:
    """SIGKILL this process here if `SIS_CRASH_AT` names this arrival at `name`."""
    if armed(name):
        os.kill(os.getpid(), signal.SIGKILL)


def kill_during_write(df: DataFrame, name: str) -> DataFrame:
    """`df` unchanged, or (when armed) `df` behind an identity step that kills the driver and
    its JVM from a Python worker once its task has produced its rows."""
    if not armed(name):
        return df
    victims = _driver_and_jvm()
    return df.mapInPandas(partial(_pass_then_kill, victims=victims), schema=df.schema)


def kill_in_worker(
    fn: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]], name: str
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A `mapInArrow` function `fn` unchanged, or (when armed) `fn` followed by killing the
    driver and its JVM once `fn` has yielded its output."""
    if not armed(name):
        return fn
    return partial(_run_then_kill, fn=fn, victims=_driver_and_jvm())


def _pass_then_kill(
    frames: Iterator[pd.DataFrame], *, victims: tuple[int, ...]
) -> Iterator[pd.DataFrame]:
    yield from frames
    _kill(victims)


def _run_then_kill(
    batches: Iterator[pa.RecordBatch],
    *,
    fn: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    victims: tuple[int, ...],
) -> Iterator[pa.RecordBatch]:
    yield from fn(batches)
    _kill(victims)


def _kill(victims: tuple[int, ...]) -> NoReturn:
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # Never return to Spark: a finished task could still let a surviving driver commit. The
    # PySpark daemon SIGHUPs its workers once the JVM is gone; the bound is a backstop.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.1)
    os._exit(1)


FOLD_FAILURE_ENV = "SIS_INJECT_FOLD_FAILURE"
CLASSIFY_FAILURE_ENV = "SIS_INJECT_CLASSIFY_FAILURE"
FAILURE_KINDS = ("raise", "crash", "hang")
# How long an injected hang lasts if nothing kills it: far beyond any budget a test sets, and
# bounded, so a watchdog that fails to fire fails its test instead of hanging the suite.
HANG_SECONDS = 60.0


@dataclass(frozen=True)
class InjectedFailure:
    target: str  # the master id or message id whose processing fails
    how: str  # one of FAILURE_KINDS


def injected_fold_failure() -> InjectedFailure | None:
    """`SIS_INJECT_FOLD_FAILURE=ID[:raise|crash|hang]`: the fold of the master with that id, or
    of the items of the message with that id, fails as a bug raising would, as a dying Python
    worker would, or hangs in an item as C code would (the quarantine tests). Read on the
    driver at call time and handed to the workers with the fold function."""
    return _injected(FOLD_FAILURE_ENV)


def injected_classify_failure() -> InjectedFailure | None:
    """`SIS_INJECT_CLASSIFY_FAILURE=MESSAGE_ID[:raise|crash|hang]`: classifying that message in
    message_items fails the same ways."""
    return _injected(CLASSIFY_FAILURE_ENV)


def _injected(variable: str) -> InjectedFailure | None:
    text = fault_injection(variable)
    if not text:
        return None
    # A message id may hold colons (IBM MQ's are "ID:..."): the kind is the text after the
    # last one, when it names a kind.
    target, _, how = text.rpartition(":")
    if how not in FAILURE_KINDS:
        return InjectedFailure(text, "raise")
    return InjectedFailure(target, how)


def fail_as_injected(how: str, quoting: object = None) -> NoReturn:
    """Inside a Python worker: fail the way `injected_fold_failure` asked. A raised error quotes
    `quoting` (content it failed on), as an lxml error quotes the document. A hang sleeps with
    the usual termination signals blocked, as C code would not return to the interpreter to
    run a handler; only SIGKILL (the item watchdog) ends it."""
    if how == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "hang":
        signal.pthread_sigmask(
            signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM}
        )
        deadline = time.monotonic() + HANG_SECONDS
        while time.monotonic() < deadline:
            time.sleep(0.05)
        raise TimeoutError(f"injected hang outlived {HANG_SECONDS} s: no watchdog fired")
    quoted = quoting.decode("utf-8", "replace") if isinstance(quoting, bytes) else quoting
    raise ZeroDivisionError(f"injected failure on {quoted}")


def _driver_and_jvm() -> tuple[int, ...]:
    """This (driver) process and its local Spark JVM: the `java` child PySpark launched.
    Linux /proc only, which is where the suite runs."""
    me = os.getpid()
    jvms = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        # /proc/<pid>/stat: "pid (comm) state ppid ...", comm may hold spaces.
        comm = text[text.index("(") + 1 : text.rindex(")")]
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        if ppid == me and comm == "java":
            jvms.append(int(stat.parent.name))
    return (*jvms, me)
