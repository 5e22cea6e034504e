"""The tags a batch run carries, and which batches a run is for: one definition read by the
sensors that request runs, the assets that compare a run's anchor, partition retirement, the
run-failure webhook, the CLI and the tests.

A run is for one batch (Dagster's `dagster/partition`) or, over a backlog, for a range of
consecutive batches (Dagster's partition-range tags). Either way the sensor adds the batch whose
anchor the run carries (`sis/batch`: of a range, the last) and that anchor: its chain head and
message count, so Dagster's own database keeps a copy of each anchor
(sis_platform/log/chain.py). A range's last head commits to every link before it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

# Dagster's own tags.
PARTITION_TAG = "dagster/partition"
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
# The platform's: the batch whose anchor the run carries, the first of a range, the anchor.
BATCH_TAG = "sis/batch"
FIRST_BATCH_TAG = "sis/first_batch"
CHAIN_HEAD_TAG = "sis/chain_head"
MESSAGES_TAG = "sis/messages"


class RunBatches(NamedTuple):
    """The consecutive batches a run is for, by key (`first == last`: one batch)."""

    first: str
    last: str

    def covers(self, key: str) -> bool:
        # Batch keys are fixed-width numbers (`batch_key`, sis_platform/log/landing/rows.py),
        # so their order as strings is their order as numbers.
        return len(key) == len(self.first) and self.first <= key <= self.last


def run_batches(tags: Mapping[str, str]) -> RunBatches | None:
    """The batches a run with `tags` is for, or None: a run not over batches (a job without
    partitions, the model refresh)."""
    if key := tags.get(PARTITION_TAG):
        return RunBatches(key, key)
    first, last = tags.get(RANGE_START_TAG), tags.get(RANGE_END_TAG)
    if first and last:
        return RunBatches(first, last)
    return None
