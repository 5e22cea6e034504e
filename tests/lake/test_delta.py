"""Delta writes under concurrency: bounded retry of commits that lost a race, and appends made
idempotent across their own retries, never across writes."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime

import pytest
from delta.exceptions import ConcurrentAppendException, ConcurrentDeleteReadException

from sis_platform.lake.delta import Lake, sql_in
from sis_platform.lake.tables import BATCH_LOG, MASTER_DOCUMENTS, MODEL_STEPS, SELECTIONS

pytestmark = [pytest.mark.spark, pytest.mark.cost(100)]


def _conflict(kind: type = ConcurrentAppendException) -> Exception:
    # The class delta-spark raises (captured from the JVM), not the Python base class.
    from delta.exceptions import captured

    cls = getattr(captured, kind.__name__)
    return cls(desc=f"{kind.__name__}: a concurrent transaction won", stackTrace="")


def test_conflicting_write_is_retried_until_it_commits(tmp_path, spark):
    lake = Lake(spark, str(tmp_path), conflict_backoff_seconds=0.0)
    attempts: list[int] = []

    def write() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise _conflict(ConcurrentAppendException)
        if len(attempts) == 2:
            raise _conflict(ConcurrentDeleteReadException)
        return "committed"

    assert lake.retrying_conflicts("test", write) == "committed"
    assert len(attempts) == 3


def test_conflict_retry_is_bounded_and_then_raises(tmp_path, spark):
    lake = Lake(spark, str(tmp_path), conflict_attempts=4, conflict_backoff_seconds=0.0)
    attempts: list[int] = []

    def write() -> None:
        attempts.append(1)
        raise _conflict()

    with pytest.raises(ConcurrentAppendException):
        lake.retrying_conflicts("test", write)
    assert len(attempts) == 4


def test_other_errors_are_not_retried(tmp_path, spark):
    lake = Lake(spark, str(tmp_path), conflict_backoff_seconds=0.0)
    attempts: list[int] = []

    def write() -> None:
        attempts.append(1)
        raise OSError("disk full")

    with pytest.raises(OSError):
        lake.retrying_conflicts("test", write)
    assert len(attempts) == 1


def test_concurrent_batch_log_merges_all_land(tmp_path, spark, caplog):
    # Backfill runs of different partitions merge their batch_log rows at the same time; the
    # table is not partitioned, so Delta reports conflicts, which are retried.
    lake = Lake(spark, str(tmp_path), conflict_attempts=20, conflict_backoff_seconds=0.05)
    lake.ensure(BATCH_LOG)
    now = datetime.now(UTC)
    errors: list[BaseException] = []

    def merge(seq: int) -> None:
        try:
            row = spark.createDataFrame(
                [(f"{seq:010d}", seq, 1, 1, 0, "d", now, None)], BATCH_LOG.schema()
            )
            lake.merge_rows(BATCH_LOG, row, keys=("batch_key",))
        except BaseException as error:  # reported to the test thread below
            errors.append(error)

    caplog.set_level(logging.WARNING, logger="sis_platform.lake.delta")
    threads = [threading.Thread(target=merge, args=(seq,)) for seq in range(1, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(r["batch_seq"] for r in lake.read(BATCH_LOG).collect()) == list(range(1, 7))
    # The race is real: six merges on one unpartitioned table conflict (15 of them, measured).
    assert any("Delta conflict" in r.getMessage() for r in caplog.records)


def test_append_retried_after_it_committed_is_skipped(tmp_path, spark, monkeypatch):
    # The worst case for a retry: the first attempt committed, then failed to say so.
    from pyspark.sql.readwriter import DataFrameWriter

    lake = Lake(spark, str(tmp_path), conflict_backoff_seconds=0.0)
    lake.ensure(MODEL_STEPS)
    save = DataFrameWriter.save
    calls: list[int] = []

    def save_then_fail(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        save(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            raise _conflict()

    monkeypatch.setattr(DataFrameWriter, "save", save_then_fail)
    rows = spark.createDataFrame([(1, 1, datetime.now(UTC))], MODEL_STEPS.schema())
    lake.append(MODEL_STEPS, rows, txn_app_id="test:model_steps")
    assert len(calls) == 2
    assert lake.read(MODEL_STEPS).count() == 1


def test_later_appends_with_the_same_app_id_are_never_skipped(tmp_path, spark):
    lake = Lake(spark, str(tmp_path))
    lake.ensure(MODEL_STEPS)
    rows = spark.createDataFrame([(1, 1, datetime.now(UTC))], MODEL_STEPS.schema())
    lake.append(MODEL_STEPS, rows, txn_app_id="test:model_steps")
    restore_to = lake.version(MODEL_STEPS)
    lake.append(MODEL_STEPS, rows, txn_app_id="test:model_steps")
    assert lake.read(MODEL_STEPS).count() == 2
    # As fold recovery does: restore, then write the same step again.
    lake.restore(MODEL_STEPS, restore_to)
    lake.append(MODEL_STEPS, rows, txn_app_id="test:model_steps")
    assert lake.read(MODEL_STEPS).count() == 2


def test_an_append_after_one_whose_clock_was_ahead_is_not_skipped(tmp_path, spark, monkeypatch):
    # A step run on a host whose clock was ahead (or before the clock was stepped back) must
    # not make a later step's append look like a retry of it.
    import sis_platform.lake.delta as delta_module

    lake = Lake(spark, str(tmp_path))
    lake.ensure(MODEL_STEPS)
    rows = spark.createDataFrame([(1, 1, datetime.now(UTC))], MODEL_STEPS.schema())
    ahead = delta_module.time.time_ns() + 3_600 * 10**9
    monkeypatch.setattr(delta_module.time, "time_ns", lambda: ahead)
    lake.append(MODEL_STEPS, rows, txn_app_id="test:model_steps")
    monkeypatch.setattr(delta_module.time, "time_ns", lambda: ahead - 10**9)
    lake.append(MODEL_STEPS, rows, txn_app_id="test:model_steps")
    assert lake.read(MODEL_STEPS).count() == 2


def test_appends_to_a_table_written_with_clock_keyed_versions_are_not_skipped(tmp_path, spark):
    # A lake written before appends were keyed on the log position holds wall-clock versions
    # (nanoseconds) under the same app id.
    import time

    lake = Lake(spark, str(tmp_path))
    lake.ensure(MODEL_STEPS)
    rows = spark.createDataFrame([(1, 1, datetime.now(UTC))], MODEL_STEPS.schema())
    rows.write.format("delta").mode("append").option("txnAppId", "test:model_steps").option(
        "txnVersion", time.time_ns()
    ).save(lake.path(MODEL_STEPS))
    lake.append(MODEL_STEPS, rows, txn_app_id="test:model_steps")
    assert lake.read(MODEL_STEPS).count() == 2


def _last_commit(lake: Lake, table) -> tuple[list[dict], list[dict]]:
    """(add, remove) actions of the table's newest commit, from its Delta log."""
    import json
    from pathlib import Path

    log = Path(lake.path(table)) / "_delta_log"
    newest = max(log.glob("*.json"), key=lambda p: int(p.stem))
    actions = [json.loads(line) for line in newest.read_text().splitlines()]
    adds = [a["add"] for a in actions if "add" in a]
    return adds, [a["remove"] for a in actions if "remove" in a]


