"""Which batches a fold step folds (sis_platform/lake/spark/fold/plan.py): the gap-free run after
the last committed step, the missing batch that blocks the rest, and folded batches whose items
changed since."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sis_platform.domain.limits import DEFAULT_LIMITS
from sis_platform.lake.spark.fold import plan as plan_module
from sis_platform.lake.spark.fold.ledger import (
    CommittedStep,
    FoldedBatch,
    FoldStepResult,
    commit_step,
    committed_step,
    recover,
)
from sis_platform.lake.spark.fold.plan import LoggedBatch, LoggedBatches, plan_step
from sis_platform.lake.tables import BATCH_LOG
from tests.domain.sportsdata_fixtures import ASCOT_1430, ASCOT_1500, GO_SOFT, event, master, update
from tests.lake.spark.fold.lakes import NOW, log_batch, message, new_lake


def _logged(*seqs: int) -> LoggedBatches:
    return LoggedBatches.of([LoggedBatch(s, f"{s:010d}", f"d{s}", 10) for s in seqs])


def test_the_run_stops_at_the_first_missing_batch():
    assert _logged(1, 2, 3).gap_free_after(0) == (
        [(1, "0000000001"), (2, "0000000002"), (3, "0000000003")],
        None,
    )
    assert _logged(1, 2, 4, 5).gap_free_after(0) == ([(1, "0000000001"), (2, "0000000002")], 3)
    assert _logged(1, 2).gap_free_after(2) == ([], None)
    assert _logged(1, 2, 5).gap_free_after(2) == ([], 3)


def test_a_batch_changed_when_its_digest_differs_from_the_one_folded():
    folded = {1: FoldedBatch("d1", 3), 2: FoldedBatch("old", 3), 3: FoldedBatch("old", 3)}
    # Batch 3 was folded by a step that did not commit: it is past the last folded batch.
    assert _logged(1, 2, 3).changed_since(folded, 2) == [2]


@pytest.mark.spark
@pytest.mark.cost(30)
def test_plan_step_reads_the_batch_log(spark, tmp_path):
    lake = new_lake(spark, tmp_path)
    for seq in (1, 2, 4):
        log_batch(lake, seq, [message(master(event(ASCOT_1430)))])
    committed = CommittedStep(0, 0, 0, {})
    plan = plan_step(lake, committed)
    assert (plan.step, plan.first, plan.last, plan.waiting_for) == (2, 1, 2, 3)
    assert plan.keys == ["0000000001", "0000000002"] and plan.changed == []
    assert plan.run_messages() == 2
    one = plan_step(lake, committed, max_batches=1)
    assert (one.step, one.keys) == (1, ["0000000001"])
    assert set(plan.digests()) == {1, 2}


def _log_batch_one_under_a_bound(lake) -> list:
    """Batch 1 classified under a bound that dead-letters its message (a fix, logging it again
    under the default limits, changes its items); its messages."""
    first = [message(master(event(ASCOT_1430), event(ASCOT_1500)))]
    log_batch(lake, 1, first, limits=replace(DEFAULT_LIMITS, max_ids=1))
    return first


def _fold_through(lake, last: int) -> CommittedStep:
    """A committed step over batches 1..`last`, as fold_step commits it, without folding."""
    committed, _ = recover(lake)
    plan = plan_step(lake, committed)
    assert plan.last == last
    commit_step(
        lake,
        FoldStepResult(fold_step=plan.step, first_batch_seq=plan.first, last_batch_seq=last),
        first_batch_seq=plan.first or last,
        digests=plan.digests(),
        items_version=plan.items_version,
        log_version=plan.log_version,
        run_id=None,
        committed_at=NOW,
        master_blocks=(),
    )
    return committed_step(lake)


@pytest.mark.spark
@pytest.mark.cost(40)
def test_a_step_plans_from_the_change_feed_without_reading_the_whole_history(
    spark, tmp_path, monkeypatch
):
    lake = new_lake(spark, tmp_path)
    first = _log_batch_one_under_a_bound(lake)
    second = [message(update(ASCOT_1430, GO_SOFT))]
    log_batch(lake, 2, second)
    committed = _fold_through(lake, 2)
    # New batches only, and a folded batch re-logged with the same items: nothing folded has
    # changed, and neither fold_steps nor batch_log is read whole to know it.
    log_batch(lake, 3, [message(update(ASCOT_1500, GO_SOFT))])
    log_batch(lake, 2, second)
    reads = _spy_reads(monkeypatch)
    plan = plan_step(lake, committed)
    assert (plan.keys, plan.changed) == (["0000000003"], [])
    assert reads == {"fold_steps": 0, "batch_log_after": [2]}
    # A fix: batch 1 classified again with different items. Only now are fold_steps read.
    log_batch(lake, 1, first)
    reads = _spy_reads(monkeypatch)
    plan = plan_step(lake, committed)
    assert (plan.keys, plan.changed, plan.changed_keys) == (["0000000003"], [1], ["0000000001"])
    assert reads == {"fold_steps": 1, "batch_log_after": [2]}


@pytest.mark.spark
@pytest.mark.cost(40)
def test_without_the_change_feed_a_step_reads_the_whole_log_and_finds_the_same(
    spark, tmp_path, monkeypatch
):
    lake = new_lake(spark, tmp_path)
    first = _log_batch_one_under_a_bound(lake)
    # A lake whose batch_log was created before the table had its change feed.
    lake.spark.sql(
        f"ALTER TABLE {lake.sql_table(BATCH_LOG)}"
        " SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'false')"
    )
    committed = _fold_through(lake, 1)
    log_batch(lake, 1, first)
    log_batch(lake, 2, [message(update(ASCOT_1430, GO_SOFT))])
    reads = _spy_reads(monkeypatch)
    plan = plan_step(lake, committed)
    assert (plan.keys, plan.changed) == (["0000000002"], [1])
    assert reads == {"fold_steps": 1, "batch_log_after": [None]}
    # A step recorded a batch_log version this log has not reached (a volume restored from an
    # older snapshot): the whole log again, never the feed of versions that are not there.
    ahead = replace(committed, table_versions={**committed.table_versions, BATCH_LOG.name: 99})
    reads = _spy_reads(monkeypatch)
    assert plan_step(lake, ahead).changed == [1]
    assert reads["batch_log_after"] == [None]


def _spy_reads(monkeypatch) -> dict:
    """Counts whole reads of fold_steps, and records each batch_log read's `after` (None: the
    whole log) during a plan_step."""
    reads: dict = {"fold_steps": 0, "batch_log_after": []}
    real_rows, real_log = plan_module.fold_step_rows, plan_module.read_batch_log

    def rows(lake):
        reads["fold_steps"] += 1
        return real_rows(lake)

    def log(lake, version, *, after=None, also=()):
        reads["batch_log_after"].append(after)
        return real_log(lake, version, after=after, also=also)

    monkeypatch.setattr(plan_module, "fold_step_rows", rows)
    monkeypatch.setattr(plan_module, "read_batch_log", log)
    return reads
