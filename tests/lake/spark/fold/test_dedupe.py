"""Exactly once (sis_platform/lake/spark/fold/dedupe.py): the first copy of a message id in landing
order counts, whether the other copies are in the step or already folded; with the step's ids
broadcast or not."""

from __future__ import annotations

import pytest

from sis_platform.lake.spark.fold import dedupe
from sis_platform.lake.spark.fold.dedupe import duplicate_keys, tag_duplicates

pytestmark = [pytest.mark.spark, pytest.mark.cost(30)]

ITEMS = "message_id string, batch_seq long, msg_seq int, position int"
OUTCOMES = "message_id string, batch_seq long, msg_seq int, position int, master_id string"


def _keys(df) -> set[tuple[int, int]]:
    return {(r["batch_seq"], r["msg_seq"]) for r in df.collect()}


@pytest.mark.parametrize("step_messages", [3, None])
def test_later_copies_in_the_step_are_duplicates(spark, step_messages):
    items = spark.createDataFrame(
        [("a", 3, 0, 0), ("a", 3, 0, 1), ("b", 3, 1, 0), ("a", 4, 0, 0), ("a", 4, 2, 0)], ITEMS
    )
    outcomes = spark.createDataFrame([], OUTCOMES)
    assert _keys(duplicate_keys(items, outcomes, step_messages=step_messages)) == {(4, 0), (4, 2)}


@pytest.mark.parametrize("broadcast_max", [dedupe.BROADCAST_STEP_IDS_MAX, 0])
def test_a_copy_already_folded_makes_every_copy_in_the_step_a_duplicate(
    spark, monkeypatch, broadcast_max
):
    monkeypatch.setattr(dedupe, "BROADCAST_STEP_IDS_MAX", broadcast_max)
    items = spark.createDataFrame([("a", 3, 0, 0), ("a", 3, 1, 0), ("b", 3, 2, 0)], ITEMS)
    outcomes = spark.createDataFrame(
        [("a", 1, 4, 0, "M1"), ("a", 1, 4, 1, "M2"), ("c", 2, 0, None, None)], OUTCOMES
    )
    assert _keys(duplicate_keys(items, outcomes, step_messages=3)) == {(3, 0), (3, 1)}


def test_a_refolded_first_copy_stays_first_and_its_later_folded_copy_is_a_duplicate(spark):
    # A rewind refolds batch 1's copy, already in message_outcomes beside batch 2's copy.
    items = spark.createDataFrame([("a", 1, 0, 0), ("a", 2, 5, 0)], ITEMS)
    outcomes = spark.createDataFrame([("a", 1, 0, 0, "M1"), ("a", 2, 5, None, None)], OUTCOMES)
    assert _keys(duplicate_keys(items, outcomes, step_messages=None)) == {(2, 5)}


def test_tag_duplicates_marks_every_item_of_a_duplicate_message(spark):
    items = spark.createDataFrame([("a", 1, 0, 0), ("a", 1, 0, 1), ("a", 1, 1, 0)], ITEMS)
    outcomes = spark.createDataFrame([], OUTCOMES)
    tagged = tag_duplicates(items, outcomes, step_messages=2)
    rows = sorted((r["msg_seq"], r["position"], r["duplicate"]) for r in tagged.collect())
    assert rows == [(0, 0, None), (0, 1, None), (1, 0, True)]
