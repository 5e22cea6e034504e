"""Which batches a run is for, from its tags: one batch, a range, or none."""

from sis_platform.assets.run_tags import (
    PARTITION_TAG,
    RANGE_END_TAG,
    RANGE_START_TAG,
    RunBatches,
    run_batches,
)
from sis_platform.log.landing import batch_key


def test_a_partition_run_is_for_its_one_batch() -> None:
    batches = run_batches({PARTITION_TAG: batch_key(7)})
    assert batches == RunBatches(batch_key(7), batch_key(7))
    assert batches.covers(batch_key(7))
    assert not batches.covers(batch_key(6)) and not batches.covers(batch_key(8))


def test_a_range_run_covers_its_first_to_its_last_batch() -> None:
    batches = run_batches({RANGE_START_TAG: batch_key(9), RANGE_END_TAG: batch_key(12)})
    assert batches == RunBatches(batch_key(9), batch_key(12))
    assert [s for s in range(5, 16) if batches.covers(batch_key(s))] == [9, 10, 11, 12]
    # Ordered as numbers, not as strings of different widths.
    assert not batches.covers("10")


def test_a_run_without_batch_tags_is_for_none() -> None:
    assert run_batches({}) is None
    assert run_batches({RANGE_START_TAG: batch_key(1)}) is None
