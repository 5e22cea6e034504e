"""Which batches a fold step folds (sis_platform/lake/spark/fold/plan.py): the gap-free run after
the last committed step, the missing batch that blocks the rest, and folded batches whose items
changed since."""

from __future__ import annotations

import pytest

from sis_platform.lake.spark.fold.ledger import CommittedStep, FoldedBatch
from sis_platform.lake.spark.fold.plan import LoggedBatch, LoggedBatches, plan_step
from tests.domain.sportsdata_fixtures import ASCOT_1430, event, master
from tests.lake.spark.fold.lakes import log_batch, message, new_lake


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
    plan = plan_step(lake, committed, [], max_batches=None)
    assert (plan.step, plan.first, plan.last, plan.waiting_for) == (2, 1, 2, 3)
    assert plan.keys == ["0000000001", "0000000002"] and plan.changed == []
    assert plan.run_messages() == 2
    one = plan_step(lake, committed, [], max_batches=1)
    assert (one.step, one.keys) == (1, ["0000000001"])
    assert set(plan.digests()) == {1, 2}
