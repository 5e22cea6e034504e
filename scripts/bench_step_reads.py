"""What a fold step reads of its own history costs as the season goes on, the way it plans
now (`plan_step` after `committed_step`: the last step's row, batch_log's changes since the
version that step planned from, the batches after the last folded one) beside the whole reads it
falls back to when a batch already folded changed or the change feed cannot be read (all of
batch_log through `read_batch_log`, all of fold_steps through `fold_step_rows` and
`folded_batches`), one row per batch and per step, 720 a day at the default two-minute batches.

    python scripts/bench_step_reads.py [--days 1,30,90,365] [--repeat 3]

Both tables are filled with rows of their real schemas and sizes (a 64-hex digest per batch, a
step's JSON of table versions and digests), appended in a few large commits: the file count of
tables the upkeep keeps compacted, so what is measured is the read and the driver's work per
row, not a file listing. Before each day's figures one new batch is logged the way
message_items logs it (a MERGE), so the plan has a step's worth of change to read. Prints, per
simulated day, the median seconds of each read over `--repeat` tries. Writes only under a
temporary folder; starts one local Spark driver.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from pyspark.sql import functions as F

from sis_platform.cli.platform import spark_session
from sis_platform.lake.delta import Lake
from sis_platform.lake.spark.fold.ledger import committed_step, fold_step_rows, folded_batches
from sis_platform.lake.spark.fold.plan import plan_step, read_batch_log
from sis_platform.lake.tables import BATCH_LOG, FOLD_STEPS, MESSAGE_ITEMS
from sis_platform.resources import config

BATCHES_PER_DAY = 720


def _fill(lake: Lake, start: int, end: int) -> None:
    """batch_log and fold_steps rows for batches (and steps) `start`..`end - 1`."""
    ids = lake.spark.range(start, end)
    digest = F.sha2(F.col("id").cast("string"), 256)
    batch_log = ids.select(
        F.lpad(F.col("id").cast("string"), 10, "0").alias("batch_key"),
        F.col("id").alias("batch_seq"),
        F.lit(50).cast("bigint").alias("messages"),
        F.lit(120).cast("bigint").alias("items"),
        F.lit(0).cast("bigint").alias("invalid"),
        digest.alias("items_digest"),
        F.current_timestamp().alias("processed_at"),
        F.lit("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0").alias("run_id"),
    )
    # Every step planned from the batch_log version just appended: the last one's is what the
    # next step reads the changes after.
    log_version = lake.version(BATCH_LOG) + 1
    versions = F.format_string(
        '{"batch_log": %d, "dead_letters": %d, "master_documents": %d, "master_versions": %d, '
        '"message_items": %d, "message_outcomes": %d}',
        F.lit(log_version),
        *(F.col("id") for _ in range(5)),
    )
    fold_steps = ids.select(
        F.col("id").alias("fold_step"),
        F.col("id").alias("first_batch_seq"),
        F.col("id").alias("last_batch_seq"),
        F.format_string('{"%d": "%s"}', F.col("id"), digest).alias("items_digest"),
        F.col("id").alias("master_documents_version"),
        versions.alias("table_versions"),
        *(F.lit(50).cast("bigint").alias(c) for c in ("messages", "applied")),
        *(F.lit(0).cast("bigint").alias(c) for c in ("duplicates", "filtered", "dead_lettered")),
        F.lit(40).cast("bigint").alias("masters_changed"),
        F.lit("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0").alias("run_id"),
        F.current_timestamp().alias("committed_at"),
    )
    lake.append(BATCH_LOG, batch_log)
    lake.append(FOLD_STEPS, fold_steps.select(*FOLD_STEPS.schema().fieldNames()))


def _log_new_batch(lake: Lake, seq: int) -> None:
    """Batch `seq` logged after the last step, as message_items logs a batch (a MERGE)."""
    row = BATCH_LOG.row(
        batch_key=f"{seq:010d}",
        batch_seq=seq,
        messages=50,
        items=120,
        invalid=0,
        items_digest=f"{seq:064x}",
        processed_at=datetime.now(UTC),
        run_id=None,
    )
    rows = lake.spark.createDataFrame([row], BATCH_LOG.schema())
    lake.merge_rows(BATCH_LOG, rows, keys=("batch_key",))


def _plan(lake: Lake, new_batch: int) -> None:
    """A fold step's planning, checked to find just the new batch to fold."""
    step = plan_step(lake, committed_step(lake))
    assert step.keys == [f"{new_batch:010d}"] and not step.changed, step


def _median(read: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        read()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", default="1,30,90,365")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    days = sorted(int(d) for d in args.days.split(","))
    with tempfile.TemporaryDirectory() as folder:
        resources = config.resources({"SIS_DATA_DIR": str(Path(folder))})
        lake = resources["lake"].lake(spark_session(resources["spark"]))
        lake.ensure(BATCH_LOG, FOLD_STEPS, MESSAGE_ITEMS)
        filled = 1
        print(
            f"{'day':>5} {'rows':>9} {'plan s':>7} {'whole batch_log s':>18}"
            f" {'whole fold_steps s':>19}"
        )
        for day in days:
            rows = day * BATCHES_PER_DAY
            # Batches and steps up to `rows`, then batch rows + 1 logged, not yet folded.
            _fill(lake, filled, rows + 1)
            _log_new_batch(lake, rows + 1)
            filled = rows + 2

            plan_s = _median(partial(_plan, lake, rows + 1), args.repeat)
            log_s = _median(lambda: read_batch_log(lake, lake.version(BATCH_LOG)), args.repeat)
            steps_s = _median(lambda: folded_batches(fold_step_rows(lake)), args.repeat)
            print(f"{day:>5} {rows:>9} {plan_s:>7.2f} {log_s:>18.2f} {steps_s:>19.2f}")


if __name__ == "__main__":
    main()
