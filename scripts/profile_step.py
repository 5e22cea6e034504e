"""Where a steady-state batch's message_items, fold step and model refresh spend their time.

    python scripts/profile_step.py --messages 24000 --batches 3

Lands and classifies the simulated feed in `--batches` batches, folds and refreshes the first
(the warm-up: Spark's JIT, the tables' creation), then times every Spark action and Delta write of
each later batch's message_items (classified again), fold step and model refresh, with the line
of sis_platform that made it.
What is left of a step's time beyond its actions is driver-side Python. Timing wrappers go
round pyspark's and delta-spark's own methods, so this is a measuring tool, not platform code.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import delta.tables as dt
from bench_worker import BASE_ENV, landed_and_classified
from pyspark.sql import SparkSession
from pyspark.sql.classic.dataframe import DataFrame
from pyspark.sql.readwriter import DataFrameWriter

from sis_platform.lake.spark.fold import fold_step
from sis_platform.lake.spark.items import log_items
from sis_platform.lake.spark.model import refresh_model
from sis_platform.settings import python_workers_use_this_interpreter


class Record(NamedTuple):
    site: str  # the line of sis_platform that made the call
    method: str
    seconds: float


def _call_site() -> str:
    """The innermost line of sis_platform on the stack, past the Lake's generic helpers
    (lake/delta.py), which write every table: their caller names the table."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "sis_platform" in frame.filename and not frame.filename.endswith("lake/delta.py"):
            return f"{Path(frame.filename).name}:{frame.lineno} {(frame.line or '').strip()[:70]}"
    return "?"


_depth = threading.local()


def _named(method: str, args: tuple[Any, ...]) -> str:
    """A write's method with the table it writes (the last folder of its path): writes made
    from worker threads have no line of sis_platform on their stack to tell them apart."""
    if method == "save" and len(args) > 1 and isinstance(args[1], str):
        return f"save {Path(args[1]).name}"
    return method


def _timed(cls: type, name: str, records: list[Record]) -> None:
    """Time `cls.name`; only the outermost of nested timed calls is recorded (`first` calls
    `collect`, a merge's execute runs jobs of its own)."""
    original = getattr(cls, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_depth, "n", 0)
        site, t0 = _call_site(), time.perf_counter()
        _depth.n = depth + 1
        try:
            return original(*args, **kwargs)
        finally:
            _depth.n = depth
            if depth == 0:
                records.append(Record(site, _named(name, args), time.perf_counter() - t0))

    setattr(cls, name, wrapper)


def time_spark_calls() -> list[Record]:
    """From now on, record every Spark action and Delta write this process makes, with the line
    of sis_platform that made it, into the list returned."""
    records: list[Record] = []
    for name in ("collect", "count", "first", "localCheckpoint", "toLocalIterator", "toArrow"):
        _timed(DataFrame, name, records)
    _timed(DataFrameWriter, "save", records)
    for cls, name in (
        (dt.DeltaMergeBuilder, "execute"),
        (dt.DeltaTable, "delete"),
        (dt.DeltaTable, "restoreToVersion"),
        (dt.DeltaTable, "update"),
    ):
        _timed(cls, name, records)
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=24_000)
    parser.add_argument("--batches", type=int, default=3, help="at least 2")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.batches < 2:
        parser.error("--batches must be at least 2 (the first one is the warm-up)")

    python_workers_use_this_interpreter()
    data = Path(tempfile.mkdtemp(prefix="sis-profile-"))
    per_batch = -(-args.messages // args.batches)
    env = {**BASE_ENV, "SIS_DATA_DIR": str(data), "SIS_BATCH_MAX_MESSAGES": str(per_batch)}
    try:
        h = landed_and_classified(data, env, args.messages, args.seed)
        records = time_spark_calls()
        lake = h.lake(SparkSession.builder.getOrCreate())
        t0 = time.perf_counter()
        fold_step(lake, max_batches=1)
        refresh_model(lake)
        print(f"warm-up (batch 1 folded, model refreshed): {time.perf_counter() - t0:.1f} s")
        processing = h.resources["processing"]
        for batch in range(2, len(h.requested) + 1):
            key = h.requested[batch - 1]
            steps: list[tuple[str, Callable[[], object]]] = [
                # The same items again (same digest), so the fold step after it is unchanged.
                (
                    "message_items",
                    lambda key=key: log_items(
                        lake,
                        key,
                        limits=processing.limits(),
                        redelivery_limit=processing.redelivery_limit,
                        run_id=None,
                    ),
                ),
                ("fold step", lambda: fold_step(lake, max_batches=1)),
                ("model refresh", lambda: refresh_model(lake)),
            ]
            for what, step in steps:
                records.clear()
                t0 = time.perf_counter()
                result = step()
                total = time.perf_counter() - t0
                # Concurrent writes (the model's three tables) overlap: their sum exceeds the wall.
                print(
                    f"\n== batch {batch}, {what}: {total:.2f} s wall; actions and writes "
                    f"{sum(r.seconds for r in records):.2f} s\n   {result}"
                )
                for site, name, seconds in records:
                    print(f"   {seconds:6.2f} s  {name:16s} {site}")
    finally:
        shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
