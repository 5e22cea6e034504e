"""The fold's ledger (sis_platform/lake/spark/fold/ledger.py): the commit point in fold_steps, what
it records, and recovery from a step interrupted before it."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from sis_platform.lake.spark.fold.ledger import (
    STEP_TABLES,
    CommittedStep,
    FoldedBatch,
    FoldStepResult,
    commit_step,
    committed_step,
    fold_step_rows,
    folded_batches,
    recover,
)
from sis_platform.lake.tables import (
    BATCH_LOG,
    FOLD_STEPS,
    MASTER_DOCUMENTS,
    MASTER_VERSIONS,
    MESSAGE_ITEMS,
)
from tests.lake.spark.fold.lakes import new_lake

pytestmark = [pytest.mark.spark, pytest.mark.cost(30)]

NOW = datetime(2026, 11, 21, 12, tzinfo=UTC)


def _commit(lake, step: int, first: int, last: int, digests: dict[int, str]) -> None:
    result = FoldStepResult(fold_step=step, first_batch_seq=first, last_batch_seq=last, applied=1)
    commit_step(
        lake,
        result,
        first_batch_seq=first,
        digests=digests,
        items_version=7,
        log_version=5,
        run_id="r",
        committed_at=NOW,
        master_blocks=(),
    )


def test_before_the_first_step_every_table_is_at_version_zero(spark, tmp_path):
    lake = new_lake(spark, tmp_path)
    committed, current = recover(lake)
    assert committed == CommittedStep(0, 0, 0, {t.name: 0 for t in STEP_TABLES})
    assert current == {t.name: 0 for t in STEP_TABLES}


def test_a_commit_records_the_versions_and_digests_a_later_step_reads_back(spark, tmp_path):
    lake = new_lake(spark, tmp_path)
    recover(lake)
    _commit(lake, 2, 1, 2, {2: "d2", 1: "d1"})
    _commit(lake, 3, 3, 3, {3: "d3"})
    rows = fold_step_rows(lake)
    committed = committed_step(lake)
    assert (committed.fold_step, committed.last_batch_seq, committed.log_version) == (3, 3, 5)
    assert committed.table_versions == {
        **{t.name: 0 for t in STEP_TABLES},
        MESSAGE_ITEMS.name: 7,
        BATCH_LOG.name: 5,
    }
    assert folded_batches(rows) == {
        1: FoldedBatch("d1", 7),
        2: FoldedBatch("d2", 7),
        3: FoldedBatch("d3", 7),
    }
    [row] = lake.read(FOLD_STEPS).where("fold_step = 2").collect()
    assert json.loads(row["items_digest"]) == {"1": "d1", "2": "d2"}
    assert (row["applied"], row["run_id"]) == (1, "r")


def test_recover_undoes_the_writes_of_a_step_that_never_committed(spark, tmp_path):
    lake = new_lake(spark, tmp_path)
    recover(lake)
    documents = lake.spark.createDataFrame(
        [("M1", 1, "<event/>", False, False, 1, 0)], MASTER_DOCUMENTS.schema()
    )
    lake.append(MASTER_DOCUMENTS, documents)
    assert lake.version(MASTER_DOCUMENTS) == 1
    committed, current = recover(lake)
    assert committed.fold_step == 0
    assert lake.read(MASTER_DOCUMENTS).count() == 0
    assert current[MASTER_DOCUMENTS.name] == lake.version(MASTER_DOCUMENTS)
    assert current[MASTER_VERSIONS.name] == 0


def test_folded_batches_keeps_each_batchs_last_fold_and_the_items_version_it_read(spark, tmp_path):
    rows = [
        {
            "fold_step": 2,
            "first_batch_seq": 1,
            "last_batch_seq": 2,
            "items_digest": '{"1": "d1", "2": "d2"}',
            "table_versions": "{}",
        },
        {
            "fold_step": 3,
            "first_batch_seq": 3,
            "last_batch_seq": 3,
            "items_digest": '{"1": "e1", "3": "d3"}',
            "table_versions": json.dumps({MESSAGE_ITEMS.name: 4}),
        },
    ]
    assert folded_batches(rows) == {
        1: FoldedBatch("e1", 4),
        2: FoldedBatch("d2", None),
        3: FoldedBatch("d3", 4),
    }