def _rows_written(adds: list[dict]) -> int:
    import json

    # A file re-added with a deletion vector is the same file: no row was written for it.
    return sum(json.loads(a["stats"])["numRecords"] for a in adds if not a.get("deletionVector"))


def test_a_merge_into_master_documents_writes_only_the_changed_rows(tmp_path, spark):
    lake = Lake(spark, str(tmp_path))
    lake.ensure(MASTER_DOCUMENTS)
    rows = [(f"M{i:03d}", 1, f"<event id='M{i:03d}'/>", False, False, 1, 0) for i in range(200)]
    lake.append(
        MASTER_DOCUMENTS, spark.createDataFrame(rows, MASTER_DOCUMENTS.schema()).repartition(4)
    )
    # A few masters change, spread over the files, as in a fold step over a grown lake.
    changed = [(f"M{i:03d}", 2, "<event/>", False, False, 2, 0) for i in range(0, 200, 50)]
    lake.merge_rows(
        MASTER_DOCUMENTS,
        spark.createDataFrame(changed, MASTER_DOCUMENTS.schema()),
        keys=("master_id",),
    )

    adds, removes = _last_commit(lake, MASTER_DOCUMENTS)
    assert removes  # the files holding the changed rows: marked, not rewritten
    assert _rows_written(adds) == 4  # not the untouched rows of those files as well
    current = {r["master_id"]: r["version"] for r in lake.read(MASTER_DOCUMENTS).collect()}
    assert len(current) == 200
    assert sorted(m for m, v in current.items() if v == 2) == ["M000", "M050", "M100", "M150"]


def test_replacing_a_masters_model_rows_writes_only_its_rows(tmp_path, spark):
    lake = Lake(spark, str(tmp_path))
    lake.ensure(SELECTIONS)
    names = [f.name for f in SELECTIONS.schema().fields]

    def rows(masters: range, step: int):
        values = {"fold_step": step, "first_block": 0}
        return spark.createDataFrame(
            [
                tuple(
                    {
                        "master_id": f"M{m:03d}",
                        "market_id": "WIN",
                        "selection_id": str(s),
                        **values,
                    }.get(n)
                    for n in names
                )
                for m in masters
                for s in range(5)
            ],
            SELECTIONS.schema(),
        )

    lake.append(SELECTIONS, rows(range(100), 1).repartition(2))
    lake.replace_where(SELECTIONS, rows(range(7, 8), 2), "master_id IN ('M007')")

    adds, _ = _last_commit(lake, SELECTIONS)
    assert _rows_written(adds) == 5
    got = lake.read(SELECTIONS).collect()
    assert len(got) == 500
    assert {r["fold_step"] for r in got if r["master_id"] == "M007"} == {2}


def test_sql_in_quotes_strings_sorts_and_is_false_when_empty():
    assert sql_in("master_id", ["b", "a'x"]) == "master_id IN ('a\\'x', 'b')"
    assert sql_in("t.first_block", (3, 1)) == "t.first_block IN (1, 3)"
    assert sql_in("batch_seq", []) == "false"
