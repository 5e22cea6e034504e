"""Exactly once (sis_platform/lake/spark/fold/dedupe.py): a copy whose nearest earlier copy in
landing order is within the dedup window is a duplicate, whether the other copies are in the
step or already folded; with the step's ids broadcast or not; only the window's outcomes read."""

from __future__ import annotations

import pytest

from sis_platform.domain.dedup import DedupWindow
from sis_platform.lake.spark.fold import dedupe
from sis_platform.lake.spark.fold.dedupe import duplicate_keys, tag_duplicates

pytestmark = [pytest.mark.spark, pytest.mark.cost(30)]

ITEMS = "message_id string, batch_seq long, msg_seq int, position int"
OUTCOMES = "message_id string, batch_seq long, msg_seq int, position int, master_id string"


UNBOUNDED, DEFAULT = DedupWindow(0), DedupWindow()


def _keys(df) -> set[tuple[int, int]]:
    return {(r["batch_seq"], r["msg_seq"]) for r in df.collect()}


def _duplicates(items, outcomes, *, step_messages, window=DEFAULT, first_batch=None):
    found = duplicate_keys(
        items, outcomes, step_messages=step_messages, window=window, first_batch=first_batch
    )
    return _keys(found)


@pytest.mark.parametrize("step_messages", [3, None])
def test_later_copies_in_the_step_are_duplicates(spark, step_messages):
    items = spark.createDataFrame(
        [("a", 3, 0, 0), ("a", 3, 0, 1), ("b", 3, 1, 0), ("a", 4, 0, 0), ("a", 4, 2, 0)], ITEMS
    )
    outcomes = spark.createDataFrame([], OUTCOMES)
    for window in (UNBOUNDED, DEFAULT):
        found = _duplicates(items, outcomes, step_messages=step_messages, window=window)
        assert found == {(4, 0), (4, 2)}


@pytest.mark.parametrize("broadcast_max", [dedupe.BROADCAST_STEP_IDS_MAX, 0])
def test_a_copy_already_folded_makes_every_copy_in_the_step_a_duplicate(
    spark, monkeypatch, broadcast_max
):
    monkeypatch.setattr(dedupe, "BROADCAST_STEP_IDS_MAX", broadcast_max)
    items = spark.createDataFrame([("a", 3, 0, 0), ("a", 3, 1, 0), ("b", 3, 2, 0)], ITEMS)
    outcomes = spark.createDataFrame(
        [("a", 1, 4, 0, "M1"), ("a", 1, 4, 1, "M2"), ("c", 2, 0, None, None)], OUTCOMES
    )
    assert _duplicates(items, outcomes, step_messages=3, first_batch=3) == {(3, 0), (3, 1)}


def test_a_refolded_first_copy_stays_first_and_its_later_folded_copy_is_a_duplicate(spark):
    # A rewind refolds batch 1's copy, already in message_outcomes beside batch 2's copy.
    items = spark.createDataFrame([("a", 1, 0, 0), ("a", 2, 5, 0)], ITEMS)
    outcomes = spark.createDataFrame([("a", 1, 0, 0, "M1"), ("a", 2, 5, None, None)], OUTCOMES)
    assert _duplicates(items, outcomes, step_messages=None) == {(2, 5)}


def test_tag_duplicates_marks_every_item_of_a_duplicate_message(spark):
    items = spark.createDataFrame([("a", 1, 0, 0), ("a", 1, 0, 1), ("a", 1, 1, 0)], ITEMS)
    outcomes = spark.createDataFrame([], OUTCOMES)
    tagged = tag_duplicates(items, outcomes, step_messages=2, window=DEFAULT, first_batch=1)
    rows = sorted((r["msg_seq"], r["position"], r["duplicate"]) for r in tagged.collect())
    assert rows == [(0, 0, None), (0, 1, None), (1, 0, True)]


@pytest.mark.parametrize("first_batch", [10, None])
def test_a_copy_is_a_duplicate_only_within_the_window_of_its_nearest_earlier_copy(
    spark, first_batch
):
    # Window 3: "a" folded in batch 2, again in 6 (4 after: a first copy anew, already
    # folded); the step's copies in 10 (4 after 6: first) and 12 (2 after 10: duplicate).
    # "b" folded in batch 1 only: its copy in batch 10 is 9 after, a first copy.
    items = spark.createDataFrame([("a", 10, 0, 0), ("a", 12, 1, 0), ("b", 10, 2, 0)], ITEMS)
    outcomes = spark.createDataFrame(
        [("a", 2, 0, 0, "M1"), ("a", 6, 0, 0, "M1"), ("b", 1, 0, 0, "M2")], OUTCOMES
    )
    window = DedupWindow(3)
    found = _duplicates(items, outcomes, step_messages=3, window=window, first_batch=first_batch)
    assert found == {(12, 1)}
    # One batch nearer, "a" in batch 9 is 3 after batch 6: within the window.
    near = spark.createDataFrame([("a", 9, 0, 0)], ITEMS)
    assert _duplicates(near, outcomes, step_messages=1, window=window) == {(9, 0)}
    # Unbounded, every later copy is a duplicate (the folded one in batch 6 among them: only
    # the step's items are tagged, tag_duplicates joins them).
    assert _duplicates(items, outcomes, step_messages=3, window=UNBOUNDED) == {
        (6, 0),
        (10, 0),
        (12, 1),
        (10, 2),
    }


def test_the_window_reads_only_the_outcomes_of_its_batches(spark, tmp_path):
    # Two files of message_outcomes, batches 1-2 and 20-21: a step at batch 25 with a window
    # of 10 reads the second only (Delta skips the first by its batch_seq statistics).
    path = str(tmp_path / "outcomes")
    for rows in ([("a", 1, 0, 0, "M1"), ("b", 2, 0, 0, "M1")], [("c", 20, 0, 0, "M1")]):
        spark.createDataFrame(rows, OUTCOMES).coalesce(1).write.format("delta").mode("append").save(
            path
        )
    outcomes = spark.read.format("delta").load(path)
    items = spark.createDataFrame([("a", 25, 0, 0), ("c", 25, 1, 0)], ITEMS)
    found = duplicate_keys(items, outcomes, step_messages=2, window=DedupWindow(10), first_batch=25)
    assert _keys(found) == {(25, 1)}
    read = found.inputFiles()
    assert len(read) == 1 and len(outcomes.inputFiles()) == 2
